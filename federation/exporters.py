"""Exporters: a job's final model as a scikit-learn estimator a researcher loads with ``skops``
(issue 14, point 6; ADR 0026). No Django here.

Registry: ``EXPORTERS`` maps a job's model kind (``FederatedJob.model``: ``logreg``, ``linear`` …)
to a function ``export(model: ExportInput) -> sklearn estimator``. A helper that adds a model kind
registers its own with :func:`register_exporter` (for example in its own module, imported by
``federation.apps``); a kind with no exporter is offered as the JSON weights only, and the model
card says so.

The linear exporter (:func:`linear_pipeline`) returns a ``sklearn.pipeline.Pipeline`` that runs on
the **raw columns** (a 2-D array, one column per ``features`` entry in that order; numbers for
numeric and date features — dates as days since 1970-01-01 —, text for categorical ones; missing
cells ``NaN`` / ``None``):

1. a ``ColumnTransformer`` applying the job's fitted preprocessing (``frp_flwr.preprocess``):
   per numeric feature ``SimpleImputer(constant=fill, add_indicator=...)``; per categorical one
   ``SimpleImputer(constant=fill)`` → ``OneHotEncoder(categories=[vocabulary + [(other)]],
   handle_unknown="infrequent_if_exist")`` so a value outside the vocabulary lands in the
   ``(other)`` column, as in the federation;
2. ``StandardScaler`` with the federated mean and standard deviation;
3. ``LogisticRegression`` (softmax; binary: the difference of the two logits, which gives the same
   probabilities) or ``LinearRegression`` with the weights mapped back to the target's units.

Every step is fitted on a few synthetic rows (so scikit-learn's fitted state is complete) and then
given the federation's values, so ``pipeline.predict_proba(raw)`` equals the federation's
``task.predict_proba(weights, transform(raw))``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from frp_flwr.preprocess import OTHER


class ExportError(Exception):
    """The model cannot be exported as an estimator; the message says why (shown on the page)."""


@dataclass
class ExportInput:
    """What an exporter gets: ``task`` (``classification``/``regression``), ``classes`` (label
    keys, index = output), ``weights`` (the final model's layers as nested lists),
    ``preprocessing`` (``preprocess.Fitted`` as a dict: ``features``, ``mean``, ``std``,
    ``target_mean``, ``target_std``)."""

    task: str
    classes: list[str]
    weights: list
    preprocessing: dict
    extra: dict = field(default_factory=dict)


Exporter = Callable[[ExportInput], object]
EXPORTERS: dict[str, Exporter] = {}


def register_exporter(*kinds: str) -> Callable[[Exporter], Exporter]:
    """Decorator: ``export`` builds the estimator of every model kind in ``kinds``."""

    def deco(fn: Exporter) -> Exporter:
        for kind in kinds:
            EXPORTERS[kind] = fn
        return fn

    return deco


def export(kind: str, model: ExportInput):
    """The estimator of a ``kind`` model. Raises ``ExportError`` for a kind with no exporter or
    a model its exporter cannot represent."""
    exporter = EXPORTERS.get(kind)
    if exporter is None:
        raise ExportError(f"no exporter for {kind!r} models: download the weights as JSON")
    return exporter(model)


def _feature_step(index: int, feature: dict):
    """(name, transformer, [column index]) of one fitted feature (module doc, step 1)."""
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    name, kind = feature["name"], feature["kind"]
    indicator = bool(feature.get("indicator"))
    fill = feature.get("fill")
    if kind == "categorical":
        vocabulary = [str(v) for v in feature.get("vocabulary") or []]
        if not vocabulary:
            raise ExportError(f"categorical feature {name!r} has no vocabulary to encode")
        if indicator:
            raise ExportError(
                f"categorical feature {name!r} has a missing indicator; not exportable yet"
            )
        steps = make_pipeline(
            SimpleImputer(
                missing_values=None,
                strategy="constant",
                fill_value=OTHER if fill is None else str(fill),
            ),
            OneHotEncoder(
                categories=[[*vocabulary, OTHER]],
                handle_unknown="infrequent_if_exist",
                min_frequency=3,
                sparse_output=False,
            ),
        )
        return (f"f{index}", steps, [index])
    imputer = SimpleImputer(
        missing_values=np.nan,
        strategy="constant",
        fill_value=0.0 if fill is None else float(fill),
        add_indicator=indicator,
    )
    return (f"f{index}", imputer, [index])


def _synthetic(features: list[dict]) -> np.ndarray:
    """Rows that fit step 1 to the federation's rules (``ColumnTransformer`` refits clones): per
    categorical feature each vocabulary value 3 times or more and ``(other)`` once — the one
    infrequent category, whose column comes last as in the federation and takes unknown values —;
    per numeric feature zeros and one ``NaN`` (so a missing indicator is made)."""
    vocabularies = [f.get("vocabulary") or [] for f in features if f["kind"] == "categorical"]
    n = 3 * max((len(v) for v in vocabularies), default=1) + 1
    table = np.empty((n, len(features)), dtype=object)
    for i, f in enumerate(features):
        if f["kind"] == "categorical":
            vocabulary = [str(v) for v in f.get("vocabulary") or []]
            values = [v for v in vocabulary for _ in range(3)]
            values += [vocabulary[0]] * (n - 1 - len(values)) + [OTHER]
            table[:, i] = values
        else:
            table[:, i] = [np.nan] + [0.0] * (n - 1)
    return table


@register_exporter("logreg", "linear")
def linear_pipeline(model: ExportInput):
    """The linear model's ``Pipeline`` on raw columns (module doc). Raises ``ExportError``."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    pre = model.preprocessing
    features = pre.get("features") or []
    if not features:
        raise ExportError("the model has no features")
    W = np.asarray(model.weights[0], dtype=np.float64)
    b = np.asarray(model.weights[1], dtype=np.float64)
    columns = ColumnTransformer(
        [_feature_step(i, f) for i, f in enumerate(features)], remainder="drop"
    )
    design = columns.fit(_synthetic(features)).transform(_synthetic(features))
    d = design.shape[1]
    if W.shape[0] != d:
        raise ExportError(f"the weights have {W.shape[0]} inputs, the preprocessing gives {d}")
    mean = np.asarray(pre.get("mean") or np.zeros(d), dtype=np.float64)
    std = np.asarray(pre.get("std") or np.ones(d), dtype=np.float64)
    scaler = StandardScaler().fit(design.astype(np.float64))
    scaler.mean_, scaler.scale_, scaler.var_ = mean, std, std**2
    X0 = np.zeros((2, d))
    if model.task == "regression":
        scale, shift = float(pre.get("target_std", 1.0)), float(pre.get("target_mean", 0.0))
        head = LinearRegression().fit(X0, [0.0, 1.0])
        head.coef_ = W[:, 0] * scale
        head.intercept_ = float(b[0] * scale + shift)
    else:
        classes = list(model.classes)
        if W.shape[1] != len(classes) or len(classes) < 2:
            raise ExportError(f"{W.shape[1]} outputs for {len(classes)} classes")
        X0 = np.zeros((len(classes), d))
        head = LogisticRegression().fit(X0 + np.eye(len(classes), d), classes)
        if len(classes) == 2:  # softmax of two logits = sigmoid of their difference
            head.coef_ = (W[:, 1] - W[:, 0])[None, :]
            head.intercept_ = np.array([b[1] - b[0]])
        else:
            head.coef_ = W.T.copy()
            head.intercept_ = b.copy()
        head.classes_ = np.array(classes, dtype=object)
    return Pipeline([("preprocess", columns), ("standardise", scaler), ("model", head)])
