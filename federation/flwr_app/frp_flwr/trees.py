"""Gradient-boosted trees (XGBoost) for the portal's Flower App: local boosting, bagged globally.

Algorithm: Flower's tree **bagging** (``flwr.serverapp.strategy.FedXgbBagging``, after Flower's
``examples/xgboost-quickstart``). Every federated round each site loads the global booster, adds
``local_rounds`` boosting rounds fitted to its own training rows (so its trees correct the global
model's residuals on its data), and sends back only its new trees; the ServerApp appends every
site's trees to the global booster with FedXgbBagging's ``aggregate_train``
(``strategy_utils.aggregate_bagging``). The global model's margin is therefore
``margin(global) + Σ_sites (margin(global + site's trees) − margin(global))`` and after ``N`` rounds
it holds ``Σ_rounds Σ_replying sites local_rounds`` trees (one tree per boosting round, also for
multi-class: XGBoost's ``multi_output_tree`` strategy grows one tree with a vector leaf over the
classes, so bagging's ``tree_info = 0`` is right for every tree).

Packing (why the reply is rewritten): ``aggregate_bagging`` appends ``num_parallel_tree`` trees of a
reply as one iteration. A site's reply is packed as ONE iteration of all its new trees
(``num_parallel_tree`` = their number, :func:`pack_trees`), so every tree is kept; a booster is
always loaded through :func:`load_booster`, which sets ``num_parallel_tree`` back to 1, so local
training adds one tree per boosting round. The booster travels as its JSON bytes in a one-array
``ArrayRecord`` of ``uint8`` (as Flower's example does); the empty array is the empty model.

Objectives: ``binary:logistic`` (two classes, ``base_score`` = the pooled share of the second class
from the federated preparation), ``multi:softprob`` (three or more), ``reg:squarederror`` on the
standardised target (``base_score`` 0, the pooled mean). Features are the prepared, standardised
matrix of ``frp_flwr.preprocess`` (trees do not need the scaling; it does no harm).

Imports: xgboost is imported inside the functions that need it, so the linear model's ClientApp
processes do not pay for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, Message

from frp_flwr.contract import ContractError
from frp_flwr.models import XGBOOST_PARAMS

#: The booster's bytes most a reply or the global model may hold (JSON, bytes).
MAX_BOOSTER_BYTES = 64 * 1024 * 1024


def empty_model() -> ArrayRecord:
    """The global model before round 1: one empty ``uint8`` array (no tree)."""
    return ArrayRecord([np.frombuffer(b"", dtype=np.uint8)])


def booster_bytes(record: ArrayRecord) -> bytes:
    """The booster's JSON bytes in ``record`` (``b""``: no tree yet). Raises ``ContractError``
    when the record is not one ``uint8`` array."""
    arrays = record.to_numpy_ndarrays()
    if len(arrays) != 1 or arrays[0].dtype != np.uint8 or arrays[0].ndim != 1:
        raise ContractError("arrays: a booster is one array of bytes (uint8)")
    return arrays[0].tobytes()


def to_record(raw: bytes) -> ArrayRecord:
    """``raw`` booster bytes as the one-array ``ArrayRecord`` that crosses the network."""
    return ArrayRecord([np.frombuffer(raw, dtype=np.uint8)])


def is_booster(record: ArrayRecord) -> bool:
    """Whether ``record`` carries a booster (one ``uint8`` array) rather than weights."""
    arrays = record.to_numpy_ndarrays()
    return len(arrays) == 1 and arrays[0].dtype == np.uint8


def _model(doc: dict) -> dict:
    return doc["learner"]["gradient_booster"]["model"]


def tree_count(raw: bytes) -> int:
    """Trees in the booster ``raw`` (JSON bytes; ``b""`` has 0). Raises ``ContractError`` when
    ``raw`` is not an XGBoost JSON gbtree model."""
    if not raw:
        return 0
    try:
        doc = json.loads(raw)
        return int(_model(doc)["gbtree_model_param"]["num_trees"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ContractError(f"arrays: not an XGBoost tree model ({exc})") from None


def check_reply(record: ArrayRecord) -> int:
    """A site's train reply: its new trees (:func:`pack_trees` form), at least one, within
    :data:`MAX_BOOSTER_BYTES`. Returns the number of trees. Raises ``ContractError``."""
    raw = booster_bytes(record)
    if len(raw) > MAX_BOOSTER_BYTES:
        raise ContractError(f"arrays: a booster of {len(raw)} bytes is above {MAX_BOOSTER_BYTES}")
    trees = tree_count(raw)
    if trees < 1:
        raise ContractError("arrays: the reply holds no tree")
    doc = json.loads(raw)
    model = _model(doc)
    if trees < 1 or len(model.get("trees", [])) != trees:
        raise ContractError("arrays: the reply holds no tree, or not the trees it counts")
    if int(model["gbtree_model_param"]["num_parallel_tree"]) != trees:
        raise ContractError("arrays: the reply's trees are not packed as one iteration")
    return trees


def load_booster(raw: bytes, params: dict | None = None, cache: list | None = None):
    """An ``xgboost.Booster`` from JSON bytes ``raw`` (empty: a fresh booster with ``params``);
    ``cache``: the ``DMatrix`` list it will train on (XGBoost's ``Booster(params, cache)``).

    ``num_parallel_tree`` is set to 1 first (the bagged model records the last packed reply's
    count there; boosting on top must add one tree per round). Raises ``ContractError`` on bytes
    XGBoost cannot read.
    """
    import xgboost as xgb

    booster = xgb.Booster(params or {}, cache or [])
    if raw:
        try:
            doc = json.loads(raw)
            _model(doc)["gbtree_model_param"]["num_parallel_tree"] = "1"
            booster.load_model(bytearray(json.dumps(doc).encode()))
        except (ValueError, KeyError, TypeError, xgb.core.XGBoostError) as exc:
            raise ContractError(f"arrays: XGBoost cannot read the booster ({exc})") from None
    if params:
        booster.set_param(params)
    return booster


def pack_trees(booster, start: int) -> bytes:
    """The trees of boosting rounds ``start…`` of ``booster`` as JSON bytes, packed as ONE
    iteration (``num_parallel_tree`` = the number of trees; module docstring) for
    ``FedXgbBagging``'s ``aggregate_bagging``."""
    part = booster[start : booster.num_boosted_rounds()]
    doc = json.loads(bytes(part.save_raw("json")))
    model = _model(doc)
    trees = int(model["gbtree_model_param"]["num_trees"])
    model["gbtree_model_param"]["num_parallel_tree"] = str(trees)
    model["iteration_indptr"] = [0, trees]
    model["tree_info"] = [0] * trees
    return json.dumps(doc).encode()


def xgb_params(model: dict, *, task: str, num_classes: int, base_score: float, seed: int) -> dict:
    """XGBoost's parameters for a job's ``model`` spec (``frp_flwr.models.read_model_spec``, kind
    ``xgboost``): objective by task and class count (module docstring), ``hist`` trees, the
    job's hyper-parameters, ``base_score`` (probability for binary, standardised target for
    regression), one thread (a site's allocated cores are the SuperNode's, not this process's)."""
    params = {
        "tree_method": "hist",
        "max_depth": int(model["max_depth"]),
        "eta": float(model["eta"]),
        "subsample": float(model["subsample"]),
        "colsample_bytree": float(model["colsample_bytree"]),
        "min_child_weight": float(model["min_child_weight"]),
        "lambda": float(model["reg_lambda"]),
        "seed": int(seed),
        "nthread": 1,
        "verbosity": 0,
    }
    if task == "regression":
        params.update(objective="reg:squarederror", base_score=0.0)
    elif num_classes == 2:
        params.update(objective="binary:logistic", base_score=min(max(base_score, 1e-3), 1 - 1e-3))
    else:
        params.update(
            objective="multi:softprob",
            num_class=int(num_classes),
            multi_strategy="multi_output_tree",
            base_score=0.5,
        )
    return params


def model_spec(model: dict) -> dict:
    """``model`` with every xgboost hyper-parameter (defaults for absent ones)."""
    return {k: model.get(k, default) for k, (_, default, _, _) in XGBOOST_PARAMS.items()}


def train_local(
    raw: bytes,
    X: np.ndarray,
    y: np.ndarray,
    *,
    params: dict,
    local_rounds: int,
) -> tuple[bytes, float, int]:
    """Boost ``local_rounds`` rounds on ``(X (n, d), y (n,))`` on top of the global booster
    ``raw``; return ``(the new trees packed for bagging, training loss afterwards, trees added)``.

    ``y``: class indices (classification) or the standardised target (regression). The loss is
    :func:`loss_and_accuracy`'s of the local booster (global + new trees) on the training rows.
    """
    import xgboost as xgb

    data = xgb.DMatrix(X, label=y)
    booster = load_booster(raw, params, [data])
    start = booster.num_boosted_rounds()
    for i in range(local_rounds):
        booster.update(data, start + i)
    loss, _ = _scores(booster, X, y, params)
    packed = pack_trees(booster, start)
    return packed, loss, tree_count(packed)


def predict_proba(raw: bytes, X: np.ndarray, params: dict) -> np.ndarray:
    """Class probabilities ``(n, C)`` of the booster ``raw`` (classification)."""
    import xgboost as xgb

    p = load_booster(raw, params).predict(xgb.DMatrix(X))
    p = np.asarray(p, dtype=np.float64)
    return np.column_stack([1.0 - p, p]) if p.ndim == 1 else p


def predict(raw: bytes, X: np.ndarray, params: dict) -> np.ndarray:
    """Predictions ``(n,)`` of the booster ``raw`` (regression, standardised target units)."""
    import xgboost as xgb

    return np.asarray(load_booster(raw, params).predict(xgb.DMatrix(X)), dtype=np.float64)


def _scores(booster, X: np.ndarray, y: np.ndarray, params: dict) -> tuple[float, float]:
    import xgboost as xgb

    if len(y) == 0:
        return 0.0, 0.0
    out = np.asarray(booster.predict(xgb.DMatrix(X)), dtype=np.float64)
    if params["objective"].startswith("reg:"):
        return float(np.square(out - y).mean()), 0.0
    proba = np.column_stack([1.0 - out, out]) if out.ndim == 1 else out
    loss = float(-np.log(np.clip(proba[np.arange(len(y)), y], 1e-12, None)).mean())
    return loss, float((proba.argmax(axis=1) == y).mean())


def loss_and_accuracy(
    raw: bytes, X: np.ndarray, y: np.ndarray, params: dict
) -> tuple[float, float]:
    """Classification: mean cross-entropy (nats) and accuracy (0..1) of the booster ``raw``;
    regression: mean squared error (standardised target units) and 0.0."""
    return _scores(load_booster(raw, params), X, y, params)


def strategy():
    """Flower's ``FedXgbBagging`` with the run's own sampling bounds (the ServerApp samples)."""
    from flwr.serverapp.strategy import FedXgbBagging

    return FedXgbBagging(min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1)


def aggregate(bagging, global_model: ArrayRecord, rnd: int, replies: Iterable[Message]):
    """Bag the replies' trees into ``global_model`` with ``FedXgbBagging.aggregate_train``;
    returns ``(new global ArrayRecord, aggregated train metrics)``. The strategy's
    ``current_bst`` is set to the round's global booster first (``configure_train`` would; this
    ServerApp sends its own messages)."""
    bagging.current_bst = booster_bytes(global_model)
    arrays, metrics = bagging.aggregate_train(rnd, list(replies))
    return (arrays if arrays is not None else global_model), metrics


def base_score(train_labels: dict[str, int], classes: list[str]) -> float:
    """The pooled share of the second class among the training rows (binary ``base_score``),
    from the federated preparation's label counts (``server_app.Prepared.train_labels``: sums of
    the sites' released counts, since every site receives the share); 0.5 when there are none."""
    total = sum(train_labels.values())
    if total == 0 or len(classes) != 2:
        return 0.5
    return train_labels.get(classes[1], 0) / total
