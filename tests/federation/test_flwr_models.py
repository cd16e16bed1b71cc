"""The model registry (``frp_flwr.models``): the MLP's gradients against finite differences, its
training against scikit-learn's MLPClassifier on pooled data, FedProx's term, the linear model as
today's, and the validation of model specs (ADR 0022)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from frp_flwr import models, task
from frp_flwr.contract import ContractError, JobSpec


def _numeric_grads(model, params, X, y, *, task_, seed=None, anchor=None, mu=0.0, eps=1e-6):
    """Central differences of ``model.loss_and_grads``'s loss (same dropout masks each call)."""

    def loss(ps):
        rng = None if seed is None else np.random.default_rng(seed)
        return model.loss_and_grads(ps, X, y, task=task_, rng=rng, anchor=anchor, mu=mu)[0]

    grads = []
    for j, layer in enumerate(params):
        g = np.zeros_like(layer)
        for idx in np.ndindex(layer.shape):
            up = [p.copy() for p in params]
            down = [p.copy() for p in params]
            up[j][idx] += eps
            down[j][idx] -= eps
            g[idx] = (loss(up) - loss(down)) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize(
    ("activation", "task_", "dropout", "mu"),
    [
        ("relu", "classification", 0.0, 0.0),
        ("tanh", "classification", 0.0, 0.5),
        ("tanh", "regression", 0.0, 0.0),
        ("relu", "regression", 0.3, 0.2),
        ("tanh", "classification", 0.4, 0.0),
    ],
)
def test_mlp_gradients_match_finite_differences(activation, task_, dropout, mu):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(17, 4))
    y = rng.normal(size=17) if task_ == "regression" else rng.integers(0, 3, 17)
    model = models.model_for(
        {"kind": "mlp", "hidden": [5, 3], "activation": activation, "dropout": dropout, "l2": 0.01}
    )
    params = model.init_params(4, 1 if task_ == "regression" else 3, seed=1)
    params = [p + rng.normal(scale=0.1, size=p.shape) for p in params]  # non-zero biases
    anchor = [p + rng.normal(scale=0.3, size=p.shape) for p in params] if mu else None
    seed = 11 if dropout else None

    _, grads = model.loss_and_grads(
        params,
        X,
        y,
        task=task_,
        rng=None if seed is None else np.random.default_rng(seed),
        anchor=anchor,
        mu=mu,
    )
    numeric = _numeric_grads(model, params, X, y, task_=task_, seed=seed, anchor=anchor, mu=mu)

    for g, n in zip(grads, numeric, strict=True):
        np.testing.assert_allclose(g, n, rtol=1e-5, atol=1e-7)


def test_mlp_training_reaches_sklearn_mlpclassifier_on_pooled_data():
    X, y = load_breast_cancer(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_tr)
    X_tr, X_te = scaler.transform(X_tr), scaler.transform(X_te)
    reference = MLPClassifier(
        hidden_layer_sizes=(16,),
        solver="sgd",
        learning_rate_init=0.05,
        batch_size=32,
        momentum=0.0,
        alpha=1e-4,
        max_iter=60,
        random_state=0,
    ).fit(X_tr, y_tr)
    model = models.model_for({"kind": "mlp", "hidden": [16]})

    params, train_loss = model.train(
        model.init_params(X.shape[1], 2, seed=0),
        X_tr,
        y_tr,
        epochs=60,
        learning_rate=0.05,
        batch_size=32,
        seed=0,
        task="classification",
    )

    _, acc = models.loss_and_accuracy(model, params, X_te, y_te)
    assert acc >= reference.score(X_te, y_te) - 0.02
    assert train_loss < 0.1  # it fits: cross-entropy of the training data, nats


def test_mlp_learns_a_problem_no_linear_model_can():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(400, 2))
    y = (X[:, 0] * X[:, 1] > 0).astype(np.int64)  # XOR quadrants
    mlp = models.model_for({"kind": "mlp", "hidden": [16], "activation": "tanh"})
    linear = models.model_for(None)
    kw = dict(epochs=200, learning_rate=0.1, batch_size=32, seed=0, task="classification")

    mlp_params, _ = mlp.train(mlp.init_params(2, 2, seed=0), X, y, **kw)
    lin_params, _ = linear.train(linear.init_params(2, 2), X, y, **kw)

    assert models.loss_and_accuracy(mlp, mlp_params, X, y)[1] > 0.95
    assert models.loss_and_accuracy(linear, lin_params, X, y)[1] < 0.7


def test_linear_model_is_todays_softmax_regression():
    X, y = load_wine(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    linear = models.model_for({"kind": "linear"})
    kw = dict(epochs=3, learning_rate=0.1, batch_size=16, seed=4, task="classification")

    ours, loss = linear.train(linear.init_params(13, 3), X, y, **kw)
    today, today_loss = task.train_sgd(task.init_params(13, 3), X, y, **kw)

    for a, b in zip(ours, today, strict=True):
        np.testing.assert_array_equal(a, b)
    assert loss == today_loss
    np.testing.assert_allclose(
        models.predict_proba(linear, ours, X), task.predict_proba(today, X), rtol=1e-12
    )


def test_fedprox_term_in_linear_training_matches_hand_computation():
    # Full-batch gradient descent on half the squared error, two steps, l2 = 0:
    # w ← w − lr·(Xᵀ(Xw + b − y)/n + μ(w − w0)), b ← b − lr·(mean(Xw + b − y) + μ(b − b0)).
    X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    y = np.array([1.0, -1.0, 0.5])
    w0, b0 = np.array([[0.2], [-0.1]]), np.array([0.3])
    lr, mu = 0.1, 2.0
    w, b = w0.copy(), b0.copy()
    for _ in range(2):
        r = X @ w + b - y[:, None]
        w, b = w - lr * (X.T @ r / 3 + mu * (w - w0)), b - lr * (r.mean(axis=0) + mu * (b - b0))

    (W, B), _ = task.train_sgd(
        [w0, b0], X, y, epochs=2, learning_rate=lr, batch_size=3, seed=0, l2=0.0,
        task="regression", mu=mu,
    )  # fmt: skip

    np.testing.assert_allclose(W, w, rtol=1e-12)
    np.testing.assert_allclose(B, b, rtol=1e-12)


def test_fedprox_mu_keeps_the_mlp_near_the_global_model():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(60, 3)), rng.integers(0, 2, 60)
    model = models.model_for({"kind": "mlp", "hidden": [8]})
    start = model.init_params(3, 2, seed=0)
    kw = dict(epochs=20, learning_rate=0.1, batch_size=10, seed=0, task="classification")

    free, _ = model.train(start, X, y, **kw)
    held, _ = model.train(start, X, y, mu=5.0, **kw)

    def distance(ps):
        return np.sqrt(sum(np.sum((p - s) ** 2) for p, s in zip(ps, start, strict=True)))

    assert distance(held) < 0.5 * distance(free)


def test_mlp_initial_weights_are_seeded_and_shaped():
    model = models.model_for({"kind": "mlp", "hidden": [6, 4]})

    a, b = model.init_params(5, 3, seed=7), model.init_params(5, 3, seed=7)

    assert [p.shape for p in a] == [(5, 6), (6,), (6, 4), (4,), (4, 3), (3,)]
    for x, z in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, z)
    assert not np.array_equal(a[0], model.init_params(5, 3, seed=8)[0])


def test_read_model_spec_fills_defaults():
    assert models.read_model_spec({"kind": "linear"}) == {"kind": "linear"}
    assert models.read_model_spec({"kind": "mlp"}) == {
        "kind": "mlp",
        "hidden": [32],
        "activation": "relu",
        "dropout": 0.0,
        "l2": 1e-4,
    }


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"kind": "forest"}, "model.kind"),
        ({"kind": "mlp", "hidden": []}, "model.hidden"),
        ({"kind": "mlp", "hidden": [0]}, "model.hidden[0]"),
        ({"kind": "mlp", "hidden": [8, 8, 8, 8, 8]}, "model.hidden"),
        ({"kind": "mlp", "hidden": [2.5]}, "model.hidden[0]"),
        ({"kind": "mlp", "activation": "sigmoid"}, "model.activation"),
        ({"kind": "mlp", "dropout": 0.95}, "model.dropout"),
        ({"kind": "mlp", "dropout": float("nan")}, "model.dropout"),
        ({"kind": "mlp", "width": 3}, "model: unknown"),
        ({"kind": "linear", "hidden": [3]}, "model: unknown"),
        ([], "model: expected"),
    ],
)
def test_read_model_spec_refuses_bad_values_naming_the_field(raw, where):
    with pytest.raises(models.ModelSpecError, match=where.replace("[", r"\[").replace("]", r"\]")):
        models.read_model_spec(raw)


def _spec(**extra) -> str:
    base = {
        "sites": {"a": {"store_key": "k", "dataset": "d", "version": 1}},
        "target": "y",
    }
    return json.dumps({**base, **extra})


def test_job_spec_without_model_or_strategy_means_linear_and_fedavg():
    spec = JobSpec.from_json(_spec())

    assert spec.model == {"kind": "linear"}
    assert spec.strategy == {"name": "fedavg"}


def test_job_spec_round_trips_model_and_strategy_complete():
    spec = JobSpec.from_json(
        _spec(model={"kind": "mlp", "hidden": [8, 4]}, strategy={"name": "fedprox", "mu": 0.1})
    )

    again = JobSpec.from_json(spec.to_text())
    assert again.model == {
        "kind": "mlp",
        "hidden": [8, 4],
        "activation": "relu",
        "dropout": 0.0,
        "l2": 1e-4,
    }
    assert again.strategy == {"name": "fedprox", "mu": 0.1}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"model": {"kind": "mlp", "dropout": 2}}, "model.dropout"),
        ({"strategy": {"name": "fedsgd"}}, "strategy.name"),
        ({"strategy": {"name": "fedtrimmedavg", "beta": 0.5}}, "strategy.beta"),
    ],
)
def test_job_spec_refuses_a_bad_model_or_strategy_with_contract_error(extra, message):
    with pytest.raises(ContractError, match=message):
        JobSpec.from_json(_spec(**extra))


def test_describe_model_names_kind_and_hyper_parameters():
    assert models.describe_model({"kind": "linear"}) == "logistic (softmax) regression"
    assert models.describe_model({"kind": "linear"}, task="regression") == "linear regression"
    assert models.describe_model(
        models.read_model_spec({"kind": "mlp", "hidden": [64, 32], "activation": "tanh"})
    ) == ("multilayer perceptron (hidden 64×32, tanh, dropout 0, L2 0.0001)")


@pytest.mark.parametrize(
    "spec",
    [{"kind": "linear"}, {"kind": "mlp", "hidden": [7, 3]}, {"kind": "mlp", "hidden": [5]}],
)
def test_parameter_count_is_the_number_of_numbers_init_params_draws(spec):
    from frp_flwr.models import model_for, parameter_count

    params = model_for(spec).init_params(4, 3)
    assert parameter_count(spec, num_features=4, num_outputs=3) == sum(p.size for p in params)
    assert parameter_count({"kind": "xgboost"}, num_features=4, num_outputs=3) == 0
