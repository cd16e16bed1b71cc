"""Gradient-boosted trees (``frp_flwr.trees``): local boosting at the sites, Flower's FedXgbBagging.

Facts checked by hand or against XGBoost itself: the number of trees after N rounds is the sum
over rounds and replying sites of the local boosting rounds; the bagged model's margin is the
global margin plus every site's own change of it (what bagging means); a run on three IID sites
reaches XGBoost's own accuracy on the pooled rows; the contract refuses bad hyper-parameters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xgboost as xgb
from flwr.app import Message, MetricRecord, RecordDict
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.metrics import accuracy_score

from frp_flwr import trees
from frp_flwr.contract import ContractError, JobSpec, read_model_choice
from frp_flwr.models import XGBOOST_PARAMS, model_for

SITES = 3


@pytest.fixture(autouse=True)
def _serverapp_identity(monkeypatch):
    """A ServerApp process's identity (Flower's Message needs it; the ServerApp runtime sets it)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


def _spec(model: dict) -> dict:
    return read_model_choice({"kind": "xgboost", **model}, "model")


def _params(task="classification", classes=3, **model) -> dict:
    return trees.xgb_params(_spec(model), task=task, num_classes=classes, base_score=0.5, seed=0)


def _reply(packed: bytes, n: int) -> Message:
    """A site's train reply as the ServerApp receives it (arrays + metrics)."""
    content = RecordDict(
        {
            "arrays": trees.to_record(packed),
            "metrics": MetricRecord({"num-examples": n, "train-loss": 0.1}),
        }
    )
    return Message(content, dst_node_id=1, message_type="train")


def _federate(parts, params, *, rounds: int, local_rounds: int, drop=None):
    """Run ``rounds`` rounds of local boosting + FedXgbBagging over ``parts`` [(X, y)];
    ``drop``: (round, site) pairs whose reply is missing. Returns the global booster bytes and
    each round's ``(start, site deltas)`` margins for the checks."""
    bagging = trees.strategy()
    global_model = trees.empty_model()
    for rnd in range(1, rounds + 1):
        raw = trees.booster_bytes(global_model)
        replies = []
        for site, (X, y) in enumerate(parts):
            if drop and (rnd, site) in drop:
                continue
            packed, loss, added = trees.train_local(
                raw, X, y, params=params, local_rounds=local_rounds
            )
            assert added == local_rounds and np.isfinite(loss)
            assert trees.check_reply(trees.to_record(packed)) == local_rounds
            replies.append(_reply(packed, len(y)))
        global_model, _ = trees.aggregate(bagging, global_model, rnd, replies)
    return trees.booster_bytes(global_model)


def _iid(X, y, seed=0):
    order = np.random.default_rng(seed).permutation(len(y))
    return [(X[order[i::SITES]], y[order[i::SITES]]) for i in range(SITES)]


def test_trees_after_n_rounds_are_rounds_times_sites_times_local_rounds():
    X, y = load_iris(return_X_y=True)
    raw = _federate(_iid(X, y), _params(max_depth=3), rounds=4, local_rounds=2)

    assert trees.tree_count(raw) == 4 * SITES * 2  # 24
    booster = trees.load_booster(raw)
    assert booster.num_boosted_rounds() == 4 * SITES  # one bagged iteration per site and round


def test_a_missing_reply_adds_no_trees():
    X, y = load_iris(return_X_y=True)
    raw = _federate(
        _iid(X, y), _params(max_depth=2), rounds=3, local_rounds=1, drop={(2, 0), (3, 1)}
    )

    assert trees.tree_count(raw) == 3 * SITES - 2


def test_bagged_margin_is_global_plus_every_sites_own_change():
    X, y = load_iris(return_X_y=True)
    parts = _iid(X, y)
    params = _params(max_depth=3)
    first = _federate(parts, params, rounds=1, local_rounds=2)
    # Round 2 by hand: each site boosts on top of `first`; bagging must add their changes.
    d = xgb.DMatrix(X)
    before = trees.load_booster(first, params).predict(d, output_margin=True)
    changes = []
    bagging = trees.strategy()
    replies = []
    for Xs, ys in parts:
        packed, _, _ = trees.train_local(first, Xs, ys, params=params, local_rounds=2)
        # the site's change: its sent trees' margin less the base margin of a booster of none
        trees_only = trees.load_booster(packed, params).predict(d, output_margin=True)
        none = xgb.Booster(params, [d]).predict(d, output_margin=True)
        changes.append(trees_only - none)
        replies.append(_reply(packed, len(ys)))
    second, _ = trees.aggregate(bagging, trees.to_record(first), 2, replies)
    after = trees.load_booster(trees.booster_bytes(second), params).predict(d, output_margin=True)

    np.testing.assert_allclose(after, before + sum(changes), atol=1e-4)


@pytest.mark.parametrize("dataset", ["breast_cancer", "iris"])
def test_federated_trees_reach_xgboost_on_the_pooled_rows(dataset):
    loader = load_breast_cancer if dataset == "breast_cancer" else load_iris
    X, y = loader(return_X_y=True)
    order = np.random.default_rng(1).permutation(len(y))
    test, train = order[: len(y) // 4], order[len(y) // 4 :]
    classes = len(np.unique(y))
    share = float(np.mean(y[train] == 1))
    spec = _spec({"max_depth": 3, "eta": 0.1, "local_rounds": 2})
    params = trees.xgb_params(
        spec, task="classification", num_classes=classes, base_score=share, seed=0
    )
    raw = _federate(_iid(X[train], y[train]), params, rounds=6, local_rounds=2)
    federated = accuracy_score(y[test], trees.predict_proba(raw, X[test], params).argmax(axis=1))
    pooled = xgb.train(params, xgb.DMatrix(X[train], label=y[train]), num_boost_round=12)
    proba = pooled.predict(xgb.DMatrix(X[test]))
    central = accuracy_score(
        y[test], (proba > 0.5).astype(int) if proba.ndim == 1 else proba.argmax(axis=1)
    )

    assert central > 0.9
    assert federated >= 0.97 * central - 1.0 / len(test)


def test_regression_trees_beat_the_mean():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 4))
    y = X[:, 0] * 2 - X[:, 1] + 0.1 * rng.normal(size=600)
    y = (y - y.mean()) / y.std()
    params = _params(task="regression", classes=0, max_depth=3, eta=0.1)
    raw = _federate(_iid(X, y), params, rounds=5, local_rounds=2)

    mse, acc = trees.loss_and_accuracy(raw, X, y, params)
    assert acc == 0.0 and mse < 0.25  # the mean predicts with MSE 1 on the standardised target


def test_the_reply_packs_its_trees_as_one_iteration():
    X, y = load_iris(return_X_y=True)
    packed, _, added = trees.train_local(b"", X, y, params=_params(max_depth=2), local_rounds=3)
    model = json.loads(packed)["learner"]["gradient_booster"]["model"]

    assert added == 3
    assert model["gbtree_model_param"] == {"num_parallel_tree": "3", "num_trees": "3"}
    assert model["iteration_indptr"] == [0, 3] and model["tree_info"] == [0, 0, 0]


def test_check_reply_refuses_what_is_not_packed_trees():
    with pytest.raises(ContractError, match="not an XGBoost tree model"):
        trees.check_reply(trees.to_record(b"not json"))
    with pytest.raises(ContractError, match="no tree"):
        trees.check_reply(trees.empty_model())
    booster = xgb.train(_params(max_depth=2), xgb.DMatrix(*load_iris(return_X_y=True)), 2)
    with pytest.raises(ContractError, match="one iteration"):
        trees.check_reply(trees.to_record(bytes(booster.save_raw("json"))))


def test_model_spec_fills_defaults_and_old_specs_mean_linear():
    spec = JobSpec.from_json(json.dumps({"sites": {"a": _pointer()}, "target": "y"}))
    assert spec.model == {"kind": "linear"} and spec.model_kind == "linear"
    full = _spec({"max_depth": 4})
    assert full["max_depth"] == 4
    assert {k: full[k] for k in XGBOOST_PARAMS if k != "max_depth"} == {
        k: d for k, (_, d, _, _) in XGBOOST_PARAMS.items() if k != "max_depth"
    }


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"max_depth": 0}, "model.max_depth: 0 is outside 1..12"),
        ({"eta": 0.0}, "model.eta: 0.0 is outside"),
        ({"eta": float("nan")}, "model.eta: nan is not a finite number"),
        ({"subsample": 1.5}, "model.subsample: 1.5 is outside"),
        ({"local_rounds": 2.5}, "model.local_rounds: expected an integer"),
        ({"local_rounds": True}, "model.local_rounds: expected an integer"),
        ({"depth": 3}, "unknown xgboost parameter"),
    ],
)
def test_model_spec_refuses_bad_hyper_parameters(model, message):
    with pytest.raises(ContractError, match=message.replace(".", r"\.")):
        _spec(model)


def test_model_spec_refuses_an_unknown_kind():
    with pytest.raises(ContractError, match="model.kind: 'forest' is not one of"):
        read_model_choice({"kind": "forest"}, "model")


def _pointer() -> dict:
    return {"store_key": "k", "dataset": "d", "version": 1}


def test_xgboost_is_a_kind_of_the_model_registry_with_an_empty_booster_to_start():
    model = model_for(_spec({"max_depth": 2}))
    assert model.kind == "xgboost" and model.spec["max_depth"] == 2
    (start,) = model.init_params(7, 3, seed=1)
    assert start.dtype == np.uint8 and start.size == 0
    assert trees.tree_count(start.tobytes()) == 0
