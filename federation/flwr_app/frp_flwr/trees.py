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

What a reply carries (issue 9, finding 5; ADR 0023): XGBoost's JSON trees hold, per node, the
training statistics ``loss_changes`` (split gains), ``sum_hessian`` (covers) and ``base_weights``
(every node's weight ``−G/(H+λ)``). They give a site's exact training rows to every other site
(the global booster goes to all): the root's cover is the row count under ``reg:squarederror``
and ``n·b(1−b)`` for the first ``binary:logistic`` tree, and the gain
``w_L²(H_L+λ) + w_R²(H_R+λ) − w²(H+λ)`` with the weights is linear in ``H``. Prediction reads
none of them: a node's split (``split_indices``, ``split_conditions``, ``default_left``, the
categories) and a leaf's value (``split_conditions`` of a scalar leaf, ``leaf_weights`` of a
vector leaf). So :func:`pack_trees` strips them (:func:`strip_statistics`): gains 0, internal
weights 0, a leaf's weight its value, a node's cover the number of leaves under it (the tree's
shape; covers that add up keep XGBoost's SHAP values defined, all-0 covers would give 0/0), and
:func:`check_reply` refuses a reply whose statistics are not those. Cover- and gain-based
importances (``get_score(importance_type="cover"/"gain")``) of a federated model say nothing.

The leaf values themselves are released values (ADR 0036, amendment): XGBoost's leaf
``−η G/(H + λ)`` of a first ``binary:logistic`` tree is ``−η (n·b − n₁)/(n·b(1 − b) + λ)``, whose
float gives the leaf's rows and positives back. :func:`release_leaves` refits every new tree's
leaves, in boosting order, from the leaf's released count and its rows' mean gradient and hessian
snapped to the grid the released count allows (:func:`released_leaf`); a leaf of 1–7 rows is 0.
The splits are XGBoost's.

Objectives: ``binary:logistic`` (two classes, ``base_score`` = the share of the second class among
the sites' training labels as released, :func:`released_labels`), ``multi:softprob`` (three or more), ``reg:squarederror`` on the
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

from frp_flwr.contract import SMALL_COUNT, ContractError, released, released_floor
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


#: The per-node training statistics of an XGBoost JSON tree (module doc, "What a reply carries").
STATISTICS = ("loss_changes", "sum_hessian", "base_weights")


def _leaves_under(tree: dict) -> list[int]:
    """Per node of ``tree`` (XGBoost JSON), the number of leaves under it (a leaf: 1; a node
    not reachable from the root: 0). Raises ``ValueError`` on a child index out of range or a
    node reached twice (a cycle, or a shared child)."""
    left, right = tree["left_children"], tree["right_children"]
    nodes = len(left)
    if len(right) != nodes or nodes < 1:
        raise ValueError("children lists of different lengths, or no node")
    order, stack, seen = [], [0], [False] * nodes
    while stack:
        node = stack.pop()
        if not 0 <= node < nodes or seen[node]:
            raise ValueError(f"node {node} is out of range or reached twice")
        seen[node] = True
        order.append(node)
        if left[node] != -1:
            stack += [int(left[node]), int(right[node])]
    under = [0] * nodes
    for node in reversed(order):  # children before their parent
        under[node] = 1 if left[node] == -1 else under[left[node]] + under[right[node]]
    return under


def _stripped(tree: dict) -> dict[str, list[float]]:
    """The statistics ``tree`` (XGBoost JSON, scalar or vector leaf) may carry: every gain 0,
    every cover the number of leaves under the node, every internal node's weight 0 and a
    leaf's weight its value (``split_conditions[i]`` for a scalar leaf; for a vector leaf of
    width ``k``, ``leaf_weights[j·k:(j+1)·k]`` with ``j = right_children[i]``, as XGBoost's
    multi-target trees store it). Raises ``ValueError``/``KeyError``/``TypeError``/
    ``IndexError`` on a malformed tree."""
    under = _leaves_under(tree)
    nodes = len(under)
    width = max(1, int(tree["tree_param"]["size_leaf_vector"]))
    if int(tree["tree_param"]["num_nodes"]) != nodes:
        raise ValueError("num_nodes is not the number of nodes")
    weights: list[float] = []
    for node in range(nodes):
        if tree["left_children"][node] != -1 or under[node] == 0:
            weights += [0.0] * width
        elif width == 1:
            weights.append(float(tree["split_conditions"][node]))
        else:
            leaf = int(tree["right_children"][node])
            values = tree["leaf_weights"][leaf * width : (leaf + 1) * width]
            if leaf < 0 or len(values) != width:
                raise ValueError(f"leaf {node} has no vector of {width} values")
            weights += [float(v) for v in values]
    return {
        "loss_changes": [0.0] * nodes,
        "sum_hessian": [float(n) for n in under],
        "base_weights": weights,
    }


def strip_statistics(model: dict) -> None:
    """Replace, in place, the training statistics of every tree of ``model`` (the
    ``learner.gradient_booster.model`` object of XGBoost's JSON) by :func:`_stripped`'s: what a
    site sends carries only what prediction reads (module doc). Predictions, margins and SHAP
    values' sums are bit-identical before and after. Raises ``ValueError``/``KeyError``/
    ``TypeError``/``IndexError`` on a malformed tree."""
    for tree in model["trees"]:
        tree.update(_stripped(tree))


def check_reply(record: ArrayRecord) -> int:
    """A site's train reply: its new trees (:func:`pack_trees` form), at least one, within
    :data:`MAX_BOOSTER_BYTES`, carrying no training statistics (:func:`strip_statistics`: a
    modified ClientApp cannot send its counts to the other sites). Returns the number of trees.
    Raises ``ContractError``."""
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
    for i, tree in enumerate(model["trees"]):
        try:
            canonical = _stripped(tree)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ContractError(f"arrays: not an XGBoost tree (tree {i}: {exc})") from None
        if any(tree.get(key) != value for key, value in canonical.items()):
            raise ContractError(
                f"arrays: tree {i} carries training statistics (gains, covers or internal "
                "weights); a site sends only what prediction reads"
            )
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
    ``FedXgbBagging``'s ``aggregate_bagging``, without their training statistics
    (:func:`strip_statistics`)."""
    part = booster[start : booster.num_boosted_rounds()]
    doc = json.loads(bytes(part.save_raw("json")))
    model = _model(doc)
    strip_statistics(model)
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
    packed, margin = release_leaves(booster, start, data, y, params)
    return packed, _margin_loss(margin, y, params), tree_count(packed)


#: XGBoost's floor of a row's hessian (``kRtEps``/``eps`` of its logistic and softmax objectives).
_HESSIAN_FLOOR = 1e-16


def _gradients(margin: np.ndarray, y: np.ndarray, objective: str):
    """Per-row gradient and hessian of XGBoost's ``objective`` at ``margin`` — ``(n,)`` each, or
    ``(n, C)`` for ``multi:softprob`` — as its C++ objectives compute them:
    ``reg:squarederror`` g = m − y, h = 1; ``binary:logistic`` p = σ(m), g = p − y,
    h = max(p(1 − p), ε); ``multi:softprob`` p = softmax(m), g = p − onehot(y),
    h = max(2p(1 − p), ε) (``src/objective/regression_loss.h``, ``multiclass_obj.cu``)."""
    if objective.startswith("reg:"):
        return margin - y, np.ones_like(margin)
    if objective == "binary:logistic":
        p = 1.0 / (1.0 + np.exp(-margin))
        return p - y, np.maximum(p * (1.0 - p), _HESSIAN_FLOOR)
    shifted = np.exp(margin - margin.max(axis=1, keepdims=True))
    p = shifted / shifted.sum(axis=1, keepdims=True)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y.astype(int)] = 1.0
    return p - onehot, np.maximum(2.0 * p * (1.0 - p), _HESSIAN_FLOOR)


def _margin_loss(margin: np.ndarray, y: np.ndarray, params: dict) -> float:
    """:func:`loss_and_accuracy`'s loss from raw margins: the mean squared error (regression),
    else the mean cross-entropy in nats."""
    if len(y) == 0:
        return 0.0
    objective = params["objective"]
    if objective.startswith("reg:"):
        return float(np.square(margin - y).mean())
    if objective == "binary:logistic":
        p1 = 1.0 / (1.0 + np.exp(-margin))
        proba = np.column_stack([1.0 - p1, p1])
    else:
        shifted = np.exp(margin - margin.max(axis=1, keepdims=True))
        proba = shifted / shifted.sum(axis=1, keepdims=True)
    return float(-np.log(np.clip(proba[np.arange(len(y)), y.astype(int)], 1e-12, None)).mean())


def released_leaf(
    g: np.ndarray,
    h: np.ndarray,
    *,
    eta: float,
    reg_lambda: float,
    min_child_weight: float,
    regression: bool,
):
    """One leaf's value from what its rows' counts release: a float for ``g``, ``h`` of shape
    ``(n,)`` (the rows' gradients and hessians, :func:`_gradients`), a ``(C,)`` array for
    ``(n, C)`` (a vector leaf); 0 when the leaf holds 1–7 rows.

    XGBoost's leaf is ``−η G / (H + λ)`` over the leaf's ``n`` rows (``G``, ``H`` the sums; 0
    when ``H < min_child_weight``; XGBoost's ``CalcWeight``). For the first tree of
    ``binary:logistic`` every row has the same prediction, so ``G = n·b − n₁`` and
    ``H = n·b(1 − b)``: the float gives the leaf's rows ``n`` and positives ``n₁`` back to every
    site and, after release, to every researcher (issue 9, hostile re-test; ADR 0036). Here
    ``G``, ``H`` are ``r·ĝ``, ``r·ĥ``: ``r`` the released count (``contract.released``), ``ĝ``,
    ``ĥ`` the rows' mean gradient and hessian snapped to the grid ``1 / L``,
    ``L = released_floor(n)`` (classification: means of bounded per-row values, snapped as
    ``released_fraction`` snaps a fraction over rows, so for the first tree every count the
    released one allows reaches the value), or to 3 significant figures with ``ĥ = 1``
    (``reg:squarederror``: a mean of measured residuals, the profile's rule). ``L ≤ 7`` (the
    count shows "≤7") gives 0, the leaf that changes nothing."""
    rows = len(g)
    floor = released_floor(rows)
    if floor <= SMALL_COUNT:
        return np.zeros(g.shape[1]) if g.ndim == 2 else 0.0
    r = float(released(rows))
    if regression:
        g_hat = np.asarray(float(f"{float(g.mean()):.3g}"))
        h_hat = np.asarray(1.0)
    else:
        g_hat = np.round(g.mean(axis=0) * floor) / floor
        h_hat = np.round(h.mean(axis=0) * floor) / floor
    hessian = r * h_hat
    kept = (hessian >= min_child_weight) & (hessian > 0)
    value = np.where(kept, -eta * r * g_hat / np.where(kept, hessian + reg_lambda, 1.0), 0.0)
    return value if g.ndim == 2 else float(value)


def release_leaves(booster, start: int, data, y: np.ndarray, params: dict):
    """The trees of boosting rounds ``start…`` of ``booster`` packed for bagging
    (:func:`pack_trees`) with every leaf's value replaced by :func:`released_leaf`'s, and the
    training rows' margins under the global booster plus those trees — ``(JSON bytes, margins
    (n,) or (n, C))``.

    The leaves are refitted tree by tree in boosting order (XGBoost's ``refresh`` updater does
    the same with exact sums): the rows of each leaf (``pred_leaf``) with their gradients and
    hessians at the margins of the global booster and the trees refitted before it. The
    structure (splits) is the one XGBoost grew. ``data``: the ``DMatrix`` of the training rows
    ``(n, d)``, ``y`` their labels ``(n,)`` (class indices, or the standardised target). Raises
    ``KeyError``/``IndexError`` only on a booster whose JSON is not XGBoost's own."""
    packed = pack_trees(booster, start)
    doc = json.loads(packed)
    model = _model(doc)
    trees = model["trees"]
    if not trees:
        return packed, np.asarray(booster.predict(data, output_margin=True), dtype=np.float64)
    # pred_leaf takes only ranges from 0: every tree's leaf, the new trees' the last columns
    leaves = np.asarray(booster.predict(data, pred_leaf=True), dtype=np.int64).reshape(len(y), -1)
    leaves = leaves[:, leaves.shape[1] - len(trees) :]
    margin = np.asarray(booster.predict(data, output_margin=True), dtype=np.float64)
    width = max(1, int(trees[0]["tree_param"]["size_leaf_vector"]))

    def values(tree: dict) -> np.ndarray:  # node → its leaf value (row of width), 0 inside
        out = np.zeros((len(tree["left_children"]), width))
        for node, left in enumerate(tree["left_children"]):
            if left != -1:
                continue
            if width == 1:
                out[node, 0] = float(tree["split_conditions"][node])
            else:
                j = int(tree["right_children"][node])
                out[node] = tree["leaf_weights"][j * width : (j + 1) * width]
        return out

    original = [values(tree) for tree in trees]
    for t in range(len(trees)):  # the global booster's margins: less every new tree's leaf
        step = original[t][leaves[:, t]]
        margin = margin - (step[:, 0] if margin.ndim == 1 else step)
    objective = params["objective"]
    eta, reg_lambda = float(params["eta"]), float(params["lambda"])
    min_child_weight = float(params["min_child_weight"])
    for t, tree in enumerate(trees):
        g, h = _gradients(margin, y, objective)
        new = np.zeros_like(original[t])
        for node in np.unique(leaves[:, t]):
            rows = leaves[:, t] == node
            new[node] = released_leaf(
                g[rows],
                h[rows],
                eta=eta,
                reg_lambda=reg_lambda,
                min_child_weight=min_child_weight,
                regression=objective.startswith("reg:"),
            )
        for node, left in enumerate(tree["left_children"]):
            if left != -1:
                continue
            if width == 1:
                tree["split_conditions"][node] = float(new[node, 0])
            else:
                j = int(tree["right_children"][node])
                tree["leaf_weights"][j * width : (j + 1) * width] = [float(v) for v in new[node]]
        step = new[leaves[:, t]]
        margin = margin + (step[:, 0] if margin.ndim == 1 else step)
    strip_statistics(model)
    return json.dumps(doc).encode(), margin


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


def released_labels(sites: Iterable[dict[str, int]]) -> dict[str, int]:
    """Label → the sum over ``sites`` (each label → its training rows) of the site's count as
    released (``contract.released``: ``sandbox.profile.released_count``'s rule, ADR 0036).

    The binary ``base_score`` is sent to every site at full precision (in the config and in
    every booster): a share of exact counts is a fraction whose denominator a
    continued-fraction expansion finds, the pooled training rows, and less one's own rows the
    others'. A share of released counts gives back only released counts."""
    out: dict[str, int] = {}
    for counts in sites:
        for label, count in counts.items():
            out[label] = out.get(label, 0) + released(int(count))
    return out


def base_score(train_labels: dict[str, int], classes: list[str]) -> float:
    """The share of the second class among ``train_labels`` (label → rows; the ServerApp
    passes :func:`released_labels`), the binary ``base_score``; 0.5 when there are none."""
    total = sum(train_labels.values())
    if total == 0 or len(classes) != 2:
        return 0.5
    return train_labels.get(classes[1], 0) / total
