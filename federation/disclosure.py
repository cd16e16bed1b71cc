"""A job's metrics as a viewer who may not see the sites' row counts may see them (issue 9).

Researchers see a site's row counts under the profile's rule (``sandbox.profile.safe_count``);
a site's own data stewards see them exact (ADR 0036). A metric that is a fraction over row
counts — an accuracy is correct rows over held-out rows, a balanced accuracy a mean of correct
rows over each class's rows — gives those counts back at full precision: the continued-fraction
expansion of 0.982456… gives 112/114 where the page shows "≈115". So, for everyone who may not
see the counts exact, a fraction over rows is snapped to the grid of the smallest counts the
released ones allow (``sandbox.profile.released_fraction``: at most half a held-out row), and
a mean of measured values (a loss, an RMSE, R²) is given to 3 significant figures
(``sandbox.profile.released_measure``). Which counts a metric is a fraction over:

* ``accuracy``, ``eval_accuracy`` and the majority-class baseline: the held-out rows (of the
  site, or of every site for a pooled metric);
* ``balanced_accuracy``, ``macro_f1``, ``roc_auc``: each class's held-out rows (the confusion
  matrices' row sums); the class with the fewest, summed over the sites, sets the grid, and a
  class of "≤7" rows suppresses these metrics (``None``);
* ``log_loss``, ``eval_loss``, ``train_loss``, ``rmse``, ``mae``, ``r2``, ``roc_auc_bound``:
  measured values.

ADR 0036's amendment gives the argument and its limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sandbox.profile import SMALL_COUNT, released_floor, released_fraction, released_measure

#: Fractions over the held-out rows.
ROW_FRACTIONS = frozenset({"accuracy", "eval_accuracy"})
#: Fractions over each class's held-out rows.
CLASS_FRACTIONS = frozenset({"balanced_accuracy", "macro_f1", "roc_auc"})
#: Means of measured values.
MEASURES = frozenset(
    {"log_loss", "eval_loss", "train_loss", "loss", "rmse", "mae", "r2", "roc_auc_bound"}
)


def class_counts(confusion) -> list[int]:
    """Each true class's held-out rows (``list[int]``): the row sums of a confusion matrix
    (rows: true class); ``[]`` when there is none or it is not a matrix of counts."""
    if not isinstance(confusion, list):
        return []
    out = []
    for row in confusion:
        if not isinstance(row, list) or not all(isinstance(c, int) for c in row):
            return []
        out.append(sum(row))
    return out


def site_held_out(sites, *, last: dict | None = None) -> list[int]:
    """Each site's held-out rows in the final evaluation (``JobSite.final_metrics``), else — when
    no site reported one — in its last round (``last``: ``{job site id: SiteRoundMetric}``):
    what a pooled held-out total is the sum of."""
    final = [
        int(js.final_metrics["eval_examples"])
        for js in sites
        if isinstance((js.final_metrics or {}).get("eval_examples"), int)
    ]
    if final or last is None:
        return final
    return [m.eval_examples for m in last.values() if m is not None and m.ok]


def site_classes(job_sites) -> list[list[int]]:
    """Each job site's held-out rows per class (:func:`class_counts` of the confusion matrix in
    its ``final_metrics``), for the sites that reported one."""
    out = []
    for js in job_sites:
        counts = class_counts(((js.final_metrics or {}).get("metrics") or {}).get("confusion"))
        if counts:
            out.append(counts)
    return out


def class_fraction(value, per_site_classes: Sequence[Sequence[int]], rows: Iterable[int]):
    """A fraction over each class's rows (balanced accuracy, macro-F1, ROC AUC) as released:
    snapped to the grid of the class whose rows, released and summed over the sites
    (``per_site_classes``: one list of class counts per site, in the job's class order), are
    fewest; classes no site holds are skipped. Without class counts, the grid of ``rows``."""
    sites = [list(c) for c in per_site_classes if c]
    if not sites or len({len(c) for c in sites}) != 1:
        return released_fraction(value, list(rows))
    classes = [[site[i] for site in sites] for i in range(len(sites[0]))]
    present = [c for c in classes if sum(c)]
    if not present:
        return None
    fewest = min(present, key=lambda c: sum(released_floor(n) for n in c))
    return released_fraction(value, fewest)


def metric_shown(key: str, value, *, rows: Iterable[int], classes=(), exact: bool):
    """One metric ``key``'s ``value`` as the viewer sees it: as it is when ``exact`` (a steward
    of every site it is computed over) or not a number; else by the rule of the module doc over
    ``rows`` (held-out rows per site) and ``classes`` (class counts per site)."""
    if exact or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if key in ROW_FRACTIONS:
        return released_fraction(value, list(rows))
    if key in CLASS_FRACTIONS:
        return class_fraction(value, classes, rows)
    if key in MEASURES:
        return released_measure(value)
    return value


def metrics_released(metrics, *, rows: Iterable[int], classes=(), exact: bool):
    """A ``Metrics`` document (or any dict of metrics) with each metric as :func:`metric_shown`
    gives it; other keys (``examples``, ``confusion``) as they are. Not a dict: as it is."""
    if not isinstance(metrics, dict) or exact:
        return metrics
    rows = list(rows)
    return {
        k: metric_shown(k, v, rows=rows, classes=classes, exact=False) for k, v in metrics.items()
    }


def baseline_released(baseline, *, rows: Iterable[int], exact: bool):
    """The baseline document (``{"name", "metric", "value", "model", "better"}``) with ``value``
    and ``model`` as figures of its ``metric`` (accuracy: a fraction over the pooled held-out
    rows; rmse: a measure)."""
    if not isinstance(baseline, dict) or exact:
        return baseline
    key = baseline.get("metric") or "accuracy"
    rows = list(rows)
    return {
        **baseline,
        **{
            k: metric_shown(key, baseline.get(k), rows=rows, exact=False)
            for k in ("value", "model")
            if k in baseline
        },
    }


def small_site(contribution) -> bool:
    """Whether a site of the posted contribution document evaluated on 1–7 held-out rows (they
    show as "≤7"): a coalition's utility, the median of the sites' accuracies, may be one of
    that site's, which says its count, so no utility can be released (:func:`site_fraction`
    gives ``None``)."""
    examples = (contribution or {}).get("examples") if isinstance(contribution, dict) else None
    if not isinstance(examples, dict):
        return False
    return any(isinstance(n, int) and 0 < n <= SMALL_COUNT for n in examples.values())


def site_fraction(value, site_rows: Iterable[int]):
    """A fraction over one site's held-out rows where which site is not said (a coalition's
    utility: the median over the sites of its model's accuracy, ADR 0024), snapped to the grid
    of the site whose released rows are fewest, so that it holds for every site's counts."""
    counts = [int(n) for n in site_rows]
    if not counts:
        return None
    return released_fraction(value, min(counts, key=released_floor))


def contribution_released(contribution, *, exact: bool, site_rows: Iterable[int] = ()):
    """The posted contribution document (``{"utilities": {round: {coalition: float}},
    "disagreement": {site: float}, "examples": {site: held-out rows}, …}``) with each coalition
    utility and disagreement as :func:`site_fraction` gives it over the sites' held-out rows (its
    own ``examples``, else ``site_rows``; with neither, as it is). A utility is ``None`` where a
    site's held-out rows show as "≤7" (:func:`small_site`)."""
    if not isinstance(contribution, dict) or exact:
        return contribution
    examples = contribution.get("examples")
    rows = (
        [n for n in examples.values() if isinstance(n, int) and n > 0]
        if isinstance(examples, dict) and examples
        else list(site_rows)
    )
    if not rows:  # no held-out counts to release them over (never so for the ServerApp's)
        return contribution
    out = dict(contribution)
    if isinstance(out.get("utilities"), dict):
        out["utilities"] = {
            rnd: (
                {k: site_fraction(v, rows) for k, v in table.items()}
                if isinstance(table, dict)
                else table
            )
            for rnd, table in out["utilities"].items()
        }
    if isinstance(out.get("disagreement"), dict):
        out["disagreement"] = {k: site_fraction(v, rows) for k, v in out["disagreement"].items()}
    return out
