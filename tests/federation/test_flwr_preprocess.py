"""Federated preprocessing and metrics of the Flower App against scikit-learn on pooled data.

The independent source is scikit-learn on the pooled rows (``SimpleImputer``, ``StandardScaler``,
``sklearn.metrics``); the federated side sees only what each site sends (its aggregates).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn import metrics as skm
from sklearn.impute import SimpleImputer
from sklearn.preprocessing import StandardScaler

from frp_flwr import contract, preprocess
from frp_flwr.metrics import baseline, pooled_metrics, roc_auc, site_metrics, site_report


def _spec(features, plans=(), task="classification", sites=("a", "b", "c")) -> contract.JobSpec:
    return contract.JobSpec(
        sites={s: contract.SitePointer(store_key="k", dataset="d", version=1) for s in sites},
        target="y",
        features=list(features),
        plans=[contract.FeaturePlan(**p) for p in plans],
        task=task,
    )


def _site_columns(rng, n, *, shift=0.0, missing=0.0, colours=("red", "blue", "green")):
    x = rng.normal(10 + shift, 3, n)
    z = rng.exponential(2, n)  # skewed: median ≠ mean
    colour = rng.choice(colours, n, p=None).astype(object)
    x[rng.random(n) < missing] = np.nan
    z[rng.random(n) < missing] = np.nan
    colour[rng.random(n) < missing] = None
    y = np.where(np.nan_to_num(x, nan=10) + rng.normal(0, 1, n) > 10 + shift, "yes", "no")
    return {"x": x, "z": z, "colour": colour, "y": y.astype(object)}


def _federate(spec, frames):
    """What the ServerApp does with the sites' replies, through their JSON records."""

    def roundtrip(reply, cls):
        return cls.from_record(contract.json_record(reply))

    summaries = [roundtrip(preprocess.site_summary(f, spec), contract.SiteSummary) for f in frames]
    classes = sorted({c for s in summaries for c in s.labels})
    grids = preprocess.quantile_grids(spec, summaries)
    quantiles = [
        roundtrip(
            preprocess.site_quantiles(f, json.loads(json.dumps(grids))), contract.SiteQuantiles
        )
        for f in frames
    ]
    fitted = preprocess.fit(spec, summaries, classes, quantiles, grids)
    fitted = preprocess.Fitted.from_text(fitted.to_text())  # as every site receives it
    stats = [roundtrip(preprocess.design_stats(f, fitted), contract.DesignStats) for f in frames]
    preprocess.standardise_from(fitted, stats)
    return fitted, stats, summaries


def test_imputation_and_standardisation_follow_sklearn_to_within_the_released_precision():
    """Fills and standardisation as scikit-learn fits them on the pooled training rows, to within
    what the sites may receive (issue 9, finding 5): a value column's mean and std rounded to a
    power of two under 4 standard errors, a missing indicator's share of the released rows, a
    median from released counts (each site's off by at most 2.5 rows)."""
    rng = np.random.default_rng(0)
    plans = [
        {"name": "x", "kind": "numeric", "missing": "mean", "indicator": True},
        {"name": "z", "kind": "numeric", "missing": "median", "indicator": False},
    ]
    spec = _spec(["x", "z"], plans)
    frames = [
        preprocess.site_frame(
            _site_columns(rng, n, shift=s, missing=m), spec, test_fraction=0.25, seed=1
        )
        for n, s, m in ((300, 0.0, 0.1), (200, 2.0, 0.0), (150, -1.0, 0.3))
    ]
    fitted, stats, _ = _federate(spec, frames)
    pooled_x = np.concatenate([f.values["x"][f.train] for f in frames])
    pooled_z = np.concatenate([f.values["z"][f.train] for f in frames])
    observed_x = [int((~np.isnan(f.values["x"][f.train])).sum()) for f in frames]

    mean_fill = SimpleImputer(strategy="mean").fit(pooled_x[:, None]).statistics_[0]
    assert abs(fitted.features[0].fill - mean_fill) < 2 * np.nanstd(pooled_x) / np.sqrt(
        preprocess.released_rows(observed_x)
    )
    z = np.sort(pooled_z[~np.isnan(pooled_z)])
    grid_step = 2 * 1.5 * z.std() / (preprocess.GRID_POINTS - 1)
    slack = 3 * 2.5 + 3 * 1.25  # rows: the released cumulative counts and the released half
    low, high = z[int(len(z) / 2 - slack)], z[int(len(z) / 2 + slack)]
    assert low - grid_step <= fitted.features[1].fill <= high + grid_step

    raw = np.vstack([preprocess.transform(f, fitted, "train", standardise=False).X for f in frames])
    scaler = StandardScaler().fit(raw)
    rows = preprocess.released_rows(len(f.train) for f in frames)
    for j in (0, 2):  # x and z: value columns
        assert abs(fitted.mean[j] - scaler.mean_[j]) < 2 * scaler.scale_[j] / np.sqrt(rows)
        assert abs(fitted.std[j] - scaler.scale_[j]) < 2 * scaler.scale_[j] / np.sqrt(rows)
    missing = [int(np.isnan(f.values["x"][f.train]).sum()) for f in frames]
    p = preprocess.released_rows(missing) / rows
    assert (fitted.mean[1], fitted.std[1]) == (p, np.sqrt(p * (1 - p)))
    assert abs(p - scaler.mean_[1]) < 0.01
    X = np.vstack([preprocess.transform(f, fitted, "train").X for f in frames])
    assert np.isfinite(X).all()
    np.testing.assert_allclose(X, (raw - fitted.mean) / fitted.std, atol=1e-12)
    assert np.abs(X.mean(axis=0)).max() < 0.1 and np.abs(X.std(axis=0) - 1).max() < 0.1
    # x (mean) + its indicator + z; the indicator is 1 exactly where x was missing.
    assert fitted.columns() == ["x", "x (missing)", "z"]
    np.testing.assert_array_equal(raw[:, 1], np.isnan(pooled_x))
    # Each site says what it did: its imputed cells, nothing dropped.
    first = stats[0].preparation
    assert first.imputed["x"] == int(np.isnan(frames[0].values["x"]).sum())
    assert first.dropped_rows == 0
    assert first.train_rows + first.test_rows == first.rows


def test_drop_rule_drops_the_rows_and_says_how_many():
    rng = np.random.default_rng(1)
    spec = _spec(["x"], [{"name": "x", "kind": "numeric", "missing": "drop", "indicator": False}])
    frames = [
        preprocess.site_frame(_site_columns(rng, 120, missing=0.2), spec, test_fraction=0.2, seed=3)
        for _ in range(2)
    ]
    fitted, stats, _ = _federate(spec, frames)
    for frame, st in zip(frames, stats, strict=True):
        missing = np.isnan(frame.values["x"])
        assert st.preparation.dropped_rows == int(missing.sum()) > 0
        assert st.preparation.train_rows == int((~missing[frame.train]).sum())
        assert st.preparation.imputed == {"x": 0}
        assert np.isfinite(preprocess.transform(frame, fitted, "test").X).all()


def test_rows_without_a_target_are_dropped_and_counted():
    columns = {
        "x": np.array([1.0, 2.0, 3.0, 4.0]),
        "y": np.array(["a", None, "b", "a"], dtype=object),
    }
    frame = preprocess.site_frame(columns, _spec(["x"]), test_fraction=0.25, seed=0)
    assert (frame.rows, frame.target_missing, len(frame.y)) == (4, 1, 3)


def test_categories_are_one_hot_over_the_federated_vocabulary_and_rare_ones_never_named():
    rng = np.random.default_rng(2)
    plan = {"name": "colour", "kind": "categorical", "missing": "most_frequent", "indicator": False}
    spec = _spec(["colour"], [plan])
    common = _site_columns(rng, 200, missing=0.1)
    rare = _site_columns(rng, 200)
    rare["colour"][:5] = "mauve"  # 5 rows: at or under the small-count threshold at its site
    only_b = _site_columns(rng, 100, colours=("red", "teal"))
    frames = [
        preprocess.site_frame(c, spec, test_fraction=0.2, seed=0) for c in (common, rare, only_b)
    ]
    fitted, _, summaries = _federate(spec, frames)

    assert all("mauve" not in s.features["colour"].categories for s in summaries)
    assert summaries[1].features["colour"].other == int(
        (frames[1].values["colour"][frames[1].train] == "mauve").sum()
    )
    assert fitted.features[0].vocabulary == ["blue", "green", "red", "teal"]
    assert fitted.columns()[-1] == "colour=(other)"
    assert any("merged into '(other)'" in n for n in fitted.notes)
    pooled = np.concatenate([f.values["colour"][f.train] for f in frames]).astype(object)
    present = [v for v in pooled.tolist() if v is not None]
    assert fitted.features[0].fill == max(set(present), key=present.count)
    raw = preprocess.transform(frames[1], fitted, "train", standardise=False).X
    mauve = frames[1].values["colour"][frames[1].train] == "mauve"
    assert (raw[mauve, -1] == 1).all() and (raw.sum(axis=1) == 1).all()


def test_pooled_classification_metrics_match_sklearn_on_the_pooled_predictions():
    rng = np.random.default_rng(3)
    parts = []
    for n in (80, 120, 60):
        y = rng.integers(0, 3, n)
        logits = rng.normal(0, 1, (n, 3)) + 2.0 * np.eye(3)[y]
        proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        parts.append((y, proba))
    reports = [
        contract.EvalReport.from_record(
            contract.json_record(site_report("classification", y=y, proba=p, num_classes=3))
        )
        for y, p in parts
    ]
    pooled = pooled_metrics("classification", reports)
    y = np.concatenate([p[0] for p in parts])
    proba = np.vstack([p[1] for p in parts])
    pred = proba.argmax(axis=1)
    assert pooled.accuracy == pytest.approx(skm.accuracy_score(y, pred), abs=1e-12)
    assert pooled.balanced_accuracy == pytest.approx(
        skm.balanced_accuracy_score(y, pred), abs=1e-12
    )
    assert pooled.macro_f1 == pytest.approx(skm.f1_score(y, pred, average="macro"), abs=1e-12)
    assert pooled.log_loss == pytest.approx(skm.log_loss(y, proba, labels=[0, 1, 2]), abs=1e-9)
    assert pooled.confusion == skm.confusion_matrix(y, pred, labels=[0, 1, 2]).tolist()
    assert pooled.roc_auc is None  # three classes
    first = site_metrics("classification", reports[0])
    assert first.accuracy == pytest.approx(skm.accuracy_score(parts[0][0], parts[0][1].argmax(1)))
    classes = ["0", "1", "2"]
    base = baseline(
        "classification", reports, pooled, classes=classes, train_labels={"0": 5, "2": 9, "1": 2}
    )
    assert base.value == pytest.approx((y == 2).mean())
    assert base.better and base.model == pooled.accuracy


def test_a_single_class_site_keeps_sklearn_definitions():
    y = np.zeros(20, dtype=np.int64)
    proba = np.tile([0.3, 0.7], (20, 1))  # always predicts class 1: recall 0, F1 0
    m = site_metrics(
        "classification", site_report("classification", y=y, proba=proba, num_classes=2)
    )
    pred = proba.argmax(axis=1)
    assert m.balanced_accuracy == skm.balanced_accuracy_score(y, pred) == 0.0
    assert m.macro_f1 == pytest.approx(skm.f1_score(y, pred, average="macro", zero_division=0))
    assert m.roc_auc is None


def test_binary_auc_exact_at_a_site_and_pooled_from_histograms():
    rng = np.random.default_rng(4)
    parts = []
    for n in (150, 90):
        y = rng.integers(0, 2, n)
        p1 = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1).round(3)  # ties on purpose
        parts.append((y, np.column_stack([1 - p1, p1])))
    reports = [site_report("classification", y=y, proba=p, num_classes=2) for y, p in parts]
    for (y, p), report in zip(parts, reports, strict=True):
        assert report.roc_auc == pytest.approx(skm.roc_auc_score(y, p[:, 1]), abs=1e-12)
        assert roc_auc(p[:, 1], y == 1) == pytest.approx(skm.roc_auc_score(y, p[:, 1]))
    pooled = pooled_metrics("classification", reports)
    y = np.concatenate([a for a, _ in parts])
    p1 = np.concatenate([b[:, 1] for _, b in parts])
    exact = skm.roc_auc_score(y, p1)
    # Scores on a 0.001 grid: rows of two sites often share a bin, so the bound is not 0 …
    assert 0 < pooled.roc_auc_bound < 2e-3
    # … and the pooled value is within it of scikit-learn's on the pooled scores.
    assert abs(pooled.roc_auc - exact) <= pooled.roc_auc_bound + 1e-12


def test_pooled_auc_is_exact_when_no_two_sites_share_a_bin():
    """Each site's own pairs are counted exactly, ties within a site included; across sites the
    histograms are exact when rows of different sites never share a bin: the bound is 0."""
    rng = np.random.default_rng(11)
    parts = []
    for lo in (0.0, 0.5):  # site a scores in [0, 0.5), site b in [0.5, 1)
        y = rng.integers(0, 2, 200)
        p1 = lo + 0.5 * rng.random(200) ** (2 - y) * 0.999
        p1[:20] = lo + 0.25  # ties within one site's bin
        parts.append((y, np.column_stack([1 - p1, p1])))
    reports = [site_report("classification", y=y, proba=p, num_classes=2) for y, p in parts]
    pooled = pooled_metrics("classification", reports)
    y = np.concatenate([a for a, _ in parts])
    p1 = np.concatenate([b[:, 1] for _, b in parts])
    assert pooled.roc_auc_bound == 0.0
    assert pooled.roc_auc == pytest.approx(skm.roc_auc_score(y, p1), abs=1e-12)


def test_pooled_auc_bound_is_reached_by_cross_site_ties():
    """Two sites, one row each in one bin: the histograms cannot tell their order; the exact
    AUC is 1 or 0 and the pooled value is ½ with a bound of ½."""
    up = [(np.array([1]), np.array([[0.4995, 0.5005]])), (np.array([0]), np.array([[0.5, 0.5]]))]
    reports = [site_report("classification", y=y, proba=p, num_classes=2) for y, p in up]
    pooled = pooled_metrics("classification", reports)
    assert (pooled.roc_auc, pooled.roc_auc_bound) == (0.5, 0.5)
    assert abs(pooled.roc_auc - skm.roc_auc_score([1, 0], [0.5005, 0.5])) <= pooled.roc_auc_bound


def test_pooled_regression_metrics_and_mean_baseline_match_sklearn():
    rng = np.random.default_rng(5)
    parts = [(rng.normal(100, 20, n), None) for n in (50, 70, 30)]
    parts = [(y, y + rng.normal(0, 5, len(y))) for y, _ in parts]
    reports = [site_report("regression", y=y, pred=p, baseline_mean=98.0) for y, p in parts]
    pooled = pooled_metrics("regression", reports)
    y = np.concatenate([a for a, _ in parts])
    pred = np.concatenate([b for _, b in parts])
    assert pooled.rmse == pytest.approx(np.sqrt(skm.mean_squared_error(y, pred)), rel=1e-12)
    assert pooled.mae == pytest.approx(skm.mean_absolute_error(y, pred), rel=1e-12)
    assert pooled.r2 == pytest.approx(skm.r2_score(y, pred), rel=1e-9)
    site = site_metrics("regression", reports[1])
    assert site.r2 == pytest.approx(skm.r2_score(*parts[1]), rel=1e-9)
    base = baseline("regression", reports, pooled, classes=[], train_labels={})
    assert base.value == pytest.approx(np.sqrt(np.mean((y - 98.0) ** 2)))
    assert base.better
