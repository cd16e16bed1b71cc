"""Model and data for the portal's Flower App: multinomial logistic regression in numpy.

The model is softmax regression (Bishop, *Pattern Recognition and Machine Learning*, §4.3.4) trained by
mini-batch SGD on standardised features. Standardisation uses *federated* statistics (every site's
per-feature count, mean and sum of squared deviations, combined by the ServerApp), so no site's raw
values leave it.

Data loading goes through the site's own sandbox (``sandbox.loader``): the ClientApp decrypts its dataset
in memory with the site's key; nothing here sees another site's data. Imports are light on purpose:
every Flower message starts a new ClientApp process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

# The job specification is part of the portal contract; re-exported for the app's modules.
from frp_flwr.contract import JobSpec, SitePointer  # noqa: F401
from frp_flwr.preprocess import label_key, stratified_split  # noqa: F401

# ---------------------------------------------------------------------------------------------
# Site-side data
# ---------------------------------------------------------------------------------------------


def load_site_frame(node_config: dict, spec: JobSpec, *, test_fraction: float, seed: int):
    """Open this node's own dataset through its sandbox; return its ``preprocess.SiteFrame``.

    ``node_config`` carries ``site``, ``store`` (store URL) and ``keyring`` (directory path), set by
    the site's operator on ``flower-supernode --node-config``. ``spec.features`` empty means every
    numeric column except the target. Raises ``SiteDataError`` when this site is not part of the
    job or its data cannot be opened or prepared (message without file paths or values).
    """
    from frp_flwr.preprocess import PreprocessError, site_frame
    from sandbox import loader
    from sandbox.keyring import SiteKeyring
    from sandbox.storage import store_from_url

    site = str(node_config["site"])
    pointer = spec.sites.get(site)
    if pointer is None:
        raise SiteDataError(f"site {site!r} is not part of this job")
    try:
        store = store_from_url(str(node_config["store"]))
        kek = SiteKeyring(Path(str(node_config["keyring"]))).get(site)
        table = loader.load_table(
            store=store,
            kek=kek,
            store_key=pointer.store_key,
            site=site,
            dataset=pointer.dataset,
            version=pointer.version,
            columns=loader.training_columns(spec.target, spec.features),
        )
        features = spec.features or [c for c in table.numeric_columns() if c != spec.target]
        missing = [c for c in [spec.target, *features] if c not in table.data]
        if missing:
            raise SiteDataError(f"site {site!r}: dataset has no column(s) {missing}")
        return site_frame(
            table.data,
            replace(spec, features=features),
            test_fraction=test_fraction,
            seed=seed,
        )
    except SiteDataError:
        raise
    except PreprocessError as exc:
        raise SiteDataError(f"site {site!r}: {sanitise(str(exc))}") from None
    except Exception as exc:  # every sandbox error crosses the site boundary sanitised
        raise SiteDataError(f"site {site!r}: {type(exc).__name__}: {sanitise(str(exc))}") from None


class SiteDataError(Exception):
    """A site cannot take part; the message is safe to send to the server (no paths, no values)."""


_PATH_RE = re.compile(r"[^\s'\"():,]*[/\\][^\s'\"():,]*")


_FLOWER_EXCEPTION_RE = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>$", re.DOTALL)
_NODE_UNAVAILABLE = "Node Unavailable"


def readable_error(reason: str) -> str:
    """A Flower error reason as a sentence for the researcher.

    Flower wraps a ClientApp's exception as ``<class 'pkg.Name'>:<'message'>``
    (``flwr/supernode/runtime/run_clientapp.py``): a ``SiteDataError`` becomes its message, any
    other exception ``Name: message``. The SuperLink's *Node Unavailable* error says the SuperNode
    went offline. The result starts with a capital letter and ends with a full stop.
    """
    text = (reason or "").strip() or "unknown error"
    match = _FLOWER_EXCEPTION_RE.match(text)
    if match:
        name, message = match.groups()
        text = message if name == "SiteDataError" else f"{name}: {message}"
    elif _NODE_UNAVAILABLE in text:
        text = "its SuperNode went offline (no heartbeat reached the SuperLink in time)"
    elif text.startswith("Error: "):
        text = text[len("Error: ") :]
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def sanitise(text: str, limit: int = 300) -> str:
    """Replace every path-like token (anything containing ``/`` or ``\\``) with ``<path>``, then
    bound the length (characters): errors crossing the site boundary name no site file or host."""
    return _PATH_RE.sub("<path>", text)[:limit]


def label_keys(y_raw: np.ndarray) -> list[str]:
    """The distinct labels of a site as strings (sorted), for the server's global class list."""
    return sorted({label_key(v) for v in y_raw.tolist()})


def encode_labels(y_raw: np.ndarray, classes: list[str]) -> np.ndarray:
    """Map raw labels to indices of the job's global ``classes`` (strings). Unknown → ValueError."""
    index = {c: i for i, c in enumerate(classes)}
    try:
        return np.array([index[label_key(v)] for v in y_raw.tolist()], dtype=np.int64)
    except KeyError as exc:
        raise SiteDataError(f"label {exc.args[0]!r} is not among the job's classes") from None


def sort_classes(keys: set[str]) -> list[str]:
    """Sort class keys numerically when they all parse as numbers, else lexically."""
    try:
        return sorted(keys, key=float)
    except ValueError:
        return sorted(keys)


def feature_sums(X: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """A site's statistics for federated standardisation: ``(n, mean (d,), M2 (d,))``.

    ``M2`` is the sum of squared deviations from the site's own mean, so no cancellation happens
    when features have a large offset (Σx² − n·mean² would lose all precision at mean 1e8).
    """
    n = int(X.shape[0])
    if n == 0:
        return 0, np.zeros(X.shape[1]), np.zeros(X.shape[1])
    mean = X.mean(axis=0)
    return n, mean, np.square(X - mean).sum(axis=0)


def combine_sums(parts: list[tuple[int, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Global mean and population standard deviation from per-site ``(n, mean, M2)``; std 0 → 1.

    Pairwise combination of Chan, Golub & LeVeque (1979), "Updating formulae and a pairwise algorithm
    for computing sample variances": M2 = M2_a + M2_b + δ²·n_a·n_b / n, δ = mean_b − mean_a.
    Raises ``ValueError`` when no site has an example.
    """
    n, mean, m2 = 0, None, None
    for n_b, mean_b, m2_b in parts:
        if n_b == 0:
            continue
        mean_b, m2_b = np.asarray(mean_b, dtype=np.float64), np.asarray(m2_b, dtype=np.float64)
        if n == 0:
            n, mean, m2 = n_b, mean_b, m2_b
            continue
        total = n + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + np.square(delta) * (n * n_b / total)
        n = total
    if n == 0:
        raise ValueError("no training examples at any site")
    std = np.sqrt(m2 / n)
    std[std == 0] = 1.0
    return mean, std


# ---------------------------------------------------------------------------------------------
# Model: softmax regression
# ---------------------------------------------------------------------------------------------


def init_params(num_features: int, num_outputs: int) -> list[np.ndarray]:
    """Zero weights ``[W (d, K), b (K,)]`` — both convex problems need no random start. ``K`` is
    the number of classes (softmax regression) or 1 (linear regression)."""
    return [np.zeros((num_features, num_outputs)), np.zeros(num_outputs)]


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def predict_proba(params: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    """Class probabilities ``(n, C)`` of softmax regression on standardised ``X``."""
    W, b = params
    return _softmax(X @ W + b)


def predict(params: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    """Linear regression's predictions ``(n,)`` (standardised target units)."""
    W, b = params
    return (X @ W + b)[:, 0]


def loss_and_accuracy(
    params: list[np.ndarray], X: np.ndarray, y: np.ndarray, *, task: str = "classification"
) -> tuple[float, float]:
    """Classification: mean cross-entropy (nats) and accuracy (0..1) on standardised ``X``.
    Regression: mean squared error (standardised target units) and 0.0."""
    if len(y) == 0:
        return 0.0, 0.0
    if task == "regression":
        return float(np.square(predict(params, X) - y).mean()), 0.0
    p = predict_proba(params, X)
    loss = float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())
    acc = float((p.argmax(axis=1) == y).mean())
    return loss, acc


def train_sgd(
    params: list[np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    l2: float = 1e-4,
    task: str = "classification",
    mu: float = 0.0,
) -> tuple[list[np.ndarray], float]:
    """Mini-batch SGD on cross-entropy (classification) or half the squared error (regression),
    plus ``l2``·‖W‖²/2 and FedProx's proximal term ``mu``/2·‖w − w_received‖² (Li et al. 2020;
    ``mu`` 0: plain SGD). Returns new params and the loss afterwards (``loss_and_accuracy``)."""
    W, b = (p.copy() for p in params)
    W0, b0 = (np.array(p, copy=True) for p in params)
    n = len(y)
    rng = np.random.default_rng(seed)
    target = y[:, None] if task == "regression" else np.eye(W.shape[1])[y]
    with np.errstate(over="ignore", invalid="ignore"):  # divergence shows as a non-finite loss
        for _ in range(epochs):
            order = rng.permutation(n)
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                z = X[idx] @ W + b
                out = z if task == "regression" else _softmax(z)
                grad = (out - target[idx]) / len(idx)
                step_w = X[idx].T @ grad + l2 * W
                step_b = grad.sum(axis=0)
                if mu:
                    step_w += mu * (W - W0)
                    step_b += mu * (b - b0)
                W -= learning_rate * step_w
                b -= learning_rate * step_b
        loss, _ = loss_and_accuracy([W, b], X, y, task=task)
    return [W, b], loss


# ---------------------------------------------------------------------------------------------
# Contribution: coalition models rebuilt from the logged rounds (no retraining)
# ---------------------------------------------------------------------------------------------

#: Per-round coalition models are added to the one evaluation message only while the message holds
#: at most this many models in all (whole run + every round).
MAX_COALITION_MODELS = 8192


@dataclass
class RoundLog:
    """One FedAvg round as the ServerApp saw it.

    ``start``: the round's starting global weights (list of arrays, one per layer);
    ``updates``: player index → the full weights that player returned (same shapes);
    ``examples``: player index → training examples it used (> 0). Players that did not reply
    this round are absent.
    """

    start: list[np.ndarray]
    updates: dict[int, list[np.ndarray]]
    examples: dict[int, int]


def fedavg_delta(log: RoundLog, coalition: frozenset[int]) -> list[np.ndarray]:
    """The coalition's example-weighted FedAvg step of one round, as a delta from ``log.start``.

    ``Δ_S = Σ_{i∈S'} n_i (w_i − w_start) / Σ_{i∈S'} n_i`` over the members ``S'`` of ``S`` that
    replied this round; zeros when none did (the coalition's model does not move).
    """
    members = sorted(i for i in coalition if i in log.updates)
    if not members:
        return [np.zeros_like(layer, dtype=np.float64) for layer in log.start]
    total = float(sum(log.examples[i] for i in members))
    delta = [np.zeros_like(layer, dtype=np.float64) for layer in log.start]
    for i in members:
        share = log.examples[i] / total
        for acc, new, old in zip(delta, log.updates[i], log.start, strict=True):
            acc += share * (np.asarray(new, dtype=np.float64) - old)
    return delta


def coalition_run_model(
    initial: list[np.ndarray], rounds: list[RoundLog], coalition: frozenset[int]
) -> list[np.ndarray]:
    """The model coalition ``S`` would have reached, rebuilt from the logged rounds.

    Song, Tong & Wei (2019, "Profit Allocation for Federated Learning", IEEE Big Data, the "MR"
    reconstruction): ``w^S_0 = initial``, ``w^S_t = w^S_{t−1} + Δ_S^t`` with ``Δ_S^t`` the FedAvg
    delta of ``S``'s members' round-``t`` updates (:func:`fedavg_delta`). The full coalition gives
    back the real final global model; the empty one the initial model. Shapes as ``initial``.
    """
    weights = [np.array(layer, dtype=np.float64, copy=True) for layer in initial]
    for log in rounds:
        for acc, step in zip(weights, fedavg_delta(log, coalition), strict=True):
            acc += step
    return weights


def coalition_round_model(log: RoundLog, coalition: frozenset[int]) -> list[np.ndarray]:
    """Round-level coalition model ``w_{t−1} + Δ_S^t`` (per-round Shapley, as GTG-Shapley does)."""
    return [
        start + step for start, step in zip(log.start, fedavg_delta(log, coalition), strict=True)
    ]


def coalition_models(
    initial: list[np.ndarray],
    rounds: list[RoundLog],
    coalition: frozenset[int],
    *,
    with_rounds: bool,
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """:func:`coalition_run_model` and, with ``with_rounds``, every :func:`coalition_round_model`
    of ``coalition`` (else ``[]``), computing each round's FedAvg delta once for both."""
    weights = [np.array(layer, dtype=np.float64, copy=True) for layer in initial]
    per_round = []
    for log in rounds:
        step = fedavg_delta(log, coalition)
        if with_rounds:
            per_round.append([start + d for start, d in zip(log.start, step, strict=True)])
        for acc, d in zip(weights, step, strict=True):
            acc += d
    return weights, per_round


def stack_models(models: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Stack K models layer by layer: layer ``j`` becomes one array of shape ``(K, *shape_j)``."""
    return [np.stack([m[j] for m in models]) for j in range(len(models[0]))]


def unstack_models(stacked: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Inverse of :func:`stack_models`: ``K`` models, each a list of layers."""
    count = stacked[0].shape[0]
    return [[layer[k] for layer in stacked] for k in range(count)]
