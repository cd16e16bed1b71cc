"""The job page's contribution and usage section (``{% job_contribution job %}``) and its selector."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from accounting.selectors.contribution import job_contribution
from accounting.services.contribution import contribution_score_job
from accounting.services.usage import usage_record_job
from tests.accounting.job_world import finish, post, running_job, utilities_event
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

TABLE = {"": 0.5, "0": 0.7, "1": 0.6, "0,1": 0.9}  # φ0 = 0.25, φ1 = 0.15 (by hand)


@pytest.fixture
def scored_job():
    job = running_job(2)
    site = {
        "ok": True,
        "train_examples": 40,
        "eval_examples": 10,
        "cpu_seconds": 0.5,
        "wall_seconds": 1.25,
        "bytes_received": 3 * 1024 * 1024,
        "bytes_sent": 2048,
    }
    post(job, "round", round=1, sites={"s0": site, "s1": site})
    post(job, "contribution", **utilities_event(["s0", "s1"], {"0": TABLE}))
    job = finish(job)
    usage_record_job(job=job)
    contribution_score_job(job=job)
    return job


def _page(client, job) -> str:
    client.force_login(job.submitted_by)
    response = client.get(reverse("federation:job_detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_job_page_shows_shares_chart_table_and_usage(client, scored_job):
    html = _page(client, scored_job)

    data = json.loads(re.search(r'id="contribution-data"[^>]*>(.*?)</script>', html).group(1))
    assert data["labels"] == ["Site 0", "Site 1"]
    assert data["shares"] == [0.625, 0.375]  # 0.25 / 0.4 and 0.15 / 0.4
    assert data["method"] == "Exact Shapley"
    assert "0.2500" in html and "0.1500" in html and "62.5 %" in html
    assert "utility, median site accuracy 0.500 → 0.900" in html
    assert "3.0 MiB" in html and "2.0 KiB" in html and "1.25 s" in html  # usage with units
    assert "Flower, whole run" not in html  # the fake SuperLink reported no run figures


def test_job_page_before_accounting_says_so(client):
    job = running_job(2)

    html = _page(client, job)

    assert "Contribution is measured after the last round." in html
    assert "Usage is recorded when the job ends." in html
    assert "contribution-chart" not in html


def test_job_page_hidden_updates_says_data_volume_only(client):
    job = running_job(2)
    post(
        job,
        "round",
        round=1,
        sites={"s0": {"ok": True, "train_examples": 30}, "s1": {"ok": True, "train_examples": 10}},
    )
    job = finish(job)
    job.final_metrics = {**job.final_metrics, "updates_hidden": True}
    job.save()
    contribution_score_job(job=job)

    html = _page(client, job)

    assert "hidden by secure aggregation" in html
    assert "30 examples" in html and "75.0 %" in html


def test_selector_hides_everything_from_a_user_who_may_not_view_the_job(scored_job):
    outsider = UserFactory()

    assert job_contribution(user=outsider, job=scored_job).visible is False
    seen = job_contribution(user=scored_job.submitted_by, job=scored_job)
    assert seen.visible and [r.site.slug for r in seen.rows] == ["s0", "s1"]
    assert [r.loo_raw for r in seen.rows] == pytest.approx([0.3, 0.2])
    assert seen.usage_totals["bytes_received"] == 6 * 1024 * 1024


def test_selector_queries_do_not_grow_with_sites(django_assert_num_queries, scored_job):
    user = scored_job.submitted_by
    # permission check, scores with sites, usage with sites, the user's stewardships (finding 5)
    with django_assert_num_queries(4):
        seen = job_contribution(user=user, job=scored_job)
        assert [r.site.name for r in seen.rows] + [u.site.name for u in seen.usage]


def test_job_page_of_a_trees_job_names_data_volume_and_why(client):
    job = running_job(2)
    job.model = "xgboost"
    job.save(update_fields=["model"])
    post(
        job,
        "round",
        round=1,
        sites={"s0": {"ok": True, "train_examples": 30}, "s1": {"ok": True, "train_examples": 10}},
    )
    job = finish(job)
    contribution_score_job(job=job)

    html = _page(client, job)

    assert "Contribution method: <strong>data volume</strong>" in html
    assert "bagged across sites (FedXgbBagging)" in html and "ADR 0023" in html
    assert "hidden by secure aggregation" not in html
    assert "30 examples" in html and "75.0 %" in html


def test_data_volume_examples_are_disclosure_controlled_on_the_page_and_in_the_ledger(client):
    """Issue 9, finding 5 (hostile re-test): a data-volume raw value is a site's training
    examples (rounds × rows). The page showed it exact to every project member ("3 examples" of
    a site whose dataset page says "≤7 rows") and its ledger leaf to every institution."""
    from portal.ledger.leaves import commitment_matches
    from portal.ledger.models import LedgerEntry
    from portal.models import AuditEvent, Membership, Role

    job = running_job(2, rounds=1)
    post(
        job,
        "round",
        round=1,
        sites={"s0": {"ok": True, "train_examples": 3}, "s1": {"ok": True, "train_examples": 77}},
    )
    job = finish(job)
    job.final_metrics = {**job.final_metrics, "updates_hidden": True}
    job.save()
    contribution_score_job(job=job)

    html = _page(client, job)  # the PI, steward of no site
    assert "≤7 examples" in html and "≈75 examples" in html
    assert ">3 examples" not in html and ">77 examples" not in html
    steward = UserFactory()
    s0 = job.sites.get(site__slug="s0").site
    Membership.objects.create(user=steward, institution=s0.institution, role=Role.DATA_STEWARD)
    seen = {r.site.slug: r.raw_shown for r in job_contribution(user=steward, job=job).rows}
    assert seen == {"s0": 3, "s1": "≈75"}  # exact for its own site only

    leaves = [
        json.loads(e.data)
        for e in LedgerEntry.objects.filter(kind="contribution").order_by("index")
    ]
    assert [leaf["site"] for leaf in leaves] == ["s0", "s1"]
    assert all("raw_value" not in leaf for leaf in leaves)
    events = {
        e.data["site"]: e
        for e in AuditEvent.objects.filter(action="contribution.data_volume", target_id=str(job.pk))
    }
    assert events["s0"].institution == s0.institution
    for leaf in leaves:
        data = events[leaf["site"]].data
        assert data["raw_value"] == {"s0": "3.0", "s1": "77.0"}[leaf["site"]]
        assert commitment_matches(
            data["raw_value"],
            commitment_hex=leaf["raw_value_commitment"],
            salt_hex=data["raw_value_salt"],
        )
