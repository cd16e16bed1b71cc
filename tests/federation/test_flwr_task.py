"""Tests of the Flower App's model and data helpers (``federation/flwr_app/frp_flwr/task.py``).

The app is a standalone Flower App (no Django); it is imported from its own directory. Expected values
come from numpy on pooled data, scikit-learn (reference implementations) or hand computation.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, log_loss
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr import task  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Federated standardisation
# ---------------------------------------------------------------------------------------------


def test_combine_sums_equals_pooled_mean_and_std():
    rng = np.random.default_rng(1)
    sites = [
        rng.normal(loc=[100.0, -3.0, 0.5], scale=[10.0, 0.1, 2.0], size=(n, 3))
        for n in (50, 7, 123)
    ]

    mean, std = task.combine_sums([task.feature_sums(X) for X in sites])

    pooled = np.concatenate(sites)
    np.testing.assert_allclose(mean, pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(std, pooled.std(axis=0, ddof=0), rtol=1e-9)


def test_combine_sums_matches_standard_scaler():
    rng = np.random.default_rng(2)
    a, b = rng.exponential(size=(30, 4)), rng.uniform(-5, 5, size=(70, 4))

    mean, std = task.combine_sums([task.feature_sums(a), task.feature_sums(b)])

    scaler = StandardScaler().fit(np.concatenate([a, b]))
    np.testing.assert_allclose(mean, scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(std, scaler.scale_, rtol=1e-9)


def test_combine_sums_constant_feature_gets_unit_std():
    a = np.array([[1.0, 7.0], [3.0, 7.0]])
    b = np.array([[5.0, 7.0]])

    mean, std = task.combine_sums([task.feature_sums(a), task.feature_sums(b)])

    # by hand: column 0 is 1, 3, 5 → mean 3, population variance (4 + 0 + 4) / 3
    np.testing.assert_allclose(mean, [3.0, 7.0])
    np.testing.assert_allclose(std, [math.sqrt(8 / 3), 1.0])


def test_combine_sums_large_offset_keeps_precision():
    rng = np.random.default_rng(3)
    sites = [1e8 + rng.normal(size=(n, 2)) for n in (40, 60)]

    mean, std = task.combine_sums([task.feature_sums(X) for X in sites])

    pooled = np.concatenate(sites)
    np.testing.assert_allclose(std, pooled.std(axis=0), rtol=1e-6)
    np.testing.assert_allclose(mean, pooled.mean(axis=0), rtol=1e-12)


def test_combine_sums_no_examples_raises():
    empty = np.zeros((0, 2))

    with pytest.raises(ValueError, match="no training examples"):
        task.combine_sums([task.feature_sums(empty), task.feature_sums(empty)])


# ---------------------------------------------------------------------------------------------
# Stratified split
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def labels() -> np.ndarray:
    y = np.array([0] * 37 + [1] * 63 + [2] * 10)
    return np.random.default_rng(7).permutation(y)


def test_stratified_split_is_disjoint_and_covers_all(labels):
    train, test = task.stratified_split(labels, test_fraction=0.25, seed=42)

    assert set(train.tolist()).isdisjoint(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(len(labels)))


def test_stratified_split_same_seed_same_split(labels):
    first = task.stratified_split(labels, test_fraction=0.25, seed=42)
    second = task.stratified_split(labels, test_fraction=0.25, seed=42)

    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


def test_stratified_split_other_seed_other_split(labels):
    _, test_a = task.stratified_split(labels, test_fraction=0.25, seed=42)
    _, test_b = task.stratified_split(labels, test_fraction=0.25, seed=43)

    assert set(test_a.tolist()) != set(test_b.tolist())


@pytest.mark.parametrize("fraction", [0.2, 0.25, 0.5])
def test_stratified_split_keeps_class_proportions_within_one_row(labels, fraction):
    _, test = task.stratified_split(labels, test_fraction=fraction, seed=3)

    per_class = Counter(labels.tolist())
    held_out = Counter(labels[test].tolist())
    for label, n in per_class.items():
        assert abs(held_out[label] - fraction * n) <= 1, (label, held_out[label], fraction * n)


def test_stratified_split_string_labels():
    y = np.array(["benign"] * 8 + ["malignant"] * 4)

    train, test = task.stratified_split(y, test_fraction=0.25, seed=0)

    assert Counter(y[test].tolist()) == {"benign": 2, "malignant": 1}
    assert len(train) == 9


# ---------------------------------------------------------------------------------------------
# Softmax regression
# ---------------------------------------------------------------------------------------------


def test_loss_and_accuracy_two_examples_by_hand():
    # logits z = x·W: example 1 → (ln 3, 0), p = (3/4, 1/4); example 2 → (−ln 3, 0), p = (1/4, 3/4)
    params = [np.array([[1.0, 0.0]]), np.zeros(2)]
    X = np.array([[math.log(3)], [-math.log(3)]])
    y = np.array([0, 0])

    loss, acc = task.loss_and_accuracy(params, X, y)

    # loss = (−ln 3/4 − ln 1/4) / 2 = ln(16/3) / 2; example 1 right, example 2 wrong
    assert loss == pytest.approx(math.log(16 / 3) / 2, rel=1e-12)
    assert acc == 0.5


def test_loss_and_accuracy_zero_params_is_log_of_class_count():
    X = np.random.default_rng(0).normal(size=(10, 4))
    y = np.arange(10) % 3

    loss, _ = task.loss_and_accuracy(task.init_params(4, 3), X, y)

    assert loss == pytest.approx(math.log(3), rel=1e-12)


def test_loss_and_accuracy_matches_sklearn_metrics():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 3))
    y = rng.integers(0, 3, size=40)
    params = [rng.normal(size=(3, 3)), rng.normal(size=3)]

    loss, acc = task.loss_and_accuracy(params, X, y)

    z = X @ params[0] + params[1]
    proba = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    assert loss == pytest.approx(log_loss(y, proba, labels=[0, 1, 2]), rel=1e-9)
    assert acc == pytest.approx(accuracy_score(y, proba.argmax(axis=1)))


def test_loss_and_accuracy_empty_is_zero():
    assert task.loss_and_accuracy(task.init_params(2, 2), np.zeros((0, 2)), np.zeros(0, int)) == (
        0.0,
        0.0,
    )


def test_train_sgd_full_batch_step_follows_numerical_gradient():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(25, 3))
    y = rng.integers(0, 3, size=25)
    W0, b0 = rng.normal(scale=0.3, size=(3, 3)), rng.normal(scale=0.3, size=3)
    lr = 1e-3

    (W1, b1), _ = task.train_sgd(
        [W0, b0], X, y, epochs=1, learning_rate=lr, batch_size=len(y), seed=0, l2=0.0
    )

    def ce(W, b):  # reference: scikit-learn's mean cross-entropy
        z = X @ W + b
        return log_loss(y, np.exp(z) / np.exp(z).sum(axis=1, keepdims=True), labels=[0, 1, 2])

    h = 1e-6
    grad_W = np.zeros_like(W0)
    for i, j in np.ndindex(*W0.shape):
        e = np.zeros_like(W0)
        e[i, j] = h
        grad_W[i, j] = (ce(W0 + e, b0) - ce(W0 - e, b0)) / (2 * h)
    grad_b = np.array([(ce(W0, b0 + h * e) - ce(W0, b0 - h * e)) / (2 * h) for e in np.eye(3)])
    np.testing.assert_allclose((W0 - W1) / lr, grad_W, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose((b0 - b1) / lr, grad_b, rtol=1e-5, atol=1e-7)


def test_train_sgd_does_not_modify_given_params():
    params = task.init_params(2, 2)
    X = np.array([[1.0, 0.0], [0.0, 1.0]])

    task.train_sgd(params, X, np.array([0, 1]), epochs=3, learning_rate=0.5, batch_size=1, seed=0)

    assert not params[0].any() and not params[1].any()


def test_train_sgd_breast_cancer_close_to_sklearn_logistic_regression():
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, stratify=y, random_state=0
    )
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    reference = LogisticRegression(max_iter=5000).fit(X_train, y_train)
    reference_acc = accuracy_score(y_test, reference.predict(X_test))

    params, train_loss = task.train_sgd(
        task.init_params(X.shape[1], 2),
        X_train,
        y_train,
        epochs=20,
        learning_rate=0.1,
        batch_size=32,
        seed=0,
    )

    _, acc = task.loss_and_accuracy(params, X_test, y_test)
    assert abs(acc - reference_acc) <= 0.03, (acc, reference_acc)
    assert train_loss < 0.2 < math.log(2)  # well below the untrained loss of ln 2


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------


def test_encode_labels_maps_to_global_class_indices():
    y = np.array([1.0, 0.0, 2.0, 1.0])  # CSV numbers may arrive as floats

    encoded = task.encode_labels(y, ["0", "1", "2"])

    assert encoded.tolist() == [1, 0, 2, 1]


def test_encode_labels_unknown_label_raises_site_data_error():
    with pytest.raises(task.SiteDataError, match="'maybe'"):
        task.encode_labels(np.array(["yes", "maybe"]), ["no", "yes"])


def test_label_keys_and_sort_classes_numeric_order():
    keys = task.label_keys(np.array([10.0, 2.0, 1.0, 2.0]))

    assert task.sort_classes(set(keys)) == ["1", "2", "10"]
    assert task.sort_classes({"malignant", "benign"}) == ["benign", "malignant"]


# ---------------------------------------------------------------------------------------------
# Job spec and sanitised errors
# ---------------------------------------------------------------------------------------------

SPEC = {
    "sites": {
        "hospital-a": {"store_key": "hospital-a/bc/v1.csv.enc", "dataset": "bc", "version": 1},
        "hospital-b": {"store_key": "hospital-b/bc/v2.csv.enc", "dataset": "bc", "version": 2},
    },
    "target": "diagnosis",
    "features": ["mean_radius"],
    "min_sites": 2,
}


def test_job_spec_from_json_parses_portal_spec():
    spec = task.JobSpec.from_json(json.dumps(SPEC))

    assert spec.target == "diagnosis" and spec.features == ["mean_radius"]
    assert spec.min_sites == 2
    assert spec.sites["hospital-b"] == task.SitePointer("hospital-b/bc/v2.csv.enc", "bc", 2)


@pytest.mark.parametrize(
    "remove",
    [
        ("target",),
        ("sites",),
        ("sites", "hospital-a", "store_key"),
        ("sites", "hospital-b", "version"),
    ],
    ids=["target", "sites", "store_key", "version"],
)
def test_job_spec_from_json_missing_field_raises_value_error(remove):
    raw = json.loads(json.dumps(SPEC))
    holder = raw
    for key in remove[:-1]:
        holder = holder[key]
    del holder[remove[-1]]

    with pytest.raises(ValueError, match="missing"):
        task.JobSpec.from_json(json.dumps(raw))


def test_sanitise_strips_absolute_path():
    message = "cannot read /var/lib/site/keys/hospital-a.kek: permission denied"

    clean = task.sanitise(message)

    assert "/var/lib" not in clean and "hospital-a.kek" not in clean and "keys" not in clean
    assert clean.startswith("cannot read ") and clean.endswith(": permission denied")


def test_sanitise_bounds_length():
    assert len(task.sanitise("x" * 1000)) == 300


# ---------------------------------------------------------------------------------------------
# Contribution: coalition models rebuilt from logged rounds
# ---------------------------------------------------------------------------------------------


def _federated_run(num_rounds: int = 3):
    """A real 3-site FedAvg run with ``train_sgd``; returns (initial, logs, final global weights).

    The final model is computed here with its own FedAvg loop (example-weighted mean of the sites'
    returned weights), independent of ``task.fedavg_delta``.
    """
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    parts = [(X[:120], y[:120]), (X[120:160], y[120:160]), (X[160:400], y[160:400])]
    initial = task.init_params(X.shape[1], 2)
    weights = [a.copy() for a in initial]
    logs = []
    for rnd in range(1, num_rounds + 1):
        updates, counts = {}, {}
        for i, (Xi, yi) in enumerate(parts):
            if rnd == 2 and i == 1:
                continue  # site 1 misses round 2 (timed out)
            updates[i], _ = task.train_sgd(
                weights, Xi, yi, epochs=1, learning_rate=0.1, batch_size=32, seed=rnd
            )
            counts[i] = len(yi)
        logs.append(
            task.RoundLog(start=[a.copy() for a in weights], updates=updates, examples=counts)
        )
        total = sum(counts.values())
        weights = [sum(counts[i] * updates[i][j] for i in updates) / total for j in range(2)]
    return initial, logs, weights


def test_coalition_of_all_sites_is_the_real_final_model():
    initial, logs, final = _federated_run()

    rebuilt = task.coalition_run_model(initial, logs, frozenset({0, 1, 2}))

    for got, want in zip(rebuilt, final, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_coalition_of_one_site_follows_that_sites_own_steps():
    initial, logs, _ = _federated_run()

    rebuilt = task.coalition_run_model(initial, logs, frozenset({1}))

    # Site 1's own trajectory: the initial model plus each of its steps (none in round 2).
    expected = [
        initial[j] + sum(log.updates[1][j] - log.start[j] for log in logs if 1 in log.updates)
        for j in range(2)
    ]
    for got, want in zip(rebuilt, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert not np.allclose(rebuilt[0], task.coalition_run_model(initial, logs, frozenset({0}))[0])


def test_empty_coalition_is_the_initial_model():
    initial, logs, _ = _federated_run()

    rebuilt = task.coalition_run_model(initial, logs, frozenset())

    assert all(np.array_equal(a, b) for a, b in zip(rebuilt, initial, strict=True))


@pytest.mark.parametrize("members", [(), (0,), (1, 2), (0, 1, 2)])
def test_round_coalition_model_matches_portal_coalition_weights(members):
    from accounting.contribution import coalition_weights

    _, logs, _ = _federated_run()
    log = logs[0]

    got = task.coalition_round_model(log, frozenset(members))

    want = coalition_weights(log.start, log.updates, log.examples, frozenset(members))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_round_coalition_whose_members_missed_the_round_keeps_the_start():
    _, logs, _ = _federated_run()

    got = task.coalition_round_model(logs[1], frozenset({1}))  # site 1 missed round 2

    assert all(np.array_equal(a, b) for a, b in zip(got, logs[1].start, strict=True))


def test_stack_and_unstack_models_round_trip():
    rng = np.random.default_rng(0)
    models = [[rng.normal(size=(4, 3)), rng.normal(size=3)] for _ in range(5)]

    stacked = task.stack_models(models)
    back = task.unstack_models(stacked)

    assert [a.shape for a in stacked] == [(5, 4, 3), (5, 3)]
    for model, restored in zip(models, back, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(model, restored, strict=True))


@pytest.mark.parametrize(
    ("reason", "sentence"),
    [
        (
            "<class 'frp_flwr.task.SiteDataError'>:<'site 'hospital-a': KeyError: no key'>",
            "Site 'hospital-a': KeyError: no key.",
        ),
        (
            "<class 'ZeroDivisionError'>:<'division by zero'>",
            "ZeroDivisionError: division by zero.",
        ),
        (
            "Error: Node Unavailable — The destination node failed to report a heartbeat within "
            "2 × its expected interval.",
            "Its SuperNode went offline (no heartbeat reached the SuperLink in time).",
        ),
        (
            "Error: Reply Message Unavailable - The reply message has expired.",
            "Reply Message Unavailable - The reply message has expired.",
        ),
        ("", "Unknown error."),
    ],
)
def test_readable_error_turns_flowers_reasons_into_sentences(reason, sentence):
    assert task.readable_error(reason) == sentence
