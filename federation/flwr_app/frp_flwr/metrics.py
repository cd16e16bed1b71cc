"""Held-out metrics of the final model, at each site and pooled, from the sites' aggregates
(numpy only, no Django).

A site scores the final model on its held-out split and sends only aggregates
(``contract.EvalReport``, built by :func:`site_report`): a confusion matrix, the summed log loss
and a histogram of predicted probabilities (classification), or sums of errors and of the target
(regression). From these the ServerApp computes, with the definitions of scikit-learn's
``sklearn.metrics`` (which the tests use as the independent check):

* accuracy; balanced accuracy (mean recall over the classes present in the true labels);
  macro-F1 (mean of ``2·TP / (2·TP + FP + FN)`` over the classes present in the true or predicted
  labels, 0 for a class never predicted correctly); log loss (mean cross-entropy, nats);
* ROC AUC for two classes: exact at a site (Mann–Whitney U with mid-ranks for ties); pooled
  (:func:`pooled_roc_auc`) from each site's exact U for its own pairs and the sites' probability
  histograms (``AUC_BINS`` equal bins of [0, 1]) for pairs across sites, where two rows in one
  bin count one half. The pooled value is therefore exact but for cross-site pairs that share a
  bin, and its error is at most half their share of all pairs: that bound is computed from the
  same histograms and reported beside it (``Metrics.roc_auc_bound``). An exact cross-site count
  would need the sites to compare their rows' scores with each other (per-row scores leaving a
  site, or a secure comparison protocol); the portal does neither;
* RMSE, MAE and R² (1 − SSE/SST around the evaluated rows' own mean);
* the trivial baseline: the majority class of the pooled training labels, or the pooled training
  mean of the target.
"""

from __future__ import annotations

import math

import numpy as np

from frp_flwr.contract import AUC_BINS, Baseline, EvalReport, Metrics


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Exact ROC AUC of ``scores`` for the boolean labels ``positive`` (mid-ranks for ties);
    ``None`` when one class is absent."""
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid_ranks = ends - (counts - 1) / 2.0  # 1-based average rank of each distinct score
    rank_sum = float(mid_ranks[inverse][positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def site_report(
    task: str,
    *,
    y: np.ndarray,
    proba: np.ndarray | None = None,
    pred: np.ndarray | None = None,
    num_classes: int = 0,
    baseline_mean: float = 0.0,
) -> EvalReport:
    """A site's :class:`EvalReport` of the final model on its held-out rows.

    Classification: ``y`` class indices (n,), ``proba`` (n, C) predicted probabilities.
    Regression: ``y`` and ``pred`` (n,) in target units; ``baseline_mean`` the pooled training
    mean of the target.
    """
    n = len(y)
    if task == "classification":
        predicted = proba.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)
        confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
        np.add.at(confusion, (y, predicted), 1)
        picked = proba[np.arange(n), y] if n else np.zeros(0)
        log_loss_sum = float(-np.log(np.clip(picked, 1e-15, None)).sum())
        report = {"examples": n, "confusion": confusion.tolist(), "log_loss_sum": log_loss_sum}
        if num_classes == 2:
            p1 = proba[:, 1] if n else np.zeros(0)
            positive = y == 1
            bins = np.minimum((p1 * AUC_BINS).astype(np.int64), AUC_BINS - 1)
            report["roc_auc"] = roc_auc(p1, positive)
            report["auc_pos"] = np.bincount(bins[positive], minlength=AUC_BINS).tolist()
            report["auc_neg"] = np.bincount(bins[~positive], minlength=AUC_BINS).tolist()
        return EvalReport(**report)
    err = pred - y
    return EvalReport(
        examples=n,
        sse=float(np.square(err).sum()),
        sae=float(np.abs(err).sum()),
        sum_y=float(y.sum()),
        sum_y2=float(np.square(y).sum()),
        sse_baseline=float(np.square(y - baseline_mean).sum()),
    )


def _classification(confusion: np.ndarray, log_loss_sum: float) -> dict:
    n = int(confusion.sum())
    if n == 0:
        return {"examples": 0, "confusion": confusion.tolist()}
    tp = np.diag(confusion).astype(np.float64)
    true = confusion.sum(axis=1).astype(np.float64)
    predicted = confusion.sum(axis=0).astype(np.float64)
    present = true > 0
    recall = tp[present] / true[present]
    seen = (true + predicted) > 0
    f1 = 2 * tp[seen] / (true[seen] + predicted[seen])
    return {
        "examples": n,
        "accuracy": float(tp.sum() / n),
        "balanced_accuracy": float(recall.mean()),
        "macro_f1": float(f1.mean()),
        "log_loss": log_loss_sum / n,
        "confusion": confusion.tolist(),
    }


def _binned_u(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mann–Whitney U of binned scores: pairs (positive above negative) + ½ pairs in one bin."""
    neg_below = np.concatenate([[0], np.cumsum(neg)[:-1]])
    return float((pos * neg_below + 0.5 * pos * neg).sum())


def pooled_roc_auc(reports: list[EvalReport]) -> tuple[float | None, float | None]:
    """The pooled ROC AUC of binary reports and the bound of its error: ``(auc, bound)``.

    ``U = Σ_i U_ii + Σ_{i≠j} U_ij``: the pairs within site ``i`` come from its exact AUC
    (``U_ii = auc_i · P_i · N_i``, a multiple of ½), the pairs across sites from the histograms
    (``U_hist(pooled) − Σ_i U_hist(i)``), which count a cross-site pair whose two rows share a bin
    as ½. The true AUC differs by at most ``½ · Σ_b (pos_b·neg_b − Σ_i pos_ib·neg_ib) / (P·N)``
    (0 when no positive and negative row of different sites share a bin). ``(None, None)`` when
    the pooled rows lack a class. A site without an exact AUC (one class only) has no pairs of
    its own.
    """
    pos_i = [np.asarray(r.auc_pos or [0] * AUC_BINS, dtype=np.float64) for r in reports]
    neg_i = [np.asarray(r.auc_neg or [0] * AUC_BINS, dtype=np.float64) for r in reports]
    pos, neg = np.sum(pos_i, axis=0), np.sum(neg_i, axis=0)
    pairs = float(pos.sum() * neg.sum())
    if pairs == 0:
        return None, None
    within_exact = within_hist = within_shared = 0.0
    for report, p, n in zip(reports, pos_i, neg_i, strict=True):
        site_pairs = float(p.sum() * n.sum())
        if site_pairs == 0 or report.roc_auc is None:
            continue
        within_exact += round(2.0 * report.roc_auc * site_pairs) / 2.0
        within_hist += _binned_u(p, n)
        within_shared += float((p * n).sum())
    u = within_exact + _binned_u(pos, neg) - within_hist
    shared_across = float((pos * neg).sum()) - within_shared
    return min(1.0, max(0.0, u / pairs)), 0.5 * shared_across / pairs


def _regression(n: int, sse: float, sae: float, sum_y: float, sum_y2: float) -> dict:
    if n == 0:
        return {"examples": 0}
    sst = sum_y2 - sum_y * sum_y / n
    r2 = None if sst <= 1e-12 * max(1.0, sum_y2) else max(-1e15, 1.0 - sse / sst)
    return {"examples": n, "rmse": math.sqrt(sse / n), "mae": sae / n, "r2": r2}


def site_metrics(task: str, report: EvalReport) -> Metrics:
    """The metrics of one site from its report."""
    if task == "classification":
        out = _classification(np.asarray(report.confusion, dtype=np.int64), report.log_loss_sum)
        return Metrics(**out, roc_auc=report.roc_auc)
    return Metrics(
        **_regression(report.examples, report.sse, report.sae, report.sum_y, report.sum_y2)
    )


def pooled_metrics(task: str, reports: list[EvalReport]) -> Metrics:
    """The metrics over every site's held-out rows together (module doc)."""
    if task == "classification":
        confusion = np.sum([np.asarray(r.confusion, dtype=np.int64) for r in reports], axis=0)
        out = _classification(confusion, sum(r.log_loss_sum for r in reports))
        auc = bound = None
        if confusion.shape[0] == 2:
            auc, bound = pooled_roc_auc(reports)
        return Metrics(**out, roc_auc=auc, roc_auc_bound=bound)
    return Metrics(
        **_regression(
            sum(r.examples for r in reports),
            sum(r.sse for r in reports),
            sum(r.sae for r in reports),
            sum(r.sum_y for r in reports),
            sum(r.sum_y2 for r in reports),
        )
    )


def baseline(
    task: str,
    reports: list[EvalReport],
    pooled: Metrics,
    *,
    classes: list[str],
    train_labels: dict[str, int],
) -> Baseline:
    """The trivial model's score on the pooled held-out rows, beside the final model's."""
    if task == "classification":
        majority = min(train_labels, key=lambda c: (-train_labels[c], c)) if train_labels else None
        confusion = np.sum([np.asarray(r.confusion, dtype=np.int64) for r in reports], axis=0)
        n = int(confusion.sum())
        value = None
        if majority is not None and n:
            value = float(confusion[classes.index(majority)].sum() / n)
        model = pooled.accuracy
        better = value is not None and model is not None and model > value + 1e-12
        return Baseline(
            name=f"majority class ({majority})" if majority else "majority class",
            metric="accuracy",
            value=value,
            model=model,
            better=better,
        )
    n = sum(r.examples for r in reports)
    value = math.sqrt(sum(r.sse_baseline for r in reports) / n) if n else None
    model = pooled.rmse
    better = value is not None and model is not None and model < value - 1e-12
    return Baseline(name="training mean", metric="rmse", value=value, model=model, better=better)
