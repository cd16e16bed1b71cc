"""Tests of the contribution plan both sides share (``federation/flwr_app/frp_flwr/coalitions.py``).

The ServerApp scores the plan's coalitions; the portal's GTG-Shapley (``accounting.contribution``)
must ask for no other. Expected values are written out by hand.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr import coalitions  # noqa: E402


def test_coalition_key_is_ascending_members_joined_by_commas():
    assert coalitions.coalition_key(frozenset({2, 0, 11})) == "0,2,11"
    assert coalitions.coalition_key(frozenset()) == ""


def test_guided_permutations_let_every_player_lead_in_turn():
    orders = coalitions.guided_permutations(4, 9, seed=3)

    assert [o[0] for o in orders] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert orders == coalitions.guided_permutations(4, 9, seed=3)  # seeded: the same again
    assert orders != coalitions.guided_permutations(4, 9, seed=4)


@pytest.mark.parametrize("n", [1, 3, coalitions.EXACT_MAX_SITES])
def test_plan_up_to_exact_max_sites_is_every_coalition(n):
    method, plan, permutations = coalitions.contribution_plan(n)

    every = {frozenset(c) for k in range(n + 1) for c in itertools.combinations(range(n), k)}
    assert (method, permutations) == ("exact", 0)
    assert set(plan) == every and len(plan) == 2**n
    assert plan == sorted(plan, key=lambda c: (len(c), sorted(c)))


@pytest.mark.parametrize("n", [9, 10, 13])
def test_gtg_plan_covers_every_coalition_gtg_shapley_asks_for(n):
    from accounting.contribution import gtg_shapley

    method, plan, permutations = coalitions.contribution_plan(n, seed=5)
    planned = set(plan)
    asked = set()
    rng = np.random.default_rng(n)
    values = {}

    def utility(c):  # arbitrary values, so truncation and convergence vary
        asked.add(c)
        return values.setdefault(c, float(rng.uniform()) if c else 0.0)

    gtg_shapley(n, utility, seed=5, max_permutations=permutations, eps=0.0)

    assert method == "gtg"
    assert asked <= planned, sorted(map(sorted, asked - planned))[:3]
    assert {frozenset(range(n)) - {i} for i in range(n)} <= planned  # leave-one-out


def test_plan_above_the_coalition_budget_keeps_one_cycle():
    method, plan, permutations = coalitions.contribution_plan(50)

    assert (method, permutations) == ("gtg", 50)
    assert len(plan) <= 50 * 50 + 52
