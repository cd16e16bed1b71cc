"""Issue 9, finding 5 (hostile re-test): data-volume shares undid the profile's disclosure rule.

A data-volume share was a site's exact training examples over everyone's, published with six
decimals (job page, progress.json, credit statement, ledger) and in whole cents (data credits on
invoices and their ledger leaves). Whoever knows one site's rows (their own institution's) got
every other site's exact rows: rows_B = share_B / share_A × rows_A. Shares are now computed from
the counts as released (``sandbox.profile.released_count``: the profile's rule, "≤7" counting as
4), so they tell nothing the released counts do not; a site's own stewards still see its exact
figures.

The world, by hand: a bagged-trees job (credited by data volume) of 5 rounds at three sites of
three institutions, training on 3, 40 and 157 rows (test rows 1, 10 and 39), for a project of a
fourth institution. Released train rows per round: "≤7" → 4, 40, 157 → 155; over 5 rounds
20, 200 and 775 of 995, so the shares are 4/199, 40/199 and 155/199 (exact ones would be
15/1000, 200/1000 and 785/1000).

Billing: each site's pool bills 1 SU per core-hour at 10.00 EUR with a data credit rate of 0.5;
each site works 720 s a round, 3600 s in all (no start time: its wall seconds are the slot held)
→ 1 SU → 10.00 compute, 5.00 data charge; 15.00 of data credits split by share (largest
remainder): 15 × 4/199 = 0.3015… → 0.30, 15 × 40/199 = 3.0150… → 3.01, 15 × 155/199 = 11.6834… →
11.68; the cent left goes to the largest remainder (0.0050… of s1): 0.30, 3.02, 11.68. (Exact
shares would give 0.23, 3.00, 11.77, and 11.77 / 3.00 × 40 = 156.9 → 157.)
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from django.urls import reverse

from accounting.services import steps
from federation import services, superlink
from federation.models import FederatedJob, JobSite, JobStatus
from portal.ledger.models import LedgerEntry
from portal.models import Membership, ProjectRole, Role
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    PriceRuleFactory,
    ProjectFactory,
    ProjectMemberFactory,
    UserFactory,
)
from tests.federation.callback_support import record

pytestmark = pytest.mark.django_db

ROUNDS = 5
TRAIN = {"s0": 3, "s1": 40, "s2": 157}
TEST = {"s0": 1, "s1": 10, "s2": 39}
#: Released train rows a round, by hand: 3 → "≤7" (counted as 4), 40 → 40, 157 → 155.
RELEASED = {"s0": 4, "s1": 40, "s2": 155}
#: Shares by hand: 5 × released over 5 × (4 + 40 + 155) = 995.
SHARES = {"s0": Fraction(20, 995), "s1": Fraction(200, 995), "s2": Fraction(775, 995)}
D = Decimal


@pytest.fixture
def world():
    versions = {
        slug: DatasetVersionFactory(
            row_count=TRAIN[slug] + TEST[slug],
            dataset__site__slug=slug,
            dataset__site__name=f"Site {slug}",
        )
        for slug in TRAIN
    }
    for dv in versions.values():
        PriceRuleFactory(
            pool=dv.dataset.site.pools.get(),
            cpu_weight=1,
            price_per_unit="10.00",
            data_credit_rate="0.5",
        )
    project = ProjectFactory()
    for dv in versions.values():
        GrantFactory(dataset=dv.dataset, project=project)
    researcher = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    steward = UserFactory()  # a data steward of s2's institution
    Membership.objects.create(
        user=steward, institution=versions["s2"].dataset.site.institution, role=Role.DATA_STEWARD
    )
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=researcher,
        title="volume disclosure",
        target_column="label",
        num_rounds=ROUNDS,
        model="xgboost",
        status=JobStatus.RUNNING,
        flower_run_id="7",
    )
    for dv in versions.values():
        JobSite.objects.create(job=job, site=dv.dataset.site, dataset_version=dv)
    for rnd in range(1, ROUNDS + 1):
        record(
            job,
            {
                "event": "round",
                "round": rnd,
                "sites": {
                    slug: {
                        "ok": True,
                        "train_examples": TRAIN[slug],
                        "eval_examples": TEST[slug],
                        "cpu_seconds": 360.0,
                        "wall_seconds": 720.0,
                    }
                    for slug in TRAIN
                },
            },
        )
    record(
        job,
        {
            "event": "finished",
            "rounds": ROUNDS,
            "eval_accuracy": 0.9,
            "eval_loss": 0.3,
            "sites": {},
        },
    )
    run = superlink.RunStatus("7", "finished", "completed", "", {})
    job = services.job_reconcile(job_id=job.pk, run=run)
    steps.job_accounting_chain(job.pk).apply()
    return {"job": job, "researcher": researcher, "steward": steward}


def _recover(shown: dict[str, float]) -> dict[str, float]:
    """What a researcher who knows s1's 40 rows computes from published shares (or amounts)."""
    return {slug: float(shown[slug]) / float(shown["s1"]) * TRAIN["s1"] for slug in shown}


def _assert_no_exact_rows(shares: dict[str, float]) -> None:
    recovered = _recover(shares)
    assert round(recovered["s2"]) != TRAIN["s2"] and round(recovered["s0"]) != TRAIN["s0"]
    assert recovered == pytest.approx(RELEASED, abs=0.01)  # the page rounds to 6 decimals


def _page(client, user, job) -> str:
    client.force_login(user)
    response = client.get(reverse("federation:job_detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_job_page_shares_come_from_the_released_counts(client, world):
    html = _page(client, world["researcher"], world["job"])

    data = json.loads(re.search(r'id="contribution-data"[^>]*>(.*?)</script>', html).group(1))
    assert data["labels"] == ["Site s0", "Site s1", "Site s2"]
    # 4/199 = 0.0201005…, 40/199 = 0.2010050…, 155/199 = 0.7788944… (six decimals on the page)
    assert data["shares"] == [0.020101, 0.201005, 0.778894]
    _assert_no_exact_rows(dict(zip(["s0", "s1", "s2"], data["shares"], strict=True)))
    assert "2.0 %" in html and "20.1 %" in html and "77.9 %" in html


def test_progress_json_shares_come_from_the_released_counts(client, world):
    client.force_login(world["researcher"])

    body = client.get(reverse("federation:job_progress_json", args=[world["job"].pk])).json()

    shares = body["accounting"]["shares"]
    assert shares == pytest.approx({k: float(v) for k, v in SHARES.items()})
    _assert_no_exact_rows(shares)


def test_contribution_ledger_leaves_hold_shares_of_the_released_counts(world):
    leaves = [
        json.loads(e.data)
        for e in LedgerEntry.objects.filter(kind="contribution").order_by("index")
        if json.loads(e.data)["job"] == world["job"].pk
    ]

    shares = {leaf["site"]: float(leaf["share"]) for leaf in leaves}
    assert shares == pytest.approx({k: float(v) for k, v in SHARES.items()})
    _assert_no_exact_rows(shares)


def test_credit_statement_shares_come_from_the_released_counts(client, world):
    client.force_login(world["researcher"])
    pk = world["job"].pk

    document = client.get(reverse("accounting:credit_json", args=[pk])).json()
    text = client.get(reverse("accounting:credit_text", args=[pk])).content.decode()

    by_site = {
        c["name"]: c["share"] for c in document["contributors"] if c["kind"] == "institution"
    }
    sites = {js.site.institution.name: js.site.slug for js in world["job"].sites.all()}
    shares = {sites[name]: share for name, share in by_site.items()}
    # the draft rounds each institution's sum of shares to 9 decimals
    assert shares == pytest.approx({k: float(v) for k, v in SHARES.items()}, abs=1e-9)
    _assert_no_exact_rows(shares)
    # 155/199 = 77.9 % → "78 %"; 40/199 = 20.1 % → "20 %"; 4/199 = 2.0 % → "2 %"
    assert "(78 %)" in text and "(20 %)" in text and "(2 %)" in text


def test_data_credits_on_invoices_and_in_the_ledger_follow_the_released_counts(world):
    job = world["job"]
    from accounting.models import BillingEntry

    credits = {
        e.site.slug: e.amount
        for e in BillingEntry.objects.filter(job=job, kind="data_credit").select_related("site")
    }
    leaves = {
        leaf["site"]: D(leaf["amount"])
        for leaf in (json.loads(e.data) for e in LedgerEntry.objects.filter(kind="credit"))
        if leaf["job"] == job.pk and leaf["billing_kind"] == "data_credit"
    }

    assert credits == {"s0": D("0.30"), "s1": D("3.02"), "s2": D("11.68")}
    assert leaves == credits
    # 11.68 / 3.02 × 40 = 154.7: the exact 157 does not come back
    assert round(credits["s2"] / credits["s1"] * TRAIN["s1"]) != TRAIN["s2"]


def test_data_volume_examples_are_the_released_figures_except_for_the_sites_stewards(client, world):
    """The examples a data-volume share counts are rounds × rows: the profile's rule applied to
    the product (5 × 157 = 785 → "≈785") gave the rows back (785 / 5 = 157)."""
    from accounting.selectors.contribution import job_contribution

    job = world["job"]
    seen = {
        r.site.slug: r.raw_shown for r in job_contribution(user=world["researcher"], job=job).rows
    }
    own = {r.site.slug: r.raw_shown for r in job_contribution(user=world["steward"], job=job).rows}
    page = _text(_page(client, world["researcher"], job))

    # 5 rounds of "≤7" → at most 35; 5 × 40 = 200; 5 × 155 = 775
    assert seen == {"s0": "≤35", "s1": "≈200", "s2": "≈775"}
    assert own == {"s0": "≤35", "s1": "≈200", "s2": 785}  # exact for its own stewards
    assert "≤35 examples" in page and "≈775 examples" in page
    assert "785" not in page and "≈15 " not in page


def test_usage_examples_are_shown_only_to_the_sites_stewards(client, world):
    """Usage examples are rounds × (train + test) rows: under the rule applied to the product
    (5 × (157 + 39) = 980 → "≈980") a researcher got 980 / 5 = 196 rows back."""
    from accounting.selectors.contribution import job_contribution

    job = world["job"]
    seen = job_contribution(user=world["researcher"], job=job)
    own = job_contribution(user=world["steward"], job=job)

    assert {u.site.slug: u.examples_shown for u in seen.usage} == {
        "s0": "—",
        "s1": "—",
        "s2": "—",
    }
    assert seen.usage_totals["examples"] == "—"
    # s2: 5 × (157 + 39) = 980, exact for its own stewards
    assert {u.site.slug: u.examples_shown for u in own.usage} == {
        "s0": "—",
        "s1": "—",
        "s2": 980,
    }
    page = _text(_page(client, world["researcher"], job))
    assert "980" not in page and "≈250" not in page  # 5 × (40 + 10) = 250
