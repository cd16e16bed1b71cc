"""The aggregation strategies a job may choose, all Flower's own classes (flwr 1.42).

A job's ``strategy`` (``JobSpec.strategy``, JSON ``{"name": …, …params}``) names one of
:data:`STRATEGIES`, with Flower's parameter names and defaults:

=============== ========================================== ================================
name            Flower class (``flwr.serverapp.strategy``)  parameters
=============== ========================================== ================================
fedavg          ``FedAvg`` (McMahan et al. 2017)            —
fedprox         ``FedProx`` (Li et al. 2020)                ``mu`` (proximal term, at sites)
fedadam         ``FedAdam`` (Reddi et al. 2021)             ``eta``, ``eta_l``, ``tau``, ``beta_1``, ``beta_2``
fedyogi         ``FedYogi`` (Reddi et al. 2021)             ``eta``, ``eta_l``, ``tau``, ``beta_1``, ``beta_2``
fedadagrad      ``FedAdagrad`` (Reddi et al. 2021)          ``eta``, ``eta_l``, ``tau``
fedmedian       ``FedMedian`` (Yin et al. 2018)             —
fedtrimmedavg   ``FedTrimmedAvg`` (Yin et al. 2018)         ``beta`` (cut per tail, [0, 0.5))
krum            ``Krum`` (Blanchard et al. 2017)            ``num_malicious_nodes``
=============== ========================================== ================================

The ServerApp runs its own round loop (ADR 0006) and calls only the strategy's
``aggregate_train`` / ``aggregate_evaluate`` (:func:`aggregate_train` first sets FedOpt's
``current_arrays``, which Flower's ``configure_train`` would). FedProx's ``mu`` and FedOpt's
``eta_l`` (the clients' learning rate) act at the sites: the ClientApp reads them from the job
spec (:func:`client_settings`).

Contribution (ADR 0010, 0022): coalition models are rebuilt from the logged updates by
*re-applying the job's own aggregator* to the coalition's members' updates (:func:`coalition_models`),
replaying a fresh strategy per coalition (FedOpt's server moments then follow the coalition's own
trajectory). The full coalition gives back the real run's model exactly.

This module imports no Flower at import time (the ClientApp and the portal read the tables).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from frp_flwr.choices import (  # noqa: F401 — the strategy tables, validated in one place
    DEFAULT_STRATEGY,
    FEDOPT,
    LABELS,
    PARAM_LABELS,
    SECURE_SUM_STRATEGIES,
    STRATEGIES,
    StrategySpecError,
    krum_problem,
    number_text,
    read_strategy_spec,
    secagg_problem,
)
from frp_flwr.contract import released


def strategy_params(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The strategy's parameters in ``spec`` (without ``name``), in the table's order."""
    name = spec.get("name", "fedavg")
    return {k: spec[k] for k in STRATEGIES.get(name, ("", {}))[1] if k in spec}


def describe_strategy(spec: Mapping[str, Any]) -> str:
    """The strategy and its parameters in one line, for the job page and the credit statement:
    ``"FedAvg"``, ``"FedProx (μ = 0.1)"``, ``"FedAdam (server learning rate 0.01, site learning
    rate 0.1, τ = 1e-9, β₁ = 0.9, β₂ = 0.99)"`` (labels: :data:`PARAM_LABELS`)."""
    name = spec.get("name", "fedavg")
    params = strategy_params(spec)
    label = LABELS.get(name, str(name))
    if not params:
        return label
    words = (PARAM_LABELS.get(k, k + " {}").format(number_text(v)) for k, v in params.items())
    return f"{label} ({', '.join(words)})"


def client_settings(spec: Mapping[str, Any] | None, learning_rate: float) -> tuple[float, float]:
    """What the strategy asks of a site's local training: ``(learning rate, FedProx μ)``.
    FedOpt strategies' ``eta_l`` replaces the run's learning rate (Reddi et al.'s η_l)."""
    spec = dict(spec or DEFAULT_STRATEGY)
    name = spec.get("name", "fedavg")
    mu = float(spec.get("mu", 0.0)) if name == "fedprox" else 0.0
    lr = float(spec.get("eta_l", learning_rate)) if name in FEDOPT else float(learning_rate)
    return lr, mu


def reconstruction_note(spec: Mapping[str, Any] | None) -> str:
    """How the contribution's coalition models are rebuilt under this strategy, and why that is
    sound, for the job page (ADR 0022)."""
    name = dict(spec or DEFAULT_STRATEGY).get("name", "fedavg")
    label = LABELS.get(name, name)
    if name in ("fedavg", "fedprox"):
        return (
            f"Coalition models rebuilt from the logged updates by {label}'s example-weighted "
            "average of the coalition's members (Song et al. 2019)."
        )
    if name in FEDOPT:
        return (
            f"Coalition models rebuilt by replaying {label}'s server optimiser on the coalition's "
            "own averaged updates, with its own moments; per-round values are not computed, "
            "because a round's model depends on the optimiser state of the whole history."
        )
    return (
        f"Coalition models rebuilt by re-applying {label} to the coalition's logged updates "
        "(the robust aggregator is a function of the members' updates only)."
    )


# ---------------------------------------------------------------------------------------------
# Flower objects
# ---------------------------------------------------------------------------------------------


def build_strategy(spec: Mapping[str, Any] | None):
    """The Flower ``Strategy`` of a strategy spec (validated by :func:`read_strategy_spec`),
    with every ``min_*_nodes`` at 1 (the ServerApp decides who takes part). Raises
    :class:`StrategySpecError` on a bad spec."""
    from flwr.serverapp import strategy as fl

    spec = read_strategy_spec(dict(spec or DEFAULT_STRATEGY))
    name = spec["name"]
    cls = getattr(fl, STRATEGIES[name][0])
    kwargs: dict[str, Any] = {
        "min_train_nodes": 1,
        "min_evaluate_nodes": 1,
        "min_available_nodes": 1,
    }
    if name == "fedprox":
        kwargs["proximal_mu"] = spec["mu"]
    else:
        kwargs.update({k: v for k, v in spec.items() if k != "name"})
    return cls(**kwargs)


def aggregate_train(strategy, server_round: int, current, replies):
    """``strategy.aggregate_train(server_round, replies)`` after setting what Flower's
    ``configure_train`` would (FedOpt's ``current_arrays`` := ``current``, the round's global
    ``ArrayRecord``). Returns Flower's ``(ArrayRecord | None, MetricRecord | None)``."""
    inner = strategy
    while hasattr(inner, "strategy"):  # Flower's DP wrappers keep the strategy they wrap
        inner = inner.strategy
    if hasattr(inner, "current_arrays"):
        inner.current_arrays = {k: a.numpy() for k, a in current.items()}
    return strategy.aggregate_train(server_round, list(replies))


def weigh_by_released(strategy, replies):
    """Set, in place, each train reply's weighting metric (the inner strategy's
    ``weighted_by_key``, FedAvg's ``num-examples``) to the site's training examples **as
    released** (``contract.released``: the nearest multiple of 5, 4 for 1–7); returns
    ``replies`` (a list of Flower ``Message``).

    Why (issue 9; ADR 0010, 0036 amendment): every site receives the global model each round and,
    in the closing evaluation, the coalition models; weighted by exact counts,
    ``(M{a,b} − M{b}) / (M{a} − M{b})`` is ``n_a / (n_a + n_b)``, so a site solves another's
    training rows from what it is sent. Weighted by released counts, what a site can solve is
    the released counts, which researchers already see. The weights move by at most 2 rows in
    5 (or 3 of 1–7): FedAvg's mean is any convex combination's limit and stays one. The sites'
    exact counts are read before this, from the parsed replies, for metering and checks."""
    replies = list(replies)
    inner = strategy
    while hasattr(inner, "strategy"):  # Flower's DP wrappers keep the strategy they wrap
        inner = inner.strategy
    key = getattr(inner, "weighted_by_key", None)
    if key is None:
        return replies
    for reply in replies:
        for record in reply.content.metric_records.values():
            if key in record:
                record[key] = released(int(record[key]))
    return replies


def aggregate_mean(strategy, server_round: int, current, mean, num_examples: int):
    """The strategy's step from the sites' securely aggregated weighted mean ``mean`` (an
    ``ArrayRecord`` w̄ = Σ n_i·w_i / Σ n_i over ``num_examples`` = Σ n_i rows), as one train reply
    to Flower's ``aggregate_train``: FedAvg/FedProx give w̄ back; FedOpt takes w̄ − ``current`` as
    its pseudo-gradient (Reddi et al. 2021, Alg. 2: FedAvg's mean of the replies is exactly w̄).
    Only :data:`SECURE_SUM_STRATEGIES` may be used: raises ``StrategySpecError`` for the others.
    Returns Flower's ``(ArrayRecord | None, MetricRecord | None)``."""
    name = next((n for n, (cls, _) in STRATEGIES.items() if cls == type(strategy).__name__), "")
    if name not in SECURE_SUM_STRATEGIES:
        raise StrategySpecError(secagg_problem({"name": name}) or "unknown strategy")
    weights = [np.asarray(a, dtype=np.float64) for a in mean.to_numpy_ndarrays()]
    return aggregate_train(strategy, server_round, current, [train_reply(weights, num_examples)])


def train_reply(weights: list[np.ndarray], num_examples: int, *, node: int = 0):
    """A logged train reply rebuilt as a Flower ``Message`` (content ``arrays`` + ``metrics``
    with ``num-examples``), for a strategy's ``aggregate_train`` outside a run."""
    from flwr.app import ArrayRecord, Message, Metadata, MetricRecord, RecordDict

    content = RecordDict(
        {
            "arrays": ArrayRecord([np.asarray(a) for a in weights]),
            "metrics": MetricRecord({"num-examples": int(num_examples)}),
        }
    )
    meta = Metadata(
        run_id=0,
        message_id="",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id="",
        group_id="",
        created_at=0.0,
        ttl=0.0,
        message_type="train",
    )
    return Message(content, metadata=meta)


def _replay_step(strategy, server_round: int, current: list[np.ndarray], updates, examples):
    """One round of ``strategy`` from ``current`` on ``updates`` (list of weights lists)."""
    from flwr.app import ArrayRecord

    replies = [train_reply(u, n) for u, n in zip(updates, examples, strict=True)]
    arrays, _ = aggregate_train(strategy, server_round, ArrayRecord(current), replies)
    return [np.asarray(a, dtype=np.float64) for a in arrays.to_numpy_ndarrays()]


def coalition_models(spec, initial, rounds, coalition: frozenset[int], *, with_rounds: bool):
    """``task.coalition_models`` under the job's strategy: ``(run model, per-round models)``.

    FedAvg / FedProx: ``task.coalition_models`` (example-weighted FedAvg delta). Others: a fresh
    Flower strategy per coalition replays every round ``t`` on the members' updates shifted to the
    coalition's own model, ``w^S_{t−1} + (w_i^t − w_{t−1})``; a round in which no member replied
    leaves the model where it is. Per-round models (``with_rounds``) are ``w_{t−1} + agg(S)`` for
    the stateless robust aggregators and are not computed (``[]``) for FedOpt (ADR 0022).
    Shapes as ``initial`` (list of float64 arrays).
    """
    from frp_flwr import task

    spec = read_strategy_spec(dict(spec or DEFAULT_STRATEGY))
    if spec["name"] in ("fedavg", "fedprox"):
        return task.coalition_models(initial, rounds, coalition, with_rounds=with_rounds)
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.WARNING)  # Flower logs every aggregation at INFO
    try:
        strategy = build_strategy(spec)
        weights = [np.array(layer, dtype=np.float64, copy=True) for layer in initial]
        per_round: list[list[np.ndarray]] = []
        stateless = spec["name"] not in FEDOPT
        for t, log in enumerate(rounds, start=1):
            members = sorted(i for i in coalition if i in log.updates)
            if not members:
                if with_rounds and stateless:
                    per_round.append([np.array(s, dtype=np.float64) for s in log.start])
                continue
            counts = [log.examples[i] for i in members]
            if with_rounds and stateless:
                per_round.append(
                    _replay_step(
                        build_strategy(spec),
                        t,
                        log.start,
                        [log.updates[i] for i in members],
                        counts,
                    )
                )
            shifted = [
                [
                    w + (np.asarray(u, dtype=np.float64) - s)
                    for w, u, s in zip(weights, upd, log.start, strict=True)
                ]
                for upd in (log.updates[i] for i in members)
            ]
            weights = _replay_step(strategy, t, weights, shifted, counts)
    finally:
        flwr_log.setLevel(level)
    return weights, per_round
