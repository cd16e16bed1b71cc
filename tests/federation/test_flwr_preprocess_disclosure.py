"""Issue 9, finding 5 (hostile re-test): the fitted preprocessing gave exact row counts back.

The ServerApp sends its fitted preprocessing to every site (and posted it to the portal). A
missing indicator's mean is missing cells / pooled rows, a one-hot column's mean rows of the value
/ pooled rows and an integer column's mean a sum of integers / its observed cells: fractions whose
continued-fraction expansion (``Fraction.limit_denominator``) gives the exact denominator back.

The world, by hand: three sites whose rows are all training rows.

======  ====  ==================  ==========================================
site    rows  ``x`` (integers)    ``colour``
======  ====  ==================  ==========================================
a       23    30…49, 3 missing    red 12, blue 11
b       41    50…81, 9 missing    red 20, blue 21
c       12    20…30, 1 missing    teal 9, red 3 (at most 7: named by no site)
======  ====  ==================  ==========================================

Pooled: 76 rows, 13 cells of ``x`` missing, 63 observed summing to 790 + 2096 + 275 = 3161;
blue 32, red 35, teal 9. Before the fix the sites received ``x (missing)`` 13/76, ``colour=blue``
32/76 = 8/19, ``colour=red`` 35/76, ``colour=teal`` 9/76 and ``x``'s fill and mean 3161/63.

Released (``sandbox.profile.released_count``: "≤7" stands for 4): rows 25 + 40 + 10 = 75; ``x``
missing 4 + 10 + 4 = 18, observed 20 + 30 + 10 = 60; blue 10 + 20 + 0 = 30, red 10 + 20 + 4 = 34,
teal 0 + 0 + 10 = 10. The attacker knows the released counts, so each total lies in a window:
a released 25 says 23–27, a "≤7" 1–7.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from frp_flwr import contract, preprocess
from sandbox.profile import released_count

ROWS = {"a": 23, "b": 41, "c": 12}
X_VALUES = {"a": range(30, 50), "b": range(50, 82), "c": range(20, 31)}
MISSING = {"a": 3, "b": 9, "c": 1}
COLOURS = {"a": {"red": 12, "blue": 11}, "b": {"red": 20, "blue": 21}, "c": {"teal": 9, "red": 3}}
PLANS = [
    {"name": "x", "kind": "numeric", "missing": "mean", "indicator": True},
    {"name": "z", "kind": "numeric", "missing": "median", "indicator": False},
    {"name": "colour", "kind": "categorical", "missing": "most_frequent", "indicator": False},
]
#: What the sites received before the fix (hand-computed above).
BEFORE = {
    "x (missing)": Fraction(13, 76),
    "colour=blue": Fraction(32, 76),
    "colour=red": Fraction(35, 76),
    "colour=teal": Fraction(9, 76),
    "x": Fraction(3161, 63),
}


def _frame(site: str) -> preprocess.SiteFrame:
    n = ROWS[site]
    x = np.array([*map(float, X_VALUES[site]), *[np.nan] * MISSING[site]])
    colour = np.array([v for v, k in COLOURS[site].items() for _ in range(k)], dtype=object)
    assert len(x) == len(colour) == n
    y = np.array(["no", "yes"] * (n // 2) + ["no"] * (n % 2), dtype=object)
    return preprocess.SiteFrame(
        {"x": x, "z": x.copy(), "colour": colour}, y, np.arange(n), np.arange(0), n, 0
    )


def _federate():
    """The ServerApp's three exchanges, every reply through its JSON record; returns what the
    sites received: the quantile grids and the fitted preprocessing (as sent with training)."""
    spec = contract.JobSpec(
        sites={s: contract.SitePointer(store_key="k", dataset="d", version=1) for s in ROWS},
        target="y",
        features=["x", "z", "colour"],
        plans=[contract.FeaturePlan(**p) for p in PLANS],
    )
    frames = [_frame(s) for s in ROWS]

    def roundtrip(reply, cls):
        return cls.from_record(contract.json_record(reply))

    summaries = [roundtrip(preprocess.site_summary(f, spec), contract.SiteSummary) for f in frames]
    grids = json.loads(json.dumps(preprocess.quantile_grids(spec, summaries)))
    quantiles = [
        roundtrip(preprocess.site_quantiles(f, grids), contract.SiteQuantiles) for f in frames
    ]
    fitted = preprocess.fit(spec, summaries, ["no", "yes"], quantiles, grids)
    fitted = preprocess.Fitted.from_text(fitted.to_text())
    stats = [roundtrip(preprocess.design_stats(f, fitted), contract.DesignStats) for f in frames]
    preprocess.standardise_from(fitted, stats)
    return grids, preprocess.Fitted.from_text(fitted.to_text())


def _window(*released: int) -> range:
    """The totals the released counts allow (a released count r says r − 2 … r + 2; 4 says 1–7)."""
    low = sum(1 if r == 4 else max(r - 2, 0) for r in released)
    high = sum(7 if r == 4 else r + 2 for r in released)
    return range(low, high + 1)


POOLED_ROWS = _window(25, 40, 10)  # 69 … 81
POOLED_OBSERVED = _window(20, 30, 10)  # 54 … 66


def _attack(values: list[float], window: range) -> set[int]:
    """The hostile re-test: each value read as the simplest fraction with a denominator up to
    10,000 that equals it to 1e-12 — and its square (a standard deviation's is a variance) with
    a denominator up to 10⁸ that is a perfect square, read as its root; a denominator of which
    exactly one multiple lies in ``window`` names that total."""
    found = set()
    for v in values:
        for w, bound, root in ((v, 10_000, False), (v * v, 10**8, True)):
            f = Fraction(w).limit_denominator(bound)
            if abs(float(f) - w) > 1e-12 * max(1.0, abs(w)):
                continue
            d = f.denominator
            if root:
                d = math.isqrt(d) if math.isqrt(d) ** 2 == d else 1
            multiples = [t for t in window if t % d == 0]
            if d > 1 and len(multiples) == 1:
                found.add(multiples[0])
    return found


def _broadcast(grids, fitted) -> list[float]:
    """Every number the sites received: the grid (its midpoint is the pooled mean, its half
    width the std), the fills, the standardisation's means and stds."""
    grid = grids["z"]
    numbers = [grid[len(grid) // 2], (grid[-1] - grid[0]) / 2]
    numbers += [f.fill for f in fitted.features if isinstance(f.fill, float)]
    return numbers + fitted.mean + fitted.std


def test_the_attack_gives_the_exact_counts_back_from_the_statistics_before_the_fix():
    """The attack itself, on the hand-computed statistics the sites received before the fix:
    the pooled 76 rows and 63 observed cells, then (× 76) 13 missing cells and c's 9 teal rows."""
    stds = [float(p * (1 - p)) ** 0.5 for k, p in BEFORE.items() if k != "x"]

    assert _attack([float(v) for v in BEFORE.values()], POOLED_ROWS) == {76}
    assert _attack(stds, POOLED_ROWS) == {76}
    assert _attack([float(BEFORE["x"])], POOLED_OBSERVED) == {63}
    assert float(BEFORE["x (missing)"]) * 76 == pytest.approx(13)  # less a's own 3: b + c's 10
    assert float(BEFORE["colour=teal"]) * 76 == pytest.approx(9)  # c's, released as ≈10


def test_the_statistics_the_sites_receive_give_no_exact_count_back():
    grids, fitted = _federate()
    numbers = _broadcast(grids, fitted)
    exact = {76, 63, *ROWS.values(), 76 - 23, 76 - 41, 76 - 12}

    assert _attack(numbers, POOLED_ROWS).isdisjoint(exact)
    assert _attack(numbers, POOLED_OBSERVED).isdisjoint(exact)
    for column, before in BEFORE.items():
        got = fitted.mean[fitted.columns().index(column)]
        assert Fraction(got).limit_denominator(10_000) != before, column


def test_count_columns_are_shares_of_the_released_rows():
    """A one-hot or missing-indicator column's mean is the sum of the sites' released counts
    over the sum of their released rows (75): a function of what researchers already see."""
    assert [released_count(n) for n in ROWS.values()] == [25, 40, 10]
    _, fitted = _federate()
    shares = dict(zip(fitted.columns(), fitted.mean, strict=True))
    stds = dict(zip(fitted.columns(), fitted.std, strict=True))

    assert shares["x (missing)"] == pytest.approx((4 + 10 + 4) / 75, abs=1e-15)
    assert shares["colour=blue"] == pytest.approx((10 + 20 + 0) / 75, abs=1e-15)
    assert shares["colour=red"] == pytest.approx((10 + 20 + 4) / 75, abs=1e-15)
    assert shares["colour=teal"] == pytest.approx((0 + 0 + 10) / 75, abs=1e-15)
    assert (shares["colour=(other)"], stds["colour=(other)"]) == (0.0, 1.0)  # constant: unscaled
    p = 18 / 75
    assert stds["x (missing)"] == pytest.approx((p * (1 - p)) ** 0.5, abs=1e-15)


def test_value_columns_keep_their_mean_and_std_to_within_a_few_standard_errors():
    """``x``'s fill and standardisation are its pooled mean and std rounded to a power of two at
    least 2 and under 4 standard errors (std / √60 released observed cells): the denominator 63
    is no longer in them, and the standardisation is the same affine map up to that rounding."""
    observed = np.array([v for s in ROWS for v in X_VALUES[s]], dtype=float)
    grids, fitted = _federate()
    mean, std = observed.mean(), observed.std()
    step = 2.0 ** np.ceil(np.log2(2 * std / np.sqrt(60)))

    assert 2 * std / np.sqrt(60) <= step < 4 * std / np.sqrt(60)
    assert fitted.features[0].fill % step == 0
    assert abs(fitted.features[0].fill - mean) <= step / 2
    grid = grids["z"]
    assert abs(grid[len(grid) // 2] - mean) <= step / 2
    assert abs((grid[-1] - grid[0]) / 2 - std) <= step / 2
    column = fitted.columns().index("x")
    assert abs(fitted.std[column] - std) <= step  # the filled column's std, ≤ the observed one


def test_the_flower_apps_released_count_is_the_profiles():
    """The Flower App imports no Django: its copy of the rule must stay the profile's."""
    assert [contract.released(n) for n in range(2000)] == [released_count(n) for n in range(2000)]
    with pytest.raises(ValueError, match="negative"):
        contract.released(-1)
