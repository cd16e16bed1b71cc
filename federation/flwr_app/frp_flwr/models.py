"""The model registry of the portal's Flower App: which model a job trains, and how.

A job's ``model`` (``JobSpec.model``, JSON ``{"kind": …, …hyper-parameters}``) names one of
:data:`MODEL_KINDS`:

- ``linear`` — today's softmax / linear regression (``frp_flwr.task``), the default;
- ``mlp`` — a small multilayer perceptron in numpy: ``hidden`` (layer widths), ``activation``
  (``relu`` or ``tanh``), ``dropout`` (inverted dropout on hidden units while training), ``l2``;
- ``xgboost`` — gradient-boosted trees (XGBoost), bagged across sites with Flower's
  ``FedXgbBagging`` (``frp_flwr.trees``, ADR 0023): the hyper-parameters of
  :data:`XGBOOST_PARAMS`. Its "weights" are the booster's JSON bytes (one ``uint8`` array,
  :class:`TreesModel`); the ClientApp and ServerApp hand its training and bagging to
  ``frp_flwr.trees``, and the strategy is always FedXgbBagging.

Both are trained by mini-batch SGD on standardised features; both take FedProx's proximal term
``μ/2·‖w − w_global‖²`` (Li et al. 2020, "Federated Optimization in Heterogeneous Networks") in the
client's local objective when the job's strategy asks for it. numpy, not PyTorch: every Flower
message starts a new ClientApp process, and the import cost and install size measured in ADR 0022
rule torch out for models this small.

Import cost matters here: this module imports numpy only (the ClientApp imports it per message).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from frp_flwr.choices import (  # noqa: F401 — the registry's tables, validated in one place
    ACTIVATIONS,
    DEFAULT_MODEL,
    MAX_HIDDEN_LAYERS,
    MAX_HIDDEN_UNITS,
    MLP_DEFAULTS,
    MODEL_KINDS,
    TREE_KINDS,
    XGBOOST_PARAMS,
    ModelSpecError,
    _number,
    _read_xgboost,
    read_model_spec,
)


def describe_model(spec: Mapping[str, Any], *, task: str = "classification") -> str:
    """One line naming the model and its hyper-parameters, for the job page and credit statement."""
    kind = spec.get("kind", "linear")
    if kind == "linear":
        return "linear regression" if task == "regression" else "logistic (softmax) regression"
    if kind == "mlp":
        hidden = "×".join(str(h) for h in spec.get("hidden", MLP_DEFAULTS["hidden"]))
        return (
            f"multilayer perceptron (hidden {hidden}, {spec.get('activation', 'relu')}, "
            f"dropout {float(spec.get('dropout', 0.0)):g}, L2 {float(spec.get('l2', 1e-4)):g})"
        )
    if kind == "xgboost":
        params = ", ".join(
            f"{name} {spec.get(name, default):g}"
            for name, (_, default, _, _) in XGBOOST_PARAMS.items()
        )
        return f"gradient-boosted trees (XGBoost, bagged; {params})"
    return str(kind)


# ---------------------------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------------------------


def parameter_count(spec: Mapping[str, Any], *, num_features: int, num_outputs: int) -> int:
    """The numbers in a model of ``spec`` with ``num_features`` inputs and ``num_outputs``
    outputs (classes; 1 for regression): weights and biases of every layer (the shapes of
    ``init_params``). Trees: 0 (a booster is bytes, not weights)."""
    kind = dict(spec or {}).get("kind", "linear")
    if kind in TREE_KINDS:
        return 0
    hidden = list(read_model_spec(spec)["hidden"]) if kind == "mlp" else []
    sizes = [max(0, num_features), *hidden, max(1, num_outputs)]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _proximal(params: list[np.ndarray], anchor: list[np.ndarray] | None, mu: float):
    """FedProx's gradient ``μ (w − w_global)`` per layer, or ``None`` when off."""
    if not mu or anchor is None:
        return None
    return [mu * (p - a) for p, a in zip(params, anchor, strict=True)]


class LinearModel:
    """Softmax regression (classification) or linear regression, ``params = [W (d, K), b (K,)]``:
    the functions of ``frp_flwr.task`` (Bishop 2006, §4.3.4)."""

    kind = "linear"

    def __init__(self, spec: Mapping[str, Any] | None = None) -> None:
        self.spec = dict(spec or DEFAULT_MODEL)

    def init_params(self, num_features: int, num_outputs: int, *, seed: int = 0):
        """Zero weights ``[W (d, K), b (K,)]`` (a convex problem needs no random start)."""
        from frp_flwr.task import init_params

        return init_params(num_features, num_outputs)

    def outputs(self, params: list[np.ndarray], X: np.ndarray) -> np.ndarray:
        """Raw outputs ``(n, K)``: logits (classification) or predictions (regression)."""
        W, b = params
        return X @ W + b

    def train(self, params, X, y, *, epochs, learning_rate, batch_size, seed, task, mu=0.0):
        """``task.train_sgd`` with FedProx's term ``mu``; returns ``(params, loss after)``."""
        from frp_flwr.task import train_sgd

        return train_sgd(
            params,
            X,
            y,
            epochs=epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            task=task,
            mu=mu,
        )


@dataclass
class _Cache:
    activations: list[np.ndarray]  # input and every hidden layer's output (after dropout)
    masks: list[np.ndarray | None]  # dropout masks (scaled), per hidden layer


class MLPModel:
    """A multilayer perceptron ``params = [W1 (d, h1), b1 (h1,), …, W_out (h_L, K), b_out (K,)]``.

    Hidden layers: ``activation`` (ReLU or tanh), inverted dropout with rate ``dropout`` while
    training (none at prediction); output: softmax + cross-entropy (classification) or identity +
    half squared error (regression, ``K = 1``); ``l2``·Σ‖W‖²/2 on the weight matrices. Gradients by
    back-propagation (Goodfellow, Bengio & Courville, *Deep Learning*, 2016, §6.5). Initial weights:
    He-uniform for ReLU, Glorot-uniform for tanh (Glorot & Bengio 2010; He et al. 2015), seeded, biases
    zero — the ServerApp draws them once; every site starts from the same global model.
    """

    kind = "mlp"

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = read_model_spec(spec)
        self.hidden = list(self.spec["hidden"])
        self.activation = self.spec["activation"]
        self.dropout = float(self.spec["dropout"])
        self.l2 = float(self.spec["l2"])

    def init_params(self, num_features: int, num_outputs: int, *, seed: int = 0):
        """Seeded random weights and zero biases, shapes as the class docstring."""
        rng = np.random.default_rng(seed)
        sizes = [num_features, *self.hidden, num_outputs]
        params = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            if self.activation == "relu":
                limit = math.sqrt(6.0 / max(1, fan_in))
            else:
                limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
            params += [rng.uniform(-limit, limit, (fan_in, fan_out)), np.zeros(fan_out)]
        return params

    def _act(self, z: np.ndarray) -> np.ndarray:
        return np.maximum(z, 0.0) if self.activation == "relu" else np.tanh(z)

    def _act_grad(self, a: np.ndarray) -> np.ndarray:
        """Derivative of the activation from its output ``a``."""
        return (a > 0).astype(a.dtype) if self.activation == "relu" else 1.0 - a * a

    def _forward(self, params, X, rng: np.random.Generator | None):
        acts, masks = [X], []
        h = X
        layers = len(params) // 2
        for j in range(layers - 1):
            h = self._act(h @ params[2 * j] + params[2 * j + 1])
            mask = None
            if rng is not None and self.dropout > 0:
                mask = (rng.random(h.shape) >= self.dropout) / (1.0 - self.dropout)
                h = h * mask
            acts.append(h)
            masks.append(mask)
        out = h @ params[-2] + params[-1]
        return out, _Cache(acts, masks)

    def outputs(self, params: list[np.ndarray], X: np.ndarray) -> np.ndarray:
        """Raw outputs ``(n, K)`` without dropout: logits or regression predictions."""
        return self._forward(params, X, None)[0]

    def loss_and_grads(self, params, X, y, *, task, rng=None, anchor=None, mu=0.0):
        """Mean loss (cross-entropy in nats, or half the squared error) + ``l2``·Σ‖W‖²/2
        (+ ``μ/2``·‖w − anchor‖²) and its gradient per parameter (same shapes as ``params``).
        ``rng`` set: dropout masks drawn from it (training); ``None``: no dropout."""
        out, cache = self._forward(params, X, rng)
        n = max(1, len(y))
        if task == "regression":
            err = out[:, 0] - y
            loss = 0.5 * float(np.mean(err * err))
            delta = err[:, None] / n
        else:
            p = _softmax(out)
            loss = float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-300, None)).mean())
            delta = p.copy()
            delta[np.arange(len(y)), y] -= 1.0
            delta /= n
        loss += 0.5 * self.l2 * sum(float(np.sum(W * W)) for W in params[0::2])
        grads: list[np.ndarray] = [np.empty(0)] * len(params)
        layers = len(params) // 2
        for j in reversed(range(layers)):
            a_in = cache.activations[j]
            grads[2 * j] = a_in.T @ delta + self.l2 * params[2 * j]
            grads[2 * j + 1] = delta.sum(axis=0)
            if j > 0:
                back = delta @ params[2 * j].T
                mask = cache.masks[j - 1]
                if mask is not None:
                    back = back * mask
                    # the activation's derivative from the pre-dropout output
                    a_pre = np.divide(a_in, mask, out=np.zeros_like(a_in), where=mask != 0)
                else:
                    a_pre = a_in
                delta = back * self._act_grad(a_pre)
        prox = _proximal(params, anchor, mu)
        if prox is not None:
            loss += (
                0.5
                * mu
                * sum(float(np.sum((p - a) ** 2)) for p, a in zip(params, anchor, strict=True))
            )
            grads = [g + d for g, d in zip(grads, prox, strict=True)]
        return loss, grads

    def train(self, params, X, y, *, epochs, learning_rate, batch_size, seed, task, mu=0.0):
        """Mini-batch SGD from ``params`` (``epochs`` passes, shuffled by ``seed``), FedProx's term
        ``mu`` anchored at the received global weights. Returns ``(params, loss after)`` with the
        loss of :func:`loss_and_accuracy` (no dropout, no penalty)."""
        anchor = [np.array(p, dtype=np.float64, copy=True) for p in params]
        weights = [np.array(p, dtype=np.float64, copy=True) for p in params]
        rng = np.random.default_rng(seed)
        n = len(y)
        with np.errstate(over="ignore", invalid="ignore"):
            for _ in range(epochs):
                order = rng.permutation(n)
                for start in range(0, n, batch_size):
                    idx = order[start : start + batch_size]
                    _, grads = self.loss_and_grads(
                        weights, X[idx], y[idx], task=task, rng=rng, anchor=anchor, mu=mu
                    )
                    for w, g in zip(weights, grads, strict=True):
                        w -= learning_rate * g
            loss, _ = loss_and_accuracy(self, weights, X, y, task=task)
        return weights, loss


class TreesModel:
    """Gradient-boosted trees (``kind = "xgboost"``): the global model is the booster's JSON bytes
    as ONE ``uint8`` array (empty before round 1). Training, bagging and prediction are
    ``frp_flwr.trees``'s (XGBoost, Flower's ``FedXgbBagging``); this registry entry gives the
    ServerApp the initial model and the hyper-parameters, complete."""

    kind = "xgboost"

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = read_model_spec(spec)

    def init_params(self, num_features: int, num_outputs: int, *, seed: int = 0):
        """The empty booster ``[uint8 array of length 0]`` (no tree yet; shapes do not depend
        on ``num_features`` / ``num_outputs``)."""
        return [np.zeros(0, dtype=np.uint8)]


def model_for(spec: Mapping[str, Any] | None) -> LinearModel | MLPModel | TreesModel:
    """The model object of a (validated) model spec; ``None`` or ``{}`` is the linear model.
    Raises :class:`ModelSpecError` for a kind this registry does not hold."""
    spec = dict(spec or DEFAULT_MODEL)
    kind = spec.get("kind", "linear")
    if kind == "linear":
        return LinearModel(spec)
    if kind == "mlp":
        return MLPModel(spec)
    if kind == "xgboost":
        return TreesModel(spec)
    raise ModelSpecError(f"model.kind: no model {str(kind)[:40]!r} in this app")


def predict_proba(model, params: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    """Class probabilities ``(n, K)`` of a classifier on standardised ``X``."""
    return _softmax(model.outputs(params, X))


def predict(model, params: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    """A regressor's predictions ``(n,)`` in standardised target units."""
    return model.outputs(params, X)[:, 0]


def loss_and_accuracy(
    model, params: list[np.ndarray], X: np.ndarray, y: np.ndarray, *, task: str = "classification"
) -> tuple[float, float]:
    """Classification: mean cross-entropy (nats) and accuracy (0..1); regression: mean squared
    error (standardised target units) and 0.0 — as ``task.loss_and_accuracy``, for any model."""
    if len(y) == 0:
        return 0.0, 0.0
    if task == "regression":
        return float(np.square(predict(model, params, X) - y).mean()), 0.0
    p = predict_proba(model, params, X)
    loss = float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())
    return loss, float((p.argmax(axis=1) == y).mean())
