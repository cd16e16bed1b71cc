"""Contribution scores from posted coalition utilities (``accounting.services.contribution``).

Expected Shapley values are computed by hand below; the utilities enter through the real callback
service, as the ServerApp posts them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from accounting.contribution import exact_shapley
from accounting.models import ContributionScore
from accounting.selectors.contribution import volume_basis
from accounting.services.contribution import ContributionError, contribution_score_job
from federation.models import SiteRoundMetric
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent
from tests.accounting.job_world import finish, post, running_job, utilities_event

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr.coalitions import coalition_key, contribution_plan  # noqa: E402

pytestmark = pytest.mark.django_db

# Three sites; whole-run utilities (accuracy) written out by hand. Keys: member indexes.
TABLE = {
    "": 0.50,
    "0": 0.70,
    "1": 0.60,
    "2": 0.50,
    "0,1": 0.85,
    "0,2": 0.72,
    "1,2": 0.62,
    "0,1,2": 0.90,
}
# By hand, φ_i = Σ_S |S|!(n−|S|−1)!/n! · (v(S∪i) − v(S)), weights 1/3, 1/6, 1/6, 1/3:
# φ0 = [2·(0.70−0.50) + (0.85−0.60) + (0.72−0.50) + 2·(0.90−0.62)] / 6 = 1.43 / 6
# φ1 = [2·(0.60−0.50) + (0.85−0.70) + (0.62−0.50) + 2·(0.90−0.72)] / 6 = 0.83 / 6
# φ2 = [2·(0.50−0.50) + (0.72−0.70) + (0.62−0.60) + 2·(0.90−0.85)] / 6 = 0.14 / 6
HAND_SHAPLEY = [1.43 / 6, 0.83 / 6, 0.14 / 6]
HAND_SHARES = [1.43 / 2.4, 0.83 / 2.4, 0.14 / 2.4]
HAND_LOO = [0.90 - 0.62, 0.90 - 0.72, 0.90 - 0.85]
PLAYERS = ["s0", "s1", "s2"]


def _scores(job, method, rnd=0):
    rows = ContributionScore.objects.filter(job=job, method=method, round=rnd)
    return {s.site.slug: s for s in rows.select_related("site")}


@pytest.fixture
def scored_job():
    job = running_job(3)
    post(job, "finished", rounds=2, eval_accuracy=0.9, eval_loss=0.3, sites={})
    post(job, "contribution", **utilities_event(PLAYERS, {"0": TABLE}))
    return finish(job)


def test_exact_shapley_three_sites_matches_hand_computation(scored_job):
    contribution_score_job(job=scored_job)

    exact = _scores(scored_job, "exact")
    assert [exact[p].raw_value for p in PLAYERS] == pytest.approx(HAND_SHAPLEY, abs=1e-9)
    assert [exact[p].share for p in PLAYERS] == pytest.approx(HAND_SHARES, abs=1e-9)
    assert all(exact[p].evaluations == 8 for p in PLAYERS)


def test_exact_shapley_efficiency_and_shares_sum_to_one(scored_job):
    contribution_score_job(job=scored_job)

    exact = _scores(scored_job, "exact").values()
    assert sum(s.raw_value for s in exact) == pytest.approx(TABLE["0,1,2"] - TABLE[""], abs=1e-9)
    assert sum(s.share for s in exact) == pytest.approx(1.0, abs=1e-9)


def test_leave_one_out_cross_check_by_hand(scored_job):
    contribution_score_job(job=scored_job)

    loo = _scores(scored_job, "loo")
    assert [loo[p].raw_value for p in PLAYERS] == pytest.approx(HAND_LOO, abs=1e-9)
    assert sum(s.share for s in loo.values()) == pytest.approx(1.0)


def test_contribution_twice_writes_scores_and_ledger_once(scored_job):
    first = contribution_score_job(job=scored_job)
    leaves = LedgerEntry.objects.filter(kind="contribution").count()

    second = contribution_score_job(job=scored_job)

    assert len(first) == len(second) == 6  # exact and loo for three sites
    assert {s.pk for s in first} == {s.pk for s in second}
    assert ContributionScore.objects.filter(job=scored_job).count() == 6
    assert leaves == 6
    assert LedgerEntry.objects.filter(kind="contribution").count() == 6
    assert AuditEvent.objects.filter(action="contribution.score").count() == 1  # the first call


def test_contribution_ledger_leaf_has_method_round_and_values_as_text(scored_job):
    contribution_score_job(job=scored_job)

    leaves = [json.loads(e.data) for e in LedgerEntry.objects.filter(kind="contribution")]
    leaf = next(x for x in leaves if x["site"] == "s0" and x["method"] == "exact")
    assert leaf["kind"] == "contribution" and leaf["job"] == scored_job.pk and leaf["round"] == 0
    assert float(leaf["raw_value"]) == pytest.approx(HAND_SHAPLEY[0], abs=1e-9)
    assert isinstance(leaf["share"], str)


def test_per_round_exact_scores_stored_under_their_round():
    job = running_job(3)
    round_1 = {k: v - 0.1 for k, v in TABLE.items()}  # same differences: same Shapley values
    round_2 = {k: (0.8 if "0" in k.split(",") else 0.8 - 0.05 * len(k)) for k in TABLE}
    post(job, "contribution", **utilities_event(PLAYERS, {"0": TABLE, "1": round_1, "2": round_2}))
    job = finish(job)

    contribution_score_job(job=job)

    r1 = _scores(job, "exact", rnd=1)
    assert [r1[p].raw_value for p in PLAYERS] == pytest.approx(HAND_SHAPLEY, abs=1e-9)
    r2 = _scores(job, "exact", rnd=2)
    expected = exact_shapley(3, lambda c: round_2[",".join(map(str, sorted(c)))])
    assert [r2[p].raw_value for p in PLAYERS] == pytest.approx(expected.tolist(), abs=1e-9)
    assert not _scores(job, "loo", rnd=1)  # the cross-check is for the whole run only


def test_negative_shapley_value_gets_zero_share():
    job = running_job(2)
    table = {"": 0.5, "0": 0.8, "1": 0.4, "0,1": 0.7}  # site 1 hurts the model
    post(job, "contribution", **utilities_event(["s0", "s1"], {"0": table}))
    job = finish(job)

    contribution_score_job(job=job)

    exact = _scores(job, "exact")
    # φ0 = ½(0.3) + ½(0.3) = 0.3; φ1 = ½(−0.1) + ½(−0.1) = −0.1
    assert exact["s0"].raw_value == pytest.approx(0.3) and exact["s1"].raw_value == pytest.approx(
        -0.1
    )
    assert (exact["s0"].share, exact["s1"].share) == (1.0, 0.0)


def test_missing_coalition_raises_and_writes_nothing():
    job = running_job(3)
    partial = {k: v for k, v in TABLE.items() if k != "0,2"}
    post(job, "contribution", **utilities_event(PLAYERS, {"0": partial}))
    job = finish(job)

    with pytest.raises(ContributionError, match="0,2"):
        contribution_score_job(job=job)

    assert not ContributionScore.objects.filter(job=job).exists()
    assert not LedgerEntry.objects.exists()


def test_evaluation_error_gives_no_scores():
    job = running_job(2)
    post(job, "contribution", players=["s0", "s1"], error="no site scored the coalition models")
    job = finish(job)

    assert contribution_score_job(job=job) == []
    assert job.final_metrics["contribution"]["error"].startswith("no site scored")


def test_hidden_updates_use_data_volume_by_training_examples():
    job = running_job(3)
    per_round = {"s0": 30, "s1": 10, "s2": 0}
    for rnd in (1, 2):
        sites = {s: {"ok": True, "train_examples": n} for s, n in per_round.items()}
        post(job, "round", round=rnd, sites=sites)
    job = finish(job)
    job.final_metrics = {**job.final_metrics, "updates_hidden": True}
    job.save()

    contribution_score_job(job=job)

    volume = _scores(job, "data_volume")
    assert [volume[s].raw_value for s in PLAYERS] == [60.0, 20.0, 0.0]
    assert [volume[s].share for s in PLAYERS] == [0.75, 0.25, 0.0]
    assert not ContributionScore.objects.filter(job=job).exclude(method="data_volume").exists()
    assert SiteRoundMetric.objects.filter(job_site__job=job).count() == 6


def test_ten_sites_use_gtg_on_the_coalitions_the_serverapp_scored():
    n = 10
    rng = np.random.default_rng(3)
    weight = rng.uniform(0.0, 0.04, size=n)
    weight[7] = 0.0  # a null site

    def v(coalition) -> float:  # concave in the coalition's weight: interactions, not additive
        return 0.5 + 0.4 * (1 - np.exp(-8 * sum(weight[i] for i in coalition)))

    method, coalitions, permutations = contribution_plan(n)
    assert method == "gtg" and permutations == 30
    table = {coalition_key(c): v(c) for c in coalitions}
    round_1 = {
        k: 0.5 + 0.5 * (x - 0.5) for k, x in table.items()
    }  # half the gains: half the values
    players = [f"s{i}" for i in range(n)]
    job = running_job(n)
    tables = {"0": table, "1": round_1}
    post(job, "contribution", **utilities_event(players, tables, permutations=permutations))
    job = finish(job)

    contribution_score_job(job=job)

    gtg = _scores(job, "gtg")
    exact = exact_shapley(n, v)
    values = np.array([gtg[p].raw_value for p in players])
    assert np.corrcoef(values, exact)[0, 1] > 0.95
    assert np.abs(values - exact).max() < 0.01  # accuracy points; exact spans 0 … ~0.05
    # Each permutation's marginals telescope to v(prefix) − v(∅), the prefix within eps of v(N).
    assert values.sum() == pytest.approx(v(range(n)) - v(()), abs=1e-3)
    assert gtg["s7"].share == pytest.approx(0.0, abs=1e-9)
    assert gtg["s0"].evaluations <= len(coalitions) < 2**n
    assert not _scores(job, "exact")
    assert len(_scores(job, "loo")) == n
    per_round = _scores(job, "gtg", rnd=1)
    assert [per_round[p].raw_value for p in players] == pytest.approx(values / 2, abs=1e-3)


def test_tree_bagging_jobs_use_data_volume_by_training_examples():
    job = running_job(2)
    job.model = "xgboost"
    job.save(update_fields=["model"])
    for rnd in (1, 2):
        sites = {"s0": {"ok": True, "train_examples": 18}, "s1": {"ok": True, "train_examples": 6}}
        post(job, "round", round=rnd, sites=sites)
    job = finish(job)

    contribution_score_job(job=job)

    volume = _scores(job, "data_volume")
    assert [volume[s].raw_value for s in ("s0", "s1")] == [36.0, 12.0]  # exact: 2 × 18, 2 × 6
    # shares from the released rows (ADR 0036): 18 → 20 and 6 → "≤7" (4) a round, so 40 and 8
    # of 48, not 36 and 12 of 48
    assert [volume[s].share for s in ("s0", "s1")] == pytest.approx([40 / 48, 8 / 48])
    assert not ContributionScore.objects.filter(job=job).exclude(method="data_volume").exists()


def test_shapley_values_are_computed_from_the_utilities_as_released():
    # Issue 9 (hostile re-test, B): a utility is the median of the sites' accuracies, a fraction
    # over one site's held-out rows, and Shapley values of exact ones, in the ledger every
    # institution reads, give the counts back. With 36, 38 and 40 held-out rows (released
    # "≈35", "≈40", "≈40": at least 33, 38, 38), each utility is snapped to the grid of the
    # smallest, 1/33 (federation.disclosure.site_fraction): 0.72 × 33 = 23.76 → 24/33, …
    job = running_job(3)
    event = utilities_event(PLAYERS, {"0": TABLE})
    event["examples"] = {"s0": 36, "s1": 38, "s2": 40}
    post(job, "contribution", **event)
    job = finish(job)

    contribution_score_job(job=job)

    released = {k: round(v * 33) / 33 for k, v in TABLE.items()}
    assert released["0,2"] == 24 / 33 and released["1,2"] == 20 / 33  # 0.62 × 33 = 20.46
    expected = exact_shapley(3, lambda c: released[coalition_key(c)])
    exact = _scores(job, "exact")
    assert [exact[p].raw_value for p in PLAYERS] == pytest.approx(expected.tolist(), abs=1e-12)
    assert abs(exact["s0"].raw_value - HAND_SHAPLEY[0]) > 1e-3  # not the exact utilities'
    leaf = next(
        json.loads(e.data)
        for e in LedgerEntry.objects.filter(kind="contribution")
        if json.loads(e.data)["site"] == "s0" and json.loads(e.data)["method"] == "exact"
    )
    assert float(leaf["raw_value"]) == pytest.approx(expected[0], abs=1e-15)
    loo = _scores(job, "loo")
    assert loo["s2"].raw_value == pytest.approx(released["0,1,2"] - released["0,1"], abs=1e-12)


def test_a_site_of_at_most_seven_held_out_rows_gets_its_job_credited_by_data_volume(client):
    # A utility may be that site's accuracy, over its 1–7 rows ("≤7"): no utility is released,
    # so the job is credited by data volume, with the reason on the page (volume_basis).
    job = running_job(3)
    for rnd in (1, 2):
        sites = {
            s: {"ok": True, "train_examples": n} for s, n in zip(PLAYERS, (30, 10, 20), strict=True)
        }
        post(job, "round", round=rnd, sites=sites)
    event = utilities_event(PLAYERS, {"0": TABLE})
    event["examples"] = {"s0": 36, "s1": 5, "s2": 40}
    post(job, "contribution", **event)
    job = finish(job)

    contribution_score_job(job=job)

    assert volume_basis(job) == "small_site"
    assert set(ContributionScore.objects.filter(job=job).values_list("method", flat=True)) == {
        "data_volume"
    }
    client.force_login(job.submitted_by)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "a site evaluated on 1–7 held-out rows" in page
    assert "hidden by secure aggregation" not in page
