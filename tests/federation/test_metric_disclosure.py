"""Issue 9 (hostile re-test, B): metrics at full precision gave the held-out counts back.

A site's held-out rows are shown to researchers only under the profile's rule ("≈40", "≤7"), its
confusion cells too (``test_count_disclosure``). But an accuracy is correct rows over held-out
rows: at full precision its continued-fraction expansion gives the count (0.964912… = 110/114
where the page shows "≈115"), and with the balanced accuracy and the per-site accuracies the
whole confusion matrix. Now everyone but a steward of every site it is computed over sees a
fraction over rows snapped to the grid of the smallest counts the released ones allow
(``sandbox.profile.released_fraction``), a loss to 3 significant figures.

The world, by hand: sites s0, s1, s2 of three institutions with 36, 38 and 40 held-out rows
(released "≈35", "≈40", "≈40": at least 33, 38 and 38 rows), binary classes; confusion matrices
(true ↓, predicted →): s0 [[20, 1], [1, 14]] (34/36 right), s1 [[22, 0], [1, 15]] (37/38),
s2 [[25, 0], [1, 14]] (39/40), pooled [[67, 1], [3, 43]] (110/114 = 0.964912).

Released, by hand:
- pooled accuracy over at least 33 + 38 + 38 = 109 rows: 110/114 × 109 = 105.18 → 105/109;
- s0's accuracy over at least 33 rows: 34/36 × 33 = 31.17 → 31/33;
- pooled balanced accuracy (67/68 + 43/46) / 2 = 0.960038, over the class with the fewest rows
  as released: class "yes" 15, 16, 15 rows → "≈15", "≈15", "≈15" → at least 13 + 13 + 13 = 39
  (class "no": 21, 22, 25 → at least 18 + 18 + 23 = 59): 0.960038 × 39 = 37.44 → 37/39;
- the majority-class baseline 68/114 over 109 rows: 65.02 → 65/109;
- the log loss 0.0912345 to 3 significant figures: 0.0912.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from federation import artifacts
from federation.notifications import job_notice
from federation.selectors import job_results
from portal.models import Membership, Role
from sandbox.profile import released_floor, released_fraction, released_measure, safe_count
from tests.accounting.job_world import finish, post, running_job
from tests.factories import UserFactory

HELD_OUT = {"s0": 36, "s1": 38, "s2": 40}
CONFUSION = {
    "s0": [[20, 1], [1, 14]],
    "s1": [[22, 0], [1, 15]],
    "s2": [[25, 0], [1, 14]],
}
POOLED = [[67, 1], [3, 43]]
ACCURACY = 110 / 114
BALANCED = (67 / 68 + 43 / 46) / 2


def _released_interval(n: int) -> range:
    """Every count that shows as ``n`` does under the profile's rule."""
    return range(max(1, n - 10), n + 11) if n else range(0, 1)


# -- the rule itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "floor"), [(0, 0), (1, 1), (7, 1), (8, 8), (12, 8), (13, 13), (36, 33), (114, 113)]
)
def test_released_floor_is_the_smallest_count_the_released_one_allows(n, floor):
    assert released_floor(n) == floor
    shown = safe_count(n)
    assert min(m for m in range(0, n + 11) if safe_count(m) == shown) == floor


def test_a_released_fraction_holds_for_every_count_the_released_one_allows():
    # Exhaustive over every k/n with n up to 160: the shown value is one that some k'/n' rounds
    # to for each n' showing as n does, so it cannot tell n' from n (nor, by its continued
    # fraction, say more than its grid, which is a function of the released count).
    for n in range(1, 161):
        floor = released_floor(n)
        allowed = [m for m in _released_interval(n) if safe_count(m) == safe_count(n)]
        for k in range(n + 1):
            shown = released_fraction(k / n, [n])
            if n <= 7:
                assert shown is None  # "≤7": a fraction over it would say which
                continue
            assert Fraction(shown).limit_denominator(10**6).denominator in {
                d for d in range(1, floor + 1) if floor % d == 0
            }
            for m in allowed:
                assert any(round(j / m * floor) == round(shown * floor) for j in range(m + 1)), (
                    k,
                    n,
                    m,
                )
            assert abs(shown - k / n) <= 1 / (2 * floor) + 1e-12  # at most half a row


def test_the_hostile_re_tests_accuracy_no_longer_gives_its_count():
    assert Fraction(ACCURACY).limit_denominator(1000) == Fraction(55, 57)  # 114 rows, exact
    shown = released_fraction(ACCURACY, list(HELD_OUT.values()))
    assert shown == 105 / 109
    assert Fraction(shown).limit_denominator(1000) == Fraction(105, 109)  # released: 109


def test_a_measure_keeps_three_significant_figures():
    assert released_measure(0.0912345) == 0.0912
    assert released_measure(1234.5678) == 1230.0
    assert released_measure(float("nan")) is None and released_measure(None) is None


# -- the pages ---------------------------------------------------------------------------------


@pytest.fixture
def job(db):  # noqa: ARG001
    job = running_job(3, rounds=1)
    post(
        job,
        "round",
        round=1,
        eval_accuracy=ACCURACY,
        eval_loss=0.0912345,
        sites={
            s: {
                "ok": True,
                "train_examples": n,  # the factory's datasets hold 100 rows
                "eval_examples": n,
                "eval_accuracy": sum(CONFUSION[s][i][i] for i in range(2)) / n,
                "eval_loss": 0.0912345,
            }
            for s, n in HELD_OUT.items()
        },
    )
    post(
        job,
        "finished",
        rounds=1,
        eval_accuracy=ACCURACY,
        eval_loss=0.0912345,
        eval_examples=114,
        classes=["no", "yes"],
        metrics={
            "examples": 114,
            "accuracy": ACCURACY,
            "balanced_accuracy": BALANCED,
            "log_loss": 0.0912345,
            "confusion": POOLED,
        },
        baseline={
            "name": "majority class (no)",
            "metric": "accuracy",
            "value": 68 / 114,
            "model": ACCURACY,
            "better": True,
        },
        sites={
            s: {
                "eval_examples": n,
                "eval_accuracy": sum(CONFUSION[s][i][i] for i in range(2)) / n,
                "metrics": {
                    "examples": n,
                    "accuracy": sum(CONFUSION[s][i][i] for i in range(2)) / n,
                    "confusion": CONFUSION[s],
                },
            }
            for s, n in HELD_OUT.items()
        },
    )
    return finish(job)


def _steward_of(job, *slugs):
    user = UserFactory()
    for slug in slugs:
        site = job.sites.get(site__slug=slug).site
        Membership.objects.create(user=user, institution=site.institution, role=Role.DATA_STEWARD)
    return user


def test_progress_json_gives_a_researcher_fractions_over_released_rows(client, job):
    client.force_login(job.submitted_by)  # a researcher: a steward of no site

    data = client.get(f"/jobs/{job.pk}/progress.json").json()

    final = data["final_metrics"]
    assert final["eval_accuracy"] == 105 / 109  # was 110/114 = 0.964912…
    assert final["metrics"]["accuracy"] == 105 / 109
    assert final["metrics"]["balanced_accuracy"] == 37 / 39
    assert final["metrics"]["log_loss"] == 0.0912 and final["eval_loss"] == 0.0912
    assert final["baseline"]["value"] == 65 / 109 and final["baseline"]["model"] == 105 / 109
    assert data["chart"]["eval_accuracy"] == [105 / 109]
    assert data["results"]["values"][0] == 105 / 109
    sites = {s["site"]: s for s in data["sites"]}
    assert sites["s0"]["eval_accuracy"] == 31 / 33  # was 34/36 = 0.9444…


def test_a_steward_of_every_site_sees_the_exact_metrics(client, job):
    client.force_login(_steward_of(job, "s0", "s1", "s2"))

    data = client.get(f"/jobs/{job.pk}/progress.json").json()

    assert data["final_metrics"]["metrics"]["accuracy"] == ACCURACY
    assert data["final_metrics"]["metrics"]["balanced_accuracy"] == BALANCED
    assert data["chart"]["eval_accuracy"] == [ACCURACY]


def test_a_sites_own_steward_sees_its_metrics_exact_and_the_pooled_ones_released(job):
    results = job_results(job=job, user=_steward_of(job, "s0"))

    accuracy = next(m for m in results["metrics"] if m["key"] == "accuracy")
    assert accuracy["sites"][0] == 34 / 36  # s0, its own: exact
    assert accuracy["sites"][1] == round(37 / 38 * 38) / 38  # s1: over at least 38 rows
    assert accuracy["pooled"] == 105 / 109


def test_the_job_page_list_and_model_card_show_no_exact_accuracy(client, job):
    client.force_login(job.submitted_by)

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    listing = client.get("/jobs/").content.decode()
    card = artifacts.model_card(job)  # every project member reads it

    assert "0.9649" not in page and "0.965" not in page  # 110/114 at the page's precisions
    assert "0.9633" in page  # 105/109 to four places (the results table)
    assert "0.963" in listing and "0.965" not in listing
    assert card["metrics"]["eval_accuracy"] == 105 / 109
    assert card["metrics"]["pooled"]["accuracy"] == 105 / 109
    assert card["metrics"]["baseline"]["value"] == 65 / 109


def test_the_job_end_mail_gives_the_submitter_released_scores(job):
    # Hostile re-test: the mail said "Final accuracy: 0.9825 (baseline …: 0.6316)", which only
    # 112/114 and 72/114 round to among the totals the released counts allow.
    subject, body = job_notice(job)

    assert f"Final accuracy: {105 / 109:.4f} (baseline majority class (no): {65 / 109:.4f})" in body
    assert f"{ACCURACY:.4f}" not in body and f"{68 / 114:.4f}" not in body
    steward = _steward_of(job, "s0", "s1", "s2")
    job.submitted_by = steward
    assert f"Final accuracy: {ACCURACY:.4f}" in job_notice(job)[1]  # a steward of every site
