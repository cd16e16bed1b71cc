"""The job page's results card shows the pooled ROC AUC's error bound (issue 10, point 5)."""

from __future__ import annotations

import re

from django.template.loader import render_to_string


def _results(bound):
    return {
        "task": "classification",
        "metrics": [
            {"key": "accuracy", "label": "Accuracy", "pooled": 0.7, "bound": None, "sites": [0.7]},
            {"key": "roc_auc", "label": "ROC AUC", "pooled": 0.71, "bound": bound, "sites": [0.7]},
        ],
        "site_names": ["a"],
        "confusion": {"pooled": None, "sites": []},
        "baseline": None,
        "below_baseline": False,
        "preparation": None,
    }


def test_the_pooled_auc_is_shown_with_its_bound_and_the_rule_is_stated():
    page = render_to_string("federation/partials/job_results.html", {"results": _results(0.0021)})
    shown = re.search(r'data-bound="roc_auc">([^<]*)<', page).group(1)
    assert shown.strip() == "± 0.0021"
    assert "1000 equal bins" in page and "each site's own pairs of rows exactly" in page
    assert 'data-bound="accuracy"' not in page


def test_an_exact_pooled_auc_has_no_bound_shown():
    page = render_to_string("federation/partials/job_results.html", {"results": _results(0.0)})
    assert "data-bound" not in page
