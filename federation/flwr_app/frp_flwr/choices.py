"""The model and strategy choices a job may make, and their validation — one leaf module.

The contract (``frp_flwr.contract``) reads a job spec's ``model`` and ``strategy`` with
:func:`read_model_spec` and :func:`read_strategy_spec`; the model registry (``frp_flwr.models``)
and the strategy factory (``frp_flwr.strategies``) build on the same tables. This module imports
nothing of the app's own, so the contract imports only floors below it (no import circle).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: The model kinds a job may name (another kind may be registered beside these).
MODEL_KINDS = ("linear", "mlp", "xgboost")
#: Kinds trained as trees (``frp_flwr.trees``), not as weights by SGD.
TREE_KINDS = ("xgboost",)
#: An old job spec without ``model`` trains this.
DEFAULT_MODEL: dict[str, Any] = {"kind": "linear"}
ACTIVATIONS = ("relu", "tanh")
#: Bounds of the MLP's hyper-parameters (the form and the contract share them).
MAX_HIDDEN_LAYERS = 4
MAX_HIDDEN_UNITS = 1024
MLP_DEFAULTS: dict[str, Any] = {"hidden": [32], "activation": "relu", "dropout": 0.0, "l2": 1e-4}

#: XGBoost's hyper-parameters a job may set (``frp_flwr.trees``): name → (type, default, lo, hi).
#: ``local_rounds``: boosting rounds each site adds per federated round (every one of its trees is
#: bagged into the global booster); ``eta``: learning rate (shrinkage); ``subsample`` and
#: ``colsample_bytree``: the share of rows / columns each tree samples; ``min_child_weight``: the
#: least Hessian sum in a leaf; ``reg_lambda``: L2 penalty on leaf weights. XGBoost's meanings:
#: https://xgboost.readthedocs.io/en/stable/parameter.html
XGBOOST_PARAMS: dict[str, tuple[type, float, float, float]] = {
    "local_rounds": (int, 1, 1, 50),
    "max_depth": (int, 6, 1, 12),
    "eta": (float, 0.3, 1e-4, 1.0),
    "subsample": (float, 1.0, 0.05, 1.0),
    "colsample_bytree": (float, 1.0, 0.05, 1.0),
    "min_child_weight": (float, 1.0, 0.0, 1e6),
    "reg_lambda": (float, 1.0, 0.0, 1e6),
}


class ModelSpecError(ValueError):
    """A model spec that does not fit :func:`read_model_spec` (message names the field)."""


def _number(value: Any, where: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelSpecError(f"{where}: expected a finite number")
    if value < lo or value > hi or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise ModelSpecError(f"{where}: {value!r} is outside {bracket}{lo:g}, {hi:g}]")
    return float(value)


def read_model_spec(raw: Any, where: str = "model") -> dict[str, Any]:
    """Validate a model spec and return it complete (every hyper-parameter, defaults filled in).

    ``raw``: ``{"kind": "linear"}`` or ``{"kind": "mlp", "hidden": [int, …] (1–4 layers of
    1–1024 units), "activation": "relu"|"tanh", "dropout": float in [0, 0.9], "l2": float in
    [0, 1]}`` (absent keys take :data:`MLP_DEFAULTS`) or ``{"kind": "xgboost", …}`` with the
    hyper-parameters of :data:`XGBOOST_PARAMS`, each of its type and in its range (absent keys
    take their defaults). Raises :class:`ModelSpecError` (a ``ValueError``) naming the field on
    an unknown kind, key or a value out of range.
    """
    if not isinstance(raw, Mapping):
        raise ModelSpecError(f"{where}: expected an object")
    kind = raw.get("kind", "linear")
    if kind not in MODEL_KINDS:
        raise ModelSpecError(f"{where}.kind: {str(kind)[:40]!r} is not one of {MODEL_KINDS}")
    if kind == "linear":
        unknown = sorted(set(raw) - {"kind"})
        if unknown:
            raise ModelSpecError(f"{where}: unknown field(s) {unknown} for a linear model")
        return {"kind": "linear"}
    if kind == "xgboost":
        return _read_xgboost(raw, where)
    unknown = sorted(set(raw) - {"kind", *MLP_DEFAULTS})
    if unknown:
        raise ModelSpecError(f"{where}: unknown field(s) {unknown} for an mlp")
    out = {"kind": "mlp", **MLP_DEFAULTS, **{k: v for k, v in raw.items() if k != "kind"}}
    hidden = out["hidden"]
    if not isinstance(hidden, list | tuple) or not 1 <= len(hidden) <= MAX_HIDDEN_LAYERS:
        raise ModelSpecError(f"{where}.hidden: 1 to {MAX_HIDDEN_LAYERS} layer widths")
    for i, h in enumerate(hidden):
        if isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= MAX_HIDDEN_UNITS:
            raise ModelSpecError(f"{where}.hidden[{i}]: a width from 1 to {MAX_HIDDEN_UNITS}")
    out["hidden"] = [int(h) for h in hidden]
    if out["activation"] not in ACTIVATIONS:
        raise ModelSpecError(f"{where}.activation: one of {', '.join(ACTIVATIONS)}")
    out["dropout"] = _number(out["dropout"], f"{where}.dropout", 0.0, 0.9)
    out["l2"] = _number(out["l2"], f"{where}.l2", 0.0, 1.0)
    return out


def _read_xgboost(raw: Mapping, where: str) -> dict[str, Any]:
    unknown = sorted(set(raw) - set(XGBOOST_PARAMS) - {"kind"})
    if unknown:
        raise ModelSpecError(
            f"{where}: unknown xgboost parameter(s) {', '.join(map(repr, unknown))}"
        )
    out: dict[str, Any] = {"kind": "xgboost"}
    for name, (kind_of, default, lo, hi) in XGBOOST_PARAMS.items():
        w = f"{where}.{name}"
        if name not in raw:
            out[name] = default
            continue
        value = raw[name]
        if kind_of is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ModelSpecError(f"{w}: expected an integer")
            if not lo <= value <= hi:
                raise ModelSpecError(f"{w}: {value} is outside {int(lo)}..{int(hi)}")
            out[name] = int(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ModelSpecError(f"{w}: expected a number")
            if not math.isfinite(value):
                raise ModelSpecError(f"{w}: {value} is not a finite number")
            if not lo <= value <= hi:
                raise ModelSpecError(f"{w}: {float(value)} is outside {lo:g}..{hi:g}")
            out[name] = float(value)
    return out


#: name → (Flower class name, {param: (type, default, lo, hi, lo_open, hi_open)}). Defaults are
#: Flower 1.42's, except ``fedprox.mu`` (Flower's 0.0 is plain FedAvg; 0.01 is Li et al.'s grid).
STRATEGIES: dict[str, tuple[str, dict[str, tuple]]] = {
    "fedavg": ("FedAvg", {}),
    "fedprox": ("FedProx", {"mu": (float, 0.01, 0.0, 100.0, False, False)}),
    "fedadam": (
        "FedAdam",
        {
            "eta": (float, 0.1, 0.0, 10.0, True, False),
            "eta_l": (float, 0.1, 0.0, 10.0, True, False),
            "tau": (float, 1e-3, 0.0, 1.0, True, False),
            "beta_1": (float, 0.9, 0.0, 1.0, False, True),
            "beta_2": (float, 0.99, 0.0, 1.0, False, True),
        },
    ),
    "fedyogi": (
        "FedYogi",
        {
            "eta": (float, 0.01, 0.0, 10.0, True, False),
            "eta_l": (float, 0.0316, 0.0, 10.0, True, False),
            "tau": (float, 1e-3, 0.0, 1.0, True, False),
            "beta_1": (float, 0.9, 0.0, 1.0, False, True),
            "beta_2": (float, 0.99, 0.0, 1.0, False, True),
        },
    ),
    "fedadagrad": (
        "FedAdagrad",
        {
            "eta": (float, 0.1, 0.0, 10.0, True, False),
            "eta_l": (float, 0.1, 0.0, 10.0, True, False),
            "tau": (float, 1e-3, 0.0, 1.0, True, False),
        },
    ),
    "fedmedian": ("FedMedian", {}),
    "fedtrimmedavg": ("FedTrimmedAvg", {"beta": (float, 0.2, 0.0, 0.5, False, True)}),
    "krum": ("Krum", {"num_malicious_nodes": (int, 0, 0, 1000, False, False)}),
}
DEFAULT_STRATEGY: dict[str, Any] = {"name": "fedavg"}
#: Server-side optimisers (Reddi et al. 2021): their ``eta_l`` is the sites' learning rate.
FEDOPT = ("fedadam", "fedyogi", "fedadagrad")
#: The strategies that need only the example-weighted mean of the sites' updates, so run under
#: secure aggregation (SecAgg+ gives the ServerApp that mean and nothing else): FedAvg, FedProx
#: (its μ acts at the sites) and FedOpt (the mean minus the global model is its pseudo-gradient,
#: Reddi et al. 2021, Alg. 2). The robust aggregators need each site's update.
SECURE_SUM_STRATEGIES = ("fedavg", "fedprox", *FEDOPT)
#: Labels for forms and pages.
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "fedmedian": "FedMedian",
    "fedtrimmedavg": "FedTrimmedAvg",
    "krum": "Krum",
}
#: How pages and exports name a strategy's parameters (``describe_strategy``; ``{}`` is the
#: value): words where the role is plain (FedOpt's η is the server's learning rate, η_l the
#: sites'), else the papers' symbols.
PARAM_LABELS = {
    "mu": "μ = {}",
    "eta": "server learning rate {}",
    "eta_l": "site learning rate {}",
    "tau": "τ = {}",
    "beta_1": "β₁ = {}",
    "beta_2": "β₂ = {}",
    "beta": "β = {} cut per tail",
    "num_malicious_nodes": "f = {} faulty sites tolerated",
}


def number_text(value: float | int) -> str:
    """A parameter's value as pages print it: the shortest ``%g`` form, exponents without
    padding (``0.1 -> "0.1"``, ``1e-09 -> "1e-9"``, ``3 -> "3"``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    text = f"{value:g}"
    mantissa, e, exponent = text.partition("e")
    if not e:
        return text
    sign = exponent[0] if exponent[0] in "+-" else ""
    return f"{mantissa}e{'-' if sign == '-' else ''}{exponent.lstrip('+-').lstrip('0') or '0'}"


class StrategySpecError(ValueError):
    """A strategy spec that does not fit :func:`read_strategy_spec` (message names the field)."""


def read_strategy_spec(raw: Any, where: str = "strategy") -> dict[str, Any]:
    """Validate a strategy spec and return it complete (every parameter, Flower's defaults
    filled in). Ranges: ``mu`` ∈ [0, 100]; ``eta``, ``eta_l`` ∈ (0, 10]; ``tau`` ∈ (0, 1];
    ``beta_1``, ``beta_2`` ∈ [0, 1); ``beta`` ∈ [0, 0.5); ``num_malicious_nodes`` an integer
    ≥ 0 (``krum_problem`` checks it against the number of sites). Raises
    :class:`StrategySpecError` (a ``ValueError``) naming the field."""
    if not isinstance(raw, Mapping):
        raise StrategySpecError(f"{where}: expected an object")
    name = raw.get("name", "fedavg")
    if name not in STRATEGIES:
        raise StrategySpecError(
            f"{where}.name: {str(name)[:40]!r} is not one of {', '.join(STRATEGIES)}"
        )
    params = STRATEGIES[name][1]
    unknown = sorted(set(raw) - {"name", *params})
    if unknown:
        raise StrategySpecError(f"{where}: unknown field(s) {unknown} for {name}")
    out: dict[str, Any] = {"name": name}
    for key, (kind, default, lo, hi, lo_open, hi_open) in params.items():
        value = raw.get(key, default)
        w = f"{where}.{key}"
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise StrategySpecError(f"{w}: expected an integer")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise StrategySpecError(f"{w}: expected a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise StrategySpecError(f"{w}: expected a finite number")
        if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
            left, right = "(" if lo_open else "[", ")" if hi_open else "]"
            raise StrategySpecError(f"{w}: {value!r} is outside {left}{lo:g}, {hi:g}{right}")
        out[key] = kind(value)
    return out


def krum_problem(spec: Mapping[str, Any], sites: int) -> str:
    """Why Krum cannot tolerate ``num_malicious_nodes`` faulty sites among ``sites`` (``""``: it
    can). Blanchard et al. 2017 (Prop. 1) need ``n > 2f + 2``."""
    if spec.get("name") != "krum":
        return ""
    f = int(spec.get("num_malicious_nodes", 0))
    if sites <= 2 * f + 2:
        return (
            f"Krum tolerates {f} faulty site(s) only with more than {2 * f + 2} sites "
            f"(this job has {sites})."
        )
    return ""


def secagg_problem(spec: Mapping[str, Any] | None) -> str:
    """Why the strategy cannot run under secure aggregation (``""``: it can). SecAgg+ gives the
    ServerApp only Σ n_i·w_i / Σ n_i; FedMedian, FedTrimmedAvg and Krum rank or select individual
    updates, which a secure sum never reveals (:data:`SECURE_SUM_STRATEGIES` can)."""
    name = dict(spec or DEFAULT_STRATEGY).get("name", "fedavg")
    if name in SECURE_SUM_STRATEGIES:
        return ""
    label = LABELS.get(name, str(name))
    return (
        f"{label} needs each site's update, but secure aggregation gives the server only the "
        "sites' weighted mean. Choose FedAvg, FedProx, FedAdam, FedYogi or FedAdagrad, or turn "
        "secure aggregation off."
    )
