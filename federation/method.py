"""A job's method as the portal names it: the model, the strategy, differential privacy and
secure aggregation, in words and as a JSON-ready document (no Django).

One function per part, so every page and export says the same: the job page (through the
``FederatedJob`` properties of the same names) and the credit statement
(``accounting.selectors.credit``, its page, JSON and text exports). The model and strategy lines
come from the Flower App's own tables (``frp_flwr.models.describe_model``,
``frp_flwr.strategies.describe_strategy``); ε comes from the portal's accountant at submission
(``FederatedJob.epsilon``, ``federation.privacy``). The functions take any object with a
``FederatedJob``'s fields: this module imports no model.
"""

from __future__ import annotations

from typing import Any

from frp_flwr.choices import number_text

#: Differential privacy modes (``frp_flwr.contract.DP_MODES`` but ``off``) as pages name them:
#: Flower's ``DifferentialPrivacyServerSideFixedClipping`` / ``…ClientSideFixedClipping``.
DP_MODE_LABELS = {
    "server": "server-side fixed clipping",
    "client": "client-side fixed clipping",
}
#: What a job with ``secure_aggregation`` ran (``frp_flwr.secagg``, Flower's SecAgg+ workflow).
SECAGG_LABEL = "SecAgg+"
#: Trees are always bagged with Flower's FedXgbBagging, whatever the stored strategy says.
TREES_STRATEGY = "fedxgbbagging"
TREES_STRATEGY_TEXT = "FedXgbBagging (every site's new trees appended each round)"


def _model_spec(job) -> dict[str, Any]:
    return dict(job.model_spec or {"kind": "linear"})


def _strategy_spec(job) -> dict[str, Any]:
    return dict(job.strategy_spec or {"name": "fedavg"})


def _is_trees(job) -> bool:
    return _model_spec(job).get("kind") == "xgboost"


def model_text(job) -> str:
    """The model and its hyper-parameters in one line, e.g. ``"logistic (softmax) regression"``,
    ``"multilayer perceptron (hidden 16, relu, dropout 0, L2 0.0001)"``."""
    from frp_flwr.models import describe_model

    return describe_model(_model_spec(job), task=job.task)


def strategy_text(job) -> str:
    """The strategy and its parameters in one line, e.g. ``"FedProx (μ = 0.1)"``."""
    from frp_flwr.strategies import describe_strategy

    if _is_trees(job):
        return TREES_STRATEGY_TEXT
    return describe_strategy(_strategy_spec(job))


def dp_on(job) -> bool:
    """The job runs with differential privacy: the accountant stated an ε at submission."""
    return job.epsilon is not None


def dp_mode(job) -> str:
    """``"server"`` or ``"client"`` (a key of :data:`DP_MODE_LABELS`); ``""`` when dp is off."""
    if not dp_on(job):
        return ""
    return "client" if (job.privacy or {}).get("dp") == "client" else "server"


def dp_text(job) -> str:
    """The mode in words, ``"server-side fixed clipping"``; ``""`` when dp is off."""
    return DP_MODE_LABELS.get(dp_mode(job), "")


def delta(job) -> float:
    """The δ at which the job's ε is stated (``contract.Privacy`` default 1e-5)."""
    return float((job.privacy or {}).get("delta", 1e-5))


def epsilon_text(epsilon: float, delta: float) -> str:
    """``"ε = 2.91 at δ = 1e-5"``: ε to 3 significant digits, δ in its shortest form."""
    return f"ε = {epsilon:.3g} at δ = {number_text(float(delta))}"


def privacy_text(job) -> str:
    """``"ε = 2.91 at δ = 1e-5, server-side fixed clipping"``; ``""`` when dp is off."""
    if not dp_on(job):
        return ""
    return f"{epsilon_text(job.epsilon, delta(job))}, {dp_text(job)}"


def training_text(rounds: int, local_epochs: int | None, learning_rate: float | None) -> str:
    """``"5 rounds, 5 local epochs, site learning rate 0.1"`` (trees: ``"4 rounds"``)."""
    parts = [f"{rounds} round{'' if rounds == 1 else 's'}"]
    if local_epochs is not None:
        parts.append(f"{local_epochs} local epoch{'' if local_epochs == 1 else 's'}")
    if learning_rate is not None:
        parts.append(f"site learning rate {number_text(float(learning_rate))}")
    return ", ".join(parts)


def method_document(job) -> dict[str, Any]:
    """The job's method with stable machine keys, for exports (the credit statement's JSON).

    Shape::

        {"task": "classification" | "regression",
         "model": {"kind": "linear" | "mlp" | "xgboost", "params": {name: value},
                   "description": str},
         "strategy": {"name": "fedavg" | "fedprox" | … | "fedxgbbagging",
                      "params": {name: value}, "description": str},
         "training": {"rounds": int, "local_epochs": int | None,
                      "learning_rate": float | None,    # None for trees; the sites' rate
                      "description": str},              # training_text
         "privacy": {"mode": "server" | "client", "epsilon": float, "delta": float,
                     "noise_multiplier": float, "clipping_norm": float,
                     "description": str} | None,        # None: no differential privacy
         "secure_aggregation": bool}

    ``params`` are the stored spec without its ``kind``/``name`` (Flower's parameter names);
    ``learning_rate`` is the rate the sites train with (FedOpt's ``eta_l`` replaces the job's,
    ``frp_flwr.strategies.client_settings``).
    """
    from frp_flwr.strategies import client_settings, strategy_params

    model = _model_spec(job)
    trees = _is_trees(job)
    strategy = _strategy_spec(job)
    privacy = job.privacy or {}
    epochs = None if trees else job.local_epochs
    rate = None if trees else client_settings(strategy, float(job.learning_rate))[0]
    return {
        "task": job.task,
        "model": {
            "kind": model.get("kind", "linear"),
            "params": {k: v for k, v in model.items() if k != "kind"},
            "description": model_text(job),
        },
        "strategy": {
            "name": TREES_STRATEGY if trees else strategy.get("name", "fedavg"),
            "params": {} if trees else strategy_params(strategy),
            "description": strategy_text(job),
        },
        "training": {
            "rounds": job.num_rounds,
            "local_epochs": epochs,
            "learning_rate": rate,
            "description": training_text(job.num_rounds, epochs, rate),
        },
        "privacy": {
            "mode": dp_mode(job),
            "epsilon": float(job.epsilon),
            "delta": delta(job),
            "noise_multiplier": float(privacy.get("noise_multiplier", 0.0)),
            "clipping_norm": float(privacy.get("clipping_norm", 0.0)),
            "description": privacy_text(job),
        }
        if dp_on(job)
        else None,
        "secure_aggregation": bool(job.secure_aggregation),
    }
