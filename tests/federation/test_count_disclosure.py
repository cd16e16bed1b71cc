"""Issue 9, finding 5 (hostile re-test): held-out counts given back by what is built from them.

A site's held-out rows are shown to researchers only under the profile's rule ("≈40", "≤7"); its
own stewards see them exact. Three figures gave them back:

- a **confusion matrix**'s cells add up to the held-out rows: s2's cells 20, 0, 0, 19 (every one
  0 or above 7, so none was suppressed) said 39 to every project member, and the pooled matrix's
  cells the exact pooled total;
- the **pooled metrics' examples** (progress.json, model card) were the exact pooled total (50);
  less the rows one knows (one's own site's), the others' exact sum;
- the **pooled held-out total** was the rule applied to the exact total, which, less one's own
  exact rows, narrows another site's rows below its own released count (own 11 and other 12:
  "≈10" says 8–12, "≈25" less 11 says 12–16: 12).

The world, by hand: sites s0, s1, s2 of three institutions with 1, 10 and 39 held-out rows
(released "≤7", 10 and 40), binary classes; confusion matrices (true ↓, predicted →):
s0 [[1, 0], [0, 0]], s1 [[8, 0], [0, 2]], s2 [[20, 0], [0, 19]], pooled [[29, 0], [0, 21]].
Released: pooled total = ≤7 + 10 + 40 = "≈50 + ≤7"; cells under the rule: 29 → ≈30, 21 → ≈20,
20 → ≈20, 19 → ≈20, 8 → ≈10, 2 → ≤7, 1 → ≤7.
"""

from __future__ import annotations

import json

import pytest

from federation import artifacts, services
from federation.models import SiteRoundMetric
from federation.selectors import job_results
from frp_flwr import contract
from portal.models import Membership, Role
from tests.accounting.job_world import finish, post, running_job
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

HELD_OUT = {"s0": 1, "s1": 10, "s2": 39}
CONFUSION = {
    "s0": [[1, 0], [0, 0]],
    "s1": [[8, 0], [0, 2]],
    "s2": [[20, 0], [0, 19]],
}
POOLED = [[29, 0], [0, 21]]


@pytest.fixture
def job():
    job = running_job(3, rounds=1)
    post(
        job,
        "round",
        round=1,
        sites={
            s: {"ok": True, "train_examples": 4 * n, "eval_examples": n}
            for s, n in HELD_OUT.items()
        },
    )
    post(
        job,
        "finished",
        rounds=1,
        eval_accuracy=1.0,
        eval_loss=0.1,
        eval_examples=50,
        classes=["no", "yes"],
        metrics={"examples": 50, "accuracy": 1.0, "confusion": POOLED},
        sites={
            s: {
                "eval_examples": n,
                "eval_accuracy": 1.0,
                "metrics": {"examples": n, "accuracy": 1.0, "confusion": CONFUSION[s]},
            }
            for s, n in HELD_OUT.items()
        },
    )
    return finish(job)


def _cells(display) -> list[list]:
    return [row["cells"] for row in display["rows"]]


def test_confusion_cells_are_under_the_rule_except_for_the_sites_stewards(job):
    steward = UserFactory()
    s2 = job.sites.get(site__slug="s2").site
    Membership.objects.create(user=steward, institution=s2.institution, role=Role.DATA_STEWARD)

    seen = job_results(job=job, user=job.submitted_by)["confusion"]
    own = job_results(job=job, user=steward)["confusion"]

    sites = dict(seen["sites"])
    assert _cells(sites["s2"]) == [["≈20", "0"], ["0", "≈20"]]  # not 20 + 19 = 39
    assert _cells(sites["s1"]) == [["≈10", "0"], ["0", "≤7"]]
    assert _cells(seen["pooled"]) == [["≈30", "0"], ["0", "≈20"]]  # not 29 + 21 = 50
    assert _cells(dict(own["sites"])["s2"]) == [[20, 0], [0, 19]]  # its own stewards: exact
    assert _cells(dict(own["sites"])["s1"]) == [["≈10", "0"], ["0", "≤7"]]
    assert _cells(own["pooled"]) == [["≈30", "0"], ["0", "≈20"]]  # a steward of one site only


def test_progress_json_pooled_counts_come_from_the_released_counts(client, job):
    client.force_login(job.submitted_by)

    final = client.get(f"/jobs/{job.pk}/progress.json").json()["final_metrics"]

    assert final["eval_examples"] == "≈50 + ≤7"  # ≤7 + 10 + 40, not the rule on 50
    assert final["metrics"]["examples"] == "≈50 + ≤7"  # was the exact 50
    assert final["metrics"]["confusion"] == [["≈30", "0"], ["0", "≈20"]]


def test_model_card_pooled_counts_come_from_the_released_counts(job):
    card = artifacts.model_card(job)

    assert card["metrics"]["eval_examples"] == "50 + ≤7"
    assert card["metrics"]["pooled"]["examples"] == "50 + ≤7"  # was the exact 50
    assert card["metrics"]["pooled"]["confusion"] == [[30, 0], [0, 20]]  # was 29 and 21


def test_a_refused_sites_error_names_its_rows_only_as_released():
    """A site whose reply claims more rows than its registered dataset version holds is refused
    with a reason every project member reads on the job page ("Lost in round 1: …"); the reason
    named the registered rows exactly (196, released as ≈195) and the claimed ones (a buggy
    site's claim may be its real local count)."""
    job = running_job(2, rounds=1)
    version = job.sites.get(site__slug="s1").dataset_version
    version.row_count = 196
    version.save(update_fields=["row_count"])

    post(
        job,
        "round",
        round=1,
        sites={
            "s0": {"ok": True, "train_examples": 80, "eval_examples": 20},
            "s1": {"ok": True, "train_examples": 301, "eval_examples": 39},
        },
    )

    error = SiteRoundMetric.objects.get(job_site__job=job, job_site__site__slug="s1").error
    assert "refused" in error and "≈195 rows" in error and "≈300 train" in error
    assert "196" not in error and "301" not in error


def test_the_serverapps_examples_refusal_names_rows_only_as_released():
    limits = contract.SiteLimits(rows=196)

    problem = contract.examples_problem("train", 301, limits, test_fraction=0.2, classes=2)

    # 196 rows hold 39–40 held-out rows (196 × 0.2 = 39.2 ± 1), so at most 157 train rows
    assert problem == (
        "reported ≈300 train examples; the dataset version registered for this site has ≈195 "
        "rows, so its train split holds at most ≈155"
    )


# --- the fitted preprocessing (a missing indicator's mean is missing cells / pooled rows) ----

#: A fitted preprocessing as a ServerApp fitted it before the fix: two sites of 23 and 53 training
#: rows (76 pooled, released 25 + 55 = 80) with 13 cells of ``x`` missing. The indicator's mean
#: 13/76 = 0.171052631578… is a fraction whose continued-fraction expansion gives 76 back, the
#: one-hot shares 32/76 and 44/76 too; less one's own 23, the other site's exact 53.
FITTED = {
    "task": "classification",
    "classes": ["no", "yes"],
    "features": [
        {"name": "x", "kind": "numeric", "missing": "mean", "indicator": True, "fill": 50.1746},
        {
            "name": "colour",
            "kind": "categorical",
            "missing": "most_frequent",
            "indicator": False,
            "fill": "red",
            "vocabulary": ["blue", "red"],
        },
    ],
    "mean": [50.1746, 13 / 76, 32 / 76, 44 / 76, 0.0],
    "std": [
        16.2,
        (13 * 63) ** 0.5 / 76,
        (32 * 44) ** 0.5 / 76,
        (44 * 32) ** 0.5 / 76,
        1.0,
    ],
    "target_mean": 0.0,
    "target_std": 1.0,
    "notes": [],
}


@pytest.fixture
def fitted_job(settings, tmp_path):
    settings.FRP_MODEL_STORE_URL = (tmp_path / "model-store").as_uri()
    job = running_job(2, rounds=1)
    post(
        job,
        "round",
        round=1,
        sites={
            "s0": {"ok": True, "train_examples": 23, "eval_examples": 6},
            "s1": {"ok": True, "train_examples": 53, "eval_examples": 13},
        },
    )
    post(
        job,
        "finished",
        rounds=1,
        eval_accuracy=0.9,
        eval_loss=0.2,
        eval_examples=19,
        classes=["no", "yes"],
        model=[[[0.5]] * 5, [0.0]],
        preprocessing=FITTED,
    )
    return finish(job)


def _count_ratios_in(text: str) -> list[str]:
    """The fitted statistics above that are ratios of counts, as JSON writes them."""
    return [
        json.dumps(v) for v in (*FITTED["mean"][1:4], *FITTED["std"][1:4]) if json.dumps(v) in text
    ]


def test_progress_json_leaves_the_fitted_preprocessing_out_except_for_a_steward_of_every_site(
    client, fitted_job
):
    """The fitted preprocessing's one-hot and missing-indicator statistics are shares of the
    pooled rows: a researcher gets neither it nor any of its figures; a steward of both sites
    gets it as posted (the pooled rows are exact for them)."""
    steward = UserFactory()
    for js in fitted_job.sites.select_related("site"):
        Membership.objects.create(
            user=steward, institution=js.site.institution, role=Role.DATA_STEWARD
        )
    one_site = UserFactory()
    Membership.objects.create(
        user=one_site,
        institution=fitted_job.sites.get(site__slug="s0").site.institution,
        role=Role.DATA_STEWARD,
    )
    url = f"/jobs/{fitted_job.pk}/progress.json"

    client.force_login(fitted_job.submitted_by)
    researcher = client.get(url)
    client.force_login(one_site)
    of_one = client.get(url)
    client.force_login(steward)
    of_every = client.get(url).json()["final_metrics"]

    assert "preprocessing" not in researcher.json()["final_metrics"]
    assert _count_ratios_in(researcher.content.decode()) == []
    assert "preprocessing" not in of_one.json()["final_metrics"]  # the other site's rows too
    assert _count_ratios_in(of_one.content.decode()) == []
    assert of_every["preprocessing"] == FITTED


def test_model_card_gives_the_fitted_preprocessing_only_once_the_airlock_released_the_model(
    fitted_job,
):
    """Before the airlock the card (page and JSON, every project member) names the plans only;
    the released model file carries the fitted preprocessing, and so does the card then."""
    before = artifacts.model_card(fitted_job)

    release = services.release_request(by=fitted_job.submitted_by, job=fitted_job)
    for js in fitted_job.sites.select_related("site"):
        steward = UserFactory()
        Membership.objects.create(
            user=steward, institution=js.site.institution, role=Role.DATA_STEWARD
        )
        services.release_decide(by=steward, release_id=release.pk, site=js.site, approve=True)
    fitted_job.refresh_from_db()
    after = artifacts.model_card(fitted_job)

    assert before["preprocessing"] == {"plans": fitted_job.preprocessing}
    assert _count_ratios_in(json.dumps(before)) == []
    assert after["preprocessing"] == FITTED


def test_the_model_card_page_shows_the_pooled_rows_as_approximate(client, job):
    """Hostile re-test F4: the page showed "Examples 115" (a sum of released counts) as if exact."""
    client.force_login(job.submitted_by)

    page = client.get(f"/jobs/{job.pk}/model-card/").content.decode()

    assert "≈50 + ≤7" in page
