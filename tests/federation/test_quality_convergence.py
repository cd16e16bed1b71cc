"""The wine job of test_quality_integration.py, in process: the app's own preprocessing and
training functions on the same cells, against scikit-learn on the pooled rows (issue 10).

Why the integration test's settings are what they are. The held-out set is 36 rows (each 0.028
of accuracy), so "≥ 0.98 of centralised" means no row wrong that the centralised model gets
right. The centralised model is the same model with the same objective: softmax regression
with the app's L2 penalty (``LogisticRegression(C = 1 / (L2_PENALTY · n_train))``) on the same
splits and the same preprocessing (``SimpleImputer(median, add_indicator)``, ``StandardScaler``).
Its optimum is also computed on the app's own design matrix, so the federated model's distance
from it is measured as a number (the penalised mean cross-entropy, nats), not as one row more or
less: 8 rounds of 5 epochs at 0.1 (the settings before) stop 0.116 above it and missed a
borderline held-out row (ratio 0.971) under the exact standardisation; 10 rounds of 20 epochs at
0.3 come within 0.019 and miss none that the centralised model gets right. Since the sites
receive the standardisation rounded to a few standard errors (issue 9, finding 5) the short run
stops 0.119 above the optimum and the borderline row happens to land right (ratio 1.0), the long
one comes within 0.020: the distance, not one row, is what the settings are chosen by. The
optimum itself is 0.005: the classes are nearly separable, so the weights grow slowly towards it
and more local work keeps closing the gap. The integration test now does that work in 4 rounds
of 100 epochs at 0.5 (within 0.015 here): each round costs every site a ClientApp process.

FedAvg here is the app's ``fedavg_delta`` over all sites (the example-weighted mean the
ServerApp's Flower ``FedAvg`` takes); each site trains with ``train_sgd`` seeded by the round,
as the ClientApp does.
"""

from __future__ import annotations

import numpy as np
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from frp_flwr import contract, preprocess
from frp_flwr.task import (
    L2_PENALTY,
    RoundLog,
    centralised_c,
    fedavg_delta,
    init_params,
    predict_proba,
    sort_classes,
    train_sgd,
)
from tests.federation.wine_sites import (
    LEARNING_RATE,
    LOCAL_EPOCHS,
    ROUNDS,
    TARGET,
    feature_names,
    site_columns,
)

TEST_FRACTION, SPLIT_SEED = contract.RunConfig.test_fraction, contract.RunConfig.split_seed


def _world():
    """The sites' frames, the fitted preprocessing and the prepared train/test parts."""
    names = feature_names()
    columns = site_columns()
    spec = contract.JobSpec(
        sites={s: contract.SitePointer("k", "d", 1) for s in columns},
        target=TARGET,
        features=names,
        plans=[contract.FeaturePlan(name=n, missing="median", indicator=True) for n in names],
    )
    sites = sorted(columns)
    frames = {
        s: preprocess.site_frame(columns[s], spec, test_fraction=TEST_FRACTION, seed=SPLIT_SEED)
        for s in sites
    }
    summaries = [preprocess.site_summary(frames[s], spec) for s in sites]
    classes = sort_classes({c for s in summaries for c in s.labels})
    grids = preprocess.quantile_grids(spec, summaries)
    quantiles = [preprocess.site_quantiles(frames[s], grids) for s in sites]
    fitted = preprocess.fit(spec, summaries, classes, quantiles, grids)
    preprocess.standardise_from(fitted, [preprocess.design_stats(frames[s], fitted) for s in sites])
    train = [preprocess.transform(frames[s], fitted, "train") for s in sites]
    test = [preprocess.transform(frames[s], fitted, "test") for s in sites]
    return names, frames, sites, classes, train, test


def _fedavg(train, classes, *, rounds, epochs, learning_rate):
    params = init_params(train[0].X.shape[1], len(classes))
    for rnd in range(1, rounds + 1):
        updates, examples = {}, {}
        for i, part in enumerate(train):
            updates[i], _ = train_sgd(
                params,
                part.X,
                part.y,
                epochs=epochs,
                learning_rate=learning_rate,
                batch_size=contract.RunConfig.batch_size,
                seed=rnd,
            )
            examples[i] = len(part.y)
        step = fedavg_delta(RoundLog(params, updates, examples), frozenset(updates))
        params = [p + d for p, d in zip(params, step, strict=True)]
    return params


def _objective(params, X, y) -> float:
    """Mean cross-entropy (nats) plus L2_PENALTY·‖W‖²/2: what ``train_sgd`` minimises."""
    p = predict_proba(params, X)
    return float(
        -np.log(p[np.arange(len(y)), y]).mean() + L2_PENALTY * np.square(params[0]).sum() / 2
    )


def _pooled(parts):
    return np.vstack([p.X for p in parts]), np.concatenate([p.y for p in parts])


def _centralised_accuracy(names, frames, sites) -> tuple[float, int]:
    """scikit-learn's pipeline on the raw pooled rows, same splits: accuracy and test rows."""

    def rows(part):
        X = [
            np.column_stack([frames[s].values[f] for f in names])[getattr(frames[s], part)]
            for s in sites
        ]
        y = [frames[s].y[getattr(frames[s], part)] for s in sites]
        return np.vstack(X), np.concatenate(y).astype(str)

    (X_train, y_train), (X_test, y_test) = rows("train"), rows("test")
    model = make_pipeline(
        SimpleImputer(strategy="median", add_indicator=True),
        StandardScaler(),
        LogisticRegression(C=centralised_c(len(y_train)), max_iter=10_000),
    ).fit(X_train, y_train)
    return float((model.predict(X_test) == y_test).mean()), len(y_test)


def _optimum(train) -> float:
    """The objective's minimum on the app's own design matrix (scikit-learn, lbfgs, tight)."""
    X, y = _pooled(train)
    model = LogisticRegression(C=centralised_c(len(y)), max_iter=10_000, tol=1e-10).fit(X, y)
    return _objective([model.coef_.T, model.intercept_], X, y)


def _federated(train, test, classes, **settings) -> tuple[float, float]:
    """The federated model's pooled held-out accuracy and its training objective."""
    params = _fedavg(train, classes, **settings)
    X, y = _pooled(test)
    accuracy = float((predict_proba(params, X).argmax(axis=1) == y).mean())
    return accuracy, _objective(params, *_pooled(train))


def test_the_integration_settings_reach_the_centralised_accuracy_and_the_optimum():
    names, frames, sites, classes, train, test = _world()
    centralised, test_rows = _centralised_accuracy(names, frames, sites)
    accuracy, objective = _federated(
        train, test, classes, rounds=ROUNDS, epochs=LOCAL_EPOCHS, learning_rate=LEARNING_RATE
    )
    assert test_rows == 36
    assert accuracy >= 0.98 * centralised
    assert objective - _optimum(train) < 0.025  # nats; the optimum is 0.005 (nearly separable)


def test_eight_rounds_of_five_epochs_stop_far_from_the_optimum():
    """The cause of the 0.971 ratio measured before: training stopped early, not the data. (Its
    one borderline row is no longer missed since the standardisation is the released one, module
    doc; the distance from the optimum is what stays.)"""
    names, frames, sites, classes, train, test = _world()
    _, objective = _federated(train, test, classes, rounds=8, epochs=5, learning_rate=0.1)
    assert objective - _optimum(train) > 0.1  # nats
