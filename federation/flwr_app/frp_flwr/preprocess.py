"""Federated preprocessing: missing values, one-hot categories and standardisation from per-site
aggregates (numpy only, no Django, no rows leave a site).

A job's ``JobSpec.plans`` say, per feature, its kind (numeric, categorical, date) and what its
missing cells get (drop the row, mean, median, most frequent; optionally a 0/1 indicator). The
ServerApp fits those rules in three exchanges with the sites, each answered with aggregates:

1. **Summary** (:func:`site_summary`, with discovery): per feature over the site's training rows,
   the missing cells and either ``(n, mean, M2)`` of the observed values or the category counts
   of the values held by more than ``small_count`` rows at the site (the rest only as one
   "other" count, so a rare value is never named — the profile's disclosure rule).
2. **Quantiles** (:func:`site_quantiles`, only when a feature's rule is "median"): cumulative
   counts at a grid the ServerApp chose over ``mean ± std`` (the median lies within one standard
   deviation of the mean), from which :func:`median_from_counts` interpolates the pooled median.
3. **Design statistics** (:func:`design_stats`): with the fitted fills and vocabularies
   (:class:`Fitted`), each site builds its model matrix and returns its columns' ``(n, mean,
   M2)`` for federated standardisation, its kept training labels (for the majority-class
   baseline) or target summary (regression), and what it did to its rows.

:func:`transform` then gives every ClientApp message the same matrix: rows without a target are
always dropped; a row with a missing cell in a "drop" feature is dropped; other missing cells get
the fitted fill; a categorical value outside the federated vocabulary becomes "(other)". The
result holds no NaN or infinity (checked: :class:`PreprocessError`).

What the sites (and, through the ServerApp's events, the portal) receive gives no exact count
back (issue 9, finding 5; ADR 0036). A statistic computed from exact counts does: a missing
indicator's mean ``missing / rows`` is a fraction whose continued-fraction expansion gives the
pooled rows, and less one's own site's rows, another site's. So:

- **count-type statistics** — the mean and std of a 0/1 model column (one-hot, missing
  indicator), the counts behind a federated median, the label counts — are computed from each
  site's counts as released (``contract.released``, the profile's rule as a number): a function of
  what researchers already see;
- **value-type statistics** — a numeric or date feature's mean fill, its quantile grid, its
  column's mean and std, a regression target's — are rounded to a power of two of 2–4 standard
  errors (:func:`released_moments`): a sum of integer values (an integer or date column) over
  its cells is a fraction too, and after the rounding every total its released counts allow is
  consistent with it. Standardisation needs only a consistent affine map, and a fill within a
  few standard errors of the pooled mean is as good as the mean.

Pooled combination of ``(n, mean, M2)``: Chan, Golub & LeVeque (1979), as ``task.combine_sums``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from frp_flwr.contract import (
    DesignStats,
    FeatureSummary,
    JobSpec,
    SitePreparation,
    SiteQuantiles,
    SiteSummary,
    released,
)

#: The one-hot column of values outside the federated vocabulary (rare or unseen ones).
OTHER = "(other)"
#: Points of the quantile grid for a federated median (resolution 2·std / (points − 1)).
GRID_POINTS = 513
#: A value-type statistic's rounding step is the power of two at or above this many standard
#: errors (std / √rows): see :func:`released_moments`.
STANDARD_ERRORS = 2


class PreprocessError(ValueError):
    """The data cannot be prepared as the job asks; the message names the feature."""


# ---------------------------------------------------------------------------------------------
# The site's rows
# ---------------------------------------------------------------------------------------------


@dataclass
class SiteFrame:
    """A site's rows that have a target value, as the plans see them.

    ``values[name]``: ``float64`` with NaN for missing (numeric and date features; a date as days
    since 1970-01-01) or ``object`` with ``None`` for missing (categorical, values as text);
    ``y``: label keys (``str``, classification) or ``float64`` (regression); ``train``/``test``:
    row indices of the split; ``rows``: the dataset's rows, ``target_missing`` those dropped for
    a missing target.
    """

    values: dict[str, np.ndarray]
    y: np.ndarray
    train: np.ndarray
    test: np.ndarray
    rows: int
    target_missing: int


def label_key(value) -> str:
    """A label or category as text: ``3.0`` → ``"3"``, ``True`` → ``"true"``."""
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _missing_mask(column: np.ndarray) -> np.ndarray:
    if column.dtype.kind == "f":
        return np.isnan(column)
    if column.dtype.kind == "M":
        return np.isnat(column)
    return np.array([v is None for v in column.tolist()], dtype=bool)


def _as_kind(column: np.ndarray, kind: str, name: str) -> np.ndarray:
    """A loader column (``sandbox.loader.Table``) as the plan's kind (see :class:`SiteFrame`)."""
    if kind == "categorical":
        out = np.empty(len(column), dtype=object)
        if column.dtype.kind == "M":
            out[:] = [None if np.isnat(v) else str(v) for v in column]
        else:
            out[:] = [
                None if v is None or (isinstance(v, float) and math.isnan(v)) else label_key(v)
                for v in column.tolist()
            ]
        return out
    if column.dtype.kind == "M":
        if kind != "date":
            raise PreprocessError(f"feature {name!r} is a date: choose kind 'date' or leave it out")
        days = column.astype("datetime64[D]").astype(np.float64)
        days[np.isnat(column)] = np.nan
        return days
    if kind == "date":
        raise PreprocessError(f"feature {name!r} is not a date column")
    if column.dtype.kind == "f":
        return column.astype(np.float64, copy=False)
    values = column.tolist()
    if all(v is None or isinstance(v, bool) for v in values):  # bool as 0/1
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    raise PreprocessError(f"feature {name!r} is text: choose kind 'categorical' for it")


def site_frame(
    columns: dict[str, np.ndarray], spec: JobSpec, *, test_fraction: float, seed: int
) -> SiteFrame:
    """Build the :class:`SiteFrame` of one site from its loaded columns (target and features).

    Rows without a target are left out (counted). The split is stratified by label for
    classification (``stratified_split``), a seeded permutation for regression; the same
    ``seed`` and rows give the same split at every call. Raises ``PreprocessError``.
    """
    target = columns[spec.target]
    rows = len(target)
    keep = ~_missing_mask(target)
    if spec.task == "regression":
        if target.dtype.kind != "f":
            raise PreprocessError(f"target {spec.target!r} is not numeric: not a regression")
        y = target[keep].astype(np.float64)
    else:
        y = np.array([label_key(v) for v in target[keep].tolist()], dtype=object)
    values = {
        name: _as_kind(columns[name][keep], spec.plan(name).kind, name) for name in spec.features
    }
    if spec.task == "regression":
        train, test = random_split(len(y), test_fraction=test_fraction, seed=seed)
    else:
        train, test = stratified_split(y, test_fraction=test_fraction, seed=seed)
    return SiteFrame(values, y, train, test, rows, int(rows - keep.sum()))


def stratified_split(
    y: np.ndarray, *, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split: per class, a seeded permutation, ``test_fraction`` held out.

    Returns ``(train_idx, test_idx)``, disjoint sorted int arrays covering ``range(len(y))``.
    """
    rng = np.random.default_rng(seed)
    train, test = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
    for label in sorted(set(y.tolist()), key=str):
        idx = np.flatnonzero(y == label)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def random_split(n: int, *, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic split of ``n`` rows by a seeded permutation (regression)."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    return np.sort(order[n_test:]), np.sort(order[:n_test])


# ---------------------------------------------------------------------------------------------
# 1. Summary
# ---------------------------------------------------------------------------------------------


def _sums(x: np.ndarray) -> tuple[int, float, float]:
    if len(x) == 0:
        return 0, 0.0, 0.0
    mean = float(x.mean())
    return len(x), mean, float(np.square(x - mean).sum())


def site_summary(frame: SiteFrame, spec: JobSpec) -> SiteSummary:
    """Step 1 (module doc): the site's aggregates over its training rows."""
    features = {}
    for name in spec.features:
        column = frame.values[name][frame.train]
        missing = _missing_mask(column)
        if spec.plan(name).kind == "categorical":
            counts: dict[str, int] = {}
            for v in column[~missing].tolist():
                counts[v] = counts.get(v, 0) + 1
            frequent = {v: c for v, c in counts.items() if c > spec.small_count}
            other = sum(counts.values()) - sum(frequent.values())
            features[name] = FeatureSummary(
                missing=int(missing.sum()), categories=frequent, other=other
            )
        else:
            n, mean, m2 = _sums(column[~missing])
            features[name] = FeatureSummary(missing=int(missing.sum()), n=n, mean=mean, m2=m2)
    labels: dict[str, int] = {}
    if spec.task == "classification":
        for v in frame.y.tolist():
            labels[v] = labels.get(v, 0) + 1
    return SiteSummary(
        rows=frame.rows, target_missing=frame.target_missing, labels=labels, features=features
    )


def _combine(parts: list[tuple[int, float, float]]) -> tuple[int, float, float]:
    """Pooled ``(n, mean, M2)`` (Chan, Golub & LeVeque 1979)."""
    n, mean, m2 = 0, 0.0, 0.0
    for n_b, mean_b, m2_b in parts:
        if n_b == 0:
            continue
        total = n + n_b
        delta = mean_b - mean
        mean += delta * n_b / total
        m2 += m2_b + delta * delta * n * n_b / total
        n = total
    return n, mean, m2


def released_rows(counts) -> int:
    """The sum of ``counts`` (ints ≥ 0) as released: ``Σ contract.released(n)``."""
    return sum(released(int(n)) for n in counts)


def released_moments(mean: float, std: float, rows: int) -> tuple[float, float]:
    """A value-type column's pooled ``(mean, std)`` (its units) as the fitted preprocessing gives
    them out: both rounded to the nearest multiple of ``step``, the power of two in
    ``[2, 4)`` standard errors ``std / √rows``, ``rows`` the cells' released total
    (:func:`released_rows`); the std to at least one step. A constant column (``std == 0``) or no
    rows: unchanged.

    Why this hides the cells' count: an integer column's exact mean ``S / n`` gives ``n`` back
    (``Fraction(mean).limit_denominator()``, or trying each ``n`` its released count allows). A
    column on a lattice of spacing ``q`` that is not constant has ``M2 ≥ q²(n − 1)/n``, so
    ``step ≥ 2·std/√rows`` makes the interval of sums that round to the published mean at least
    ``n' · step ≈ 2√M2 ≥ q`` wide for every total ``n'`` near the released one: each holds a
    lattice sum, and the mean rules none out. Not covered: a column in which only a few cells
    differ from the rest (its std says how few; the profile's std at 3 significant figures says
    as much).
    """
    if not (std > 0 and rows > 0 and math.isfinite(mean) and math.isfinite(std)):
        return mean, std
    step = 2.0 ** math.ceil(math.log2(STANDARD_ERRORS * std / math.sqrt(rows)))
    return round(mean / step) * step, max(round(std / step), 1) * step


# ---------------------------------------------------------------------------------------------
# 2. Quantiles (federated median)
# ---------------------------------------------------------------------------------------------


def quantile_grids(spec: JobSpec, summaries: list[SiteSummary]) -> dict[str, list[float]]:
    """The grid of each "median" feature: ``GRID_POINTS`` points over pooled ``mean ± std``
    (:func:`released_moments`: the grid is sent to every site)."""
    grids = {}
    for name in spec.features:
        plan = spec.plan(name)
        if plan.kind == "categorical" or plan.missing != "median":
            continue
        parts = [_feature_sums(s, name) for s in summaries]
        n, mean, m2 = _combine(parts)
        if n == 0:
            continue
        mean, std = released_moments(mean, math.sqrt(m2 / n), released_rows(p[0] for p in parts))
        grids[name] = (
            [mean] if std == 0 else np.linspace(mean - std, mean + std, GRID_POINTS).tolist()
        )
    return grids


def _feature_sums(summary: SiteSummary, name: str) -> tuple[int, float, float]:
    f = summary.features.get(name, FeatureSummary())
    return f.n, f.mean, f.m2


def site_quantiles(frame: SiteFrame, grids: dict[str, list[float]]) -> SiteQuantiles:
    """Step 2 (module doc): per feature, training cells ``<=`` each grid point."""
    out = {}
    for name, grid in grids.items():
        column = frame.values[name][frame.train]
        observed = np.sort(column[~np.isnan(column)])
        out[name] = np.searchsorted(observed, np.asarray(grid), side="right").tolist()
    return SiteQuantiles(features=out)


def median_from_counts(grid: list[float], counts: list[int], n: int) -> float:
    """The pooled median from pooled cumulative ``counts`` at ``grid`` (``n`` values in all),
    linearly interpolated within the grid step where the count reaches ``n / 2``. :func:`fit`
    passes the sums of the sites' released counts: the interpolation's share ``(n/2 − low) /
    (high − low)`` of exact counts would be a fraction of counts in the fill."""
    half = n / 2
    k = int(np.searchsorted(np.asarray(counts), half, side="left"))
    if k == 0 or len(grid) == 1:
        return float(grid[0])
    if k >= len(grid):
        return float(grid[-1])
    low, high = counts[k - 1], counts[k]
    share = 0.0 if high == low else (half - low) / (high - low)
    return float(grid[k - 1] + share * (grid[k] - grid[k - 1]))


# ---------------------------------------------------------------------------------------------
# Fitting (ServerApp) and the fitted rules (sent to every site in each message's config)
# ---------------------------------------------------------------------------------------------


@dataclass
class FittedFeature:
    """One feature's fitted rule: ``fill`` (``None`` when rows are dropped), ``vocabulary``
    (categorical: the values held by more than ``small_count`` rows at some site, sorted)."""

    name: str
    kind: str
    missing: str
    indicator: bool
    fill: float | str | None = None
    vocabulary: list[str] = field(default_factory=list)

    def columns(self) -> list[str]:
        """This feature's model columns."""
        if self.kind == "categorical":
            cols = [f"{self.name}={v}" for v in self.vocabulary] + [f"{self.name}={OTHER}"]
        else:
            cols = [self.name]
        return cols + ([f"{self.name} (missing)"] if self.indicator else [])

    def column_kinds(self) -> list[str]:
        """Per model column (as :meth:`columns`): ``"count"`` for a 0/1 column (one-hot, missing
        indicator), whose mean is a share of the rows, ``"value"`` for the feature's values."""
        width = len(self.vocabulary) + 1 if self.kind == "categorical" else 1
        kind = "count" if self.kind == "categorical" else "value"
        return [kind] * width + (["count"] if self.indicator else [])


@dataclass
class Fitted:
    """The fitted preprocessing of a job (JSON in the ``preprocess`` config of every message).

    ``mean``/``std``: per model column, for standardisation (empty until step 3);
    ``target_mean``/``target_std``: regression only (the target is standardised for SGD and
    predictions mapped back to its units).
    """

    task: str
    classes: list[str]
    features: list[FittedFeature]
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    target_mean: float = 0.0
    target_std: float = 1.0
    notes: list[str] = field(default_factory=list)

    def columns(self) -> list[str]:
        return [c for f in self.features for c in f.columns()]

    def column_kinds(self) -> list[str]:
        """``"count"`` or ``"value"`` per model column (:meth:`FittedFeature.column_kinds`)."""
        return [k for f in self.features for k in f.column_kinds()]

    def to_text(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_text(cls, text: str) -> Fitted:
        raw = json.loads(text)
        raw["features"] = [FittedFeature(**f) for f in raw["features"]]
        return cls(**raw)

    def fills(self) -> dict[str, str]:
        """Feature → how its missing cells are handled, as text (for the job page)."""
        out = {}
        for f in self.features:
            if f.missing == "drop":
                text = "rows dropped"
            elif f.kind == "categorical":
                text = f"most frequent: {f.fill!r}"
            else:
                text = f"{f.missing}: {_sig(f.fill)}"
                if f.kind == "date":
                    text += " (days since 1970-01-01)"
            out[f.name] = text + (" + missing indicator" if f.indicator else "")
        return out


def _sig(x) -> str:
    return f"{float(x):.4g}"


def fit(
    spec: JobSpec,
    summaries: list[SiteSummary],
    classes: list[str],
    quantiles: list[SiteQuantiles] | None = None,
    grids: dict[str, list[float]] | None = None,
) -> Fitted:
    """Steps 1–2 (module doc): fills and vocabularies from the sites' aggregates.

    A "mean" fill is the pooled mean as :func:`released_moments` gives it out, a "median" fill
    the median of the sums of the sites' released cumulative counts (``contract.released``), a
    "most_frequent" one the value with the most rows (a name, no count). A numeric or date
    feature with no value at any site, or a categorical one with no value, is left out with a
    note. Raises ``PreprocessError`` when no feature is left, or a "median" feature has no
    quantiles at a site.
    """
    features, notes = [], []
    for name in spec.features:
        plan = spec.plan(name)
        parts = [s.features.get(name, FeatureSummary()) for s in summaries]
        fitted = FittedFeature(name, plan.kind, plan.missing, plan.indicator)
        if plan.kind == "categorical":
            totals: dict[str, int] = {}
            for part in parts:
                for value, count in part.categories.items():
                    totals[value] = totals.get(value, 0) + count
            if not totals and not any(p.other for p in parts):
                notes.append(f"{name}: no value at any site; left out")
                continue
            fitted.vocabulary = sorted(totals)
            if any(p.other for p in parts):
                notes.append(
                    f"{name}: values held by {spec.small_count} or fewer rows at a site are "
                    f"merged into {OTHER!r}"
                )
            if plan.missing == "most_frequent":
                fitted.fill = min(totals, key=lambda v: (-totals[v], v)) if totals else OTHER
        else:
            n, mean, m2 = _combine([(p.n, p.mean, p.m2) for p in parts])
            if n == 0:
                notes.append(f"{name}: no value at any site; left out")
                continue
            cells = released_rows(p.n for p in parts)
            if plan.missing == "mean":
                fitted.fill = released_moments(mean, math.sqrt(m2 / n), cells)[0]
            elif plan.missing == "median":
                grid = (grids or {}).get(name)
                if grid is None or not quantiles:
                    raise PreprocessError(f"feature {name!r}: no quantiles for its median")
                pooled = np.sum(
                    [[released(c) for c in q.features[name]] for q in quantiles], axis=0
                ).tolist()
                fitted.fill = median_from_counts(grid, pooled, cells)
        features.append(fitted)
    if not features:
        raise PreprocessError("no feature has a value at any site")
    return Fitted(task=spec.task, classes=classes, features=features, notes=notes)


def standardise_from(fitted: Fitted, stats: list[DesignStats]) -> None:
    """Step 3 (module doc): set ``fitted.mean``/``std`` (one per model column) and, for
    regression, ``target_mean``/``target_std`` from the sites' design statistics.

    A count column's (:meth:`Fitted.column_kinds`) mean is ``p = Σ released(ones) / Σ
    released(rows)`` over the sites (a site's ones read back from its mean × rows), its std
    ``√(p(1 − p))``; a value column's (and the target's) are the pooled mean and population std
    as :func:`released_moments` gives them out (rows: the released training rows). A std of 0
    becomes 1. Raises ``PreprocessError`` when a site's statistics have the wrong width or no
    site has a training row.
    """
    width = len(fitted.columns())
    kinds = fitted.column_kinds()
    parts = [s for s in stats if s.num_examples > 0]
    for s in parts:
        if len(s.mean) != width or len(s.m2) != width:
            raise PreprocessError("a site's design statistics have the wrong width")
    if not parts:
        raise PreprocessError("no training rows at any site after preparing the data")
    rows = released_rows(s.num_examples for s in parts)
    mean, std = np.zeros(width), np.ones(width)
    for j, kind in enumerate(kinds):
        if kind == "count":
            ones = [min(max(round(s.mean[j] * s.num_examples), 0), s.num_examples) for s in parts]
            p = released_rows(ones) / rows
            mean[j], std[j] = p, math.sqrt(p * (1 - p))
        else:
            n, m, m2 = _combine([(s.num_examples, s.mean[j], s.m2[j]) for s in parts])
            mean[j], std[j] = released_moments(m, math.sqrt(m2 / n), rows)
    std[std == 0] = 1.0
    fitted.mean, fitted.std = mean.tolist(), std.tolist()
    if fitted.task == "regression":
        tn, tmean, tm2 = _combine([(s.target_n, s.target_mean, s.target_m2) for s in stats])
        if tn and tm2 > 0:
            fitted.target_mean, fitted.target_std = released_moments(
                tmean, math.sqrt(tm2 / tn), released_rows(s.target_n for s in stats)
            )
        else:
            fitted.target_mean, fitted.target_std = tmean, 1.0


# ---------------------------------------------------------------------------------------------
# 3. The model matrix
# ---------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A part (train or test) of a site's rows, ready for the model: ``X`` (n, d) standardised
    when ``fitted`` has statistics, ``y`` class indices (int64) or the target (float64, in target
    units), ``dropped`` rows left out, ``imputed`` cells per feature."""

    X: np.ndarray
    y: np.ndarray
    dropped: int
    imputed: dict[str, int]


def transform(frame: SiteFrame, fitted: Fitted, part: str, *, standardise: bool = True) -> Prepared:
    """The ``part`` (``"train"`` or ``"test"``) rows of ``frame`` under ``fitted`` (module doc).

    Rows whose label is not among ``fitted.classes`` (a label held by at most ``small_count``
    rows at every site: never named, ServerApp) are dropped with the rows a ``drop`` rule drops.
    Raises ``PreprocessError`` for a non-finite result.
    """
    rows = frame.train if part == "train" else frame.test
    n = len(rows)
    blocks, drop, imputed = [], np.zeros(n, dtype=bool), {}
    if fitted.task == "classification":
        named = set(fitted.classes)
        drop |= np.array([v not in named for v in frame.y[rows].tolist()], dtype=bool)
    for f in fitted.features:
        column = frame.values[f.name][rows]
        missing = _missing_mask(column)
        if f.missing == "drop":
            drop |= missing
        if f.kind == "categorical":
            filled = np.where(missing, f.fill if f.fill is not None else OTHER, column)
            index = {v: i for i, v in enumerate(f.vocabulary)}
            other = len(f.vocabulary)
            codes = np.array([index.get(v, other) for v in filled.tolist()], dtype=np.int64)
            block = np.zeros((n, other + 1))
            block[np.arange(n), codes] = 1.0
        else:
            block = np.where(missing, f.fill if f.fill is not None else 0.0, column)[:, None]
        blocks.append(block)
        if f.indicator:
            blocks.append(missing.astype(np.float64)[:, None])
        imputed[f.name] = 0 if f.missing == "drop" else int(missing.sum())
    keep = ~drop
    if drop.any():
        for f in fitted.features:
            if f.missing != "drop":
                imputed[f.name] = int((_missing_mask(frame.values[f.name][rows]) & keep).sum())
    X = np.hstack(blocks)[keep] if blocks else np.zeros((int(keep.sum()), 0))
    if standardise and fitted.mean:
        X = (X - np.asarray(fitted.mean)) / np.asarray(fitted.std)
    if not np.isfinite(X).all():
        bad = [
            c for c, ok in zip(fitted.columns(), np.isfinite(X).all(axis=0), strict=True) if not ok
        ]
        raise PreprocessError(f"column(s) {bad[:5]} are not finite after preparing the data")
    y_part = frame.y[rows][keep]
    if fitted.task == "classification":
        index = {c: i for i, c in enumerate(fitted.classes)}
        try:
            y = np.array([index[v] for v in y_part.tolist()], dtype=np.int64)
        except KeyError as exc:
            raise PreprocessError(f"label {exc.args[0]!r} is not among the job's classes") from None
    else:
        y = y_part.astype(np.float64)
    return Prepared(X, y, int(drop.sum()), imputed)


def design_stats(frame: SiteFrame, fitted: Fitted) -> DesignStats:
    """Step 3 (module doc): the site's training matrix summarised, and what it did to its rows."""
    train = transform(frame, fitted, "train", standardise=False)
    test = transform(frame, fitted, "test", standardise=False)
    n = len(train.y)
    mean = train.X.mean(axis=0) if n else np.zeros(train.X.shape[1])
    m2 = np.square(train.X - mean).sum(axis=0) if n else np.zeros(train.X.shape[1])
    labels: dict[str, int] = {}
    target = (0, 0.0, 0.0)
    if fitted.task == "classification":
        for i in train.y.tolist():
            labels[fitted.classes[i]] = labels.get(fitted.classes[i], 0) + 1
    else:
        target = _sums(train.y)
    return DesignStats(
        num_examples=n,
        mean=mean.tolist(),
        m2=m2.tolist(),
        labels=labels,
        target_n=target[0],
        target_mean=target[1],
        target_m2=target[2],
        preparation=SitePreparation(
            rows=frame.rows,
            dropped_target=frame.target_missing,
            dropped_rows=train.dropped + test.dropped,
            train_rows=n,
            test_rows=len(test.y),
            imputed={k: train.imputed[k] + test.imputed[k] for k in train.imputed},
        ),
    )
