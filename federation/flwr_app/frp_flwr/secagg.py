"""Secure aggregation (SecAgg+) of a job's training step, through Flower's own workflow (ADR 0027).

Protocol: SecAgg+ (Bell, Bonawitz, Gascón, Lepoint, Raykova 2020, "Secure Single-Server Aggregation
with (Poly)Logarithmic Overhead", CCS '20) as Flower 1.42 implements it — server side
``flwr.server.workflow.SecAggPlusWorkflow`` (legacy workflow API: a ``LegacyContext`` holding a
legacy strategy and client manager), site side ``flwr.client.mod.secaggplus_mod``. One training
round is the workflow's four ``train`` exchanges: *setup* (public keys), *share keys* (Shamir shares
of each site's mask seed and key, encrypted to its neighbours), *collect masked vectors* (each site
trains, then uploads its quantised, weighted, masked update), *unmask* (the survivors' shares remove
the masks of the sum). The ServerApp learns only Σ_i n_i·Δ_i / Σ_i n_i, never one site's Δ_i.

What each site sends, and what stays in clear:

- the update is the site's **delta** Δ_i = w_i − w (its locally trained weights minus the round's
  global model), clipped to ``[-clipping_range, clipping_range]`` and quantised by Flower to
  ``quantization_range`` levels; the global model becomes w + the unmasked weighted mean;
- the weight n_i (its training example count) is folded into the masked vector and, like every
  site's metering (train loss, CPU and wall seconds, bytes), also sent **in clear** beside it in the
  legacy ``fitres`` records: what the portal bounds and bills per site (ADR 0024). A site whose clear
  report is out of the portal's bounds (or does not fit the contract, or whose clear count differs
  from its masked weight's) is withheld from the workflow at the collect stage, so SecAgg+ treats it
  as a dropout and removes its masks: its update is not in the sum.

Per-site figures that need an individual update (coalition models, Shapley values, leave-one-out)
are unavailable: a SecAgg job is credited by data volume and compute (``accounting``).

Site side: :func:`secagg_mod`, a ClientApp mod on the ``train`` handler. A message carrying
SecAgg+'s config record goes through ``secaggplus_mod``; at the collect stage the app's own train
handler runs on the global model (converted from the legacy ``fitins`` records) and its weights are
turned into the delta. Any other ``train`` message passes through unchanged.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from frp_flwr.contract import ContractError, JobSpec, TrainReply, released

#: Flower's defaults: deltas clipped to ±8, quantised to 2**22 levels, masks modulo 2**32.
CLIPPING_RANGE = 8.0
QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32
#: Share of a site's neighbours whose shares rebuild its masks when no threshold is given.
DEFAULT_THRESHOLD_FRACTION = 2 / 3


class SecAggError(Exception):
    """The secure aggregation of a round did not complete; the message says why (no site data)."""


@dataclass(frozen=True)
class SecAggParams:
    """A job's SecAgg+ settings (``JobSpec.privacy``): ``num_shares`` shares of each site's secrets
    (0: one per site of the round), of which ``threshold`` rebuild them (0: ⌈2/3⌉ of the shares,
    at least 2); ``clipping_range``: the bound on each coordinate of a site's delta."""

    num_shares: int = 0
    threshold: int = 0
    clipping_range: float = CLIPPING_RANGE

    @classmethod
    def of(cls, spec: JobSpec) -> SecAggParams | None:
        """The settings of ``spec`` when it asks for secure aggregation, else ``None``."""
        privacy = spec.privacy
        if not privacy.secagg:
            return None
        return cls(num_shares=privacy.secagg_num_shares, threshold=privacy.secagg_threshold)

    def workflow(self, *, timeout: float) -> SecAggPlusWorkflow:
        """Flower's workflow with these settings; ``timeout`` (s) bounds each of its 4 exchanges.

        Raises ``ContractError`` when Flower refuses the settings (e.g. threshold ≥ shares)."""
        shares: int | float = self.num_shares or 1.0
        threshold: int | float = self.threshold or DEFAULT_THRESHOLD_FRACTION
        try:
            return SecAggPlusWorkflow(
                num_shares=shares,
                reconstruction_threshold=threshold,
                max_weight=1.0,  # set per round to the largest site's rows (weights ≤ 1)
                clipping_range=self.clipping_range,
                quantization_range=QUANTIZATION_RANGE,
                modulus_range=MODULUS_RANGE,
                timeout=timeout,
            )
        except (TypeError, ValueError) as exc:
            raise ContractError(f"privacy: secure aggregation settings: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Server side
# ---------------------------------------------------------------------------------------------

#: ``screen(node, reply, elapsed seconds) -> problem`` on a collect-stage reply ("" = keep it).
Screen = Callable[[int, Message, float], str]


class _PolledGrid:
    """The grid the workflow talks through: ``send_and_receive`` pushes, then pulls every ``poll``
    seconds (Flower's own sleeps 3 s between pulls), hands every reply to ``on_reply`` (the
    ServerApp's reply log) and, at the collect-masked-vectors stage, withholds the replies
    ``screen`` refuses (the workflow then treats those sites as dropouts). Everything else is the
    wrapped ``Grid``'s."""

    def __init__(self, grid: Grid, *, poll: float, on_reply, screen: Screen) -> None:
        self._grid = grid
        self._poll = poll
        self._on_reply = on_reply
        self._screen = screen
        self.refused: dict[int, str] = {}
        self.silent: dict[str, set[int]] = {}
        self.collected: dict[int, tuple[Message, float]] = {}

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        if not messages:
            return []
        stage = str(messages[0].content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE, ""))
        t0 = time.monotonic()
        ids = list(self._grid.push_messages(messages))
        node_of = {i: m.metadata.dst_node_id for i, m in zip(ids, messages, strict=True) if i}
        pending = set(node_of)
        deadline = t0 + (timeout if timeout is not None else math.inf)
        out: list[Message] = []
        while pending and time.monotonic() < deadline:
            for reply in self._grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                node, elapsed = node_of[mid], time.monotonic() - t0
                self._on_reply(node, reply)
                if stage == Stage.COLLECT_MASKED_VECTORS and not reply.has_error():
                    problem = self._screen(node, reply, elapsed)
                    if problem:
                        self.refused[node] = problem
                        continue
                    self.collected[node] = (reply, elapsed)
                out.append(reply)
            if pending:
                time.sleep(self._poll)
        self.silent[stage] = {node_of[m] for m in pending}
        return out


class _CapturingFedAvg(LegacyFedAvg):
    """Flower's legacy FedAvg over all the round's nodes; the workflow hands it the unmasked
    weighted mean as every result's parameters, so its average is that mean."""

    def __init__(self, n: int, fit_config: dict) -> None:
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=n,
            min_evaluate_clients=0,
            min_available_clients=n,
            on_fit_config_fn=lambda _rnd: dict(fit_config),
        )
        self.aggregated = False

    def aggregate_fit(self, server_round, results, failures):
        out = super().aggregate_fit(server_round, results, failures)
        self.aggregated = out[0] is not None
        return out


@dataclass
class SecureRound:
    """The outcome of :func:`secure_train_round`: the new global model, node → clear metrics of
    the sites whose masked update is in the sum, node → why a site is not."""

    arrays: ArrayRecord
    replies: dict[int, TrainReply] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def clear_metrics(reply: Message) -> TrainReply:
    """The clear part of a collect-stage reply: its ``fitres.metrics`` as the contract's
    :class:`TrainReply`, checked against the example count that weights its masked vector.
    Raises ``ContractError``."""
    try:
        metrics = reply.content.config_records["fitres.metrics"]
        weight = reply.content.metric_records["fitres.num_examples"]["num_examples"]
    except KeyError as exc:
        raise ContractError(f"malformed secure-aggregation reply: no {exc}") from None
    parsed = TrainReply.from_record(metrics, "metrics")
    if weight != released(parsed.num_examples):
        raise ContractError(
            f"weights its masked update by {weight} examples but reports {parsed.num_examples} "
            f"(released: {released(parsed.num_examples)})"
        )
    return parsed


def secure_train_round(
    grid: Grid,
    *,
    params: SecAggParams,
    active: dict[str, int],
    arrays: ArrayRecord,
    fit_config: dict,
    rnd: int,
    max_examples: int,
    timeout: float,
    poll: float,
    on_reply=lambda node, reply: None,
    check: Callable[[int, TrainReply, float], str] | None = None,
) -> SecureRound:
    """One SecAgg+ training round over the nodes of ``active`` (site → node id).

    ``arrays``: the global model (list of float64 layers); ``fit_config``: str/int/float/bool
    values every site's train handler gets (legacy ``FitIns.config``); ``max_examples``: the most
    training rows any site may report (Flower's ``max_weight``, which every site receives, is its
    released count, ``contract.released``: a site weights its update by its own released count,
    and weights / max_weight must stay ≤ 1 or the quantised vector overflows); ``timeout``: seconds per
    exchange (4 per round); ``poll``: seconds between pulls; ``on_reply(node, reply)``: sees every
    reply; ``check(node, clear metrics, elapsed s) -> problem`` bounds a site's clear report
    (a site refused is withheld, so its update is not in the sum).

    Returns the new global model w + Σ n_i Δ_i / Σ n_i and the sites' clear metrics. Raises
    ``SecAggError`` when the workflow halts (fewer than 2 sites, too few shares survive) or fails,
    ``ContractError`` when Flower refuses ``params``.
    """
    nodes = sorted(active.values())
    workflow = params.workflow(timeout=timeout)
    # Every site receives max_weight in the setup stage's config (Flower's Key.MAX_WEIGHT), so it
    # is the released count of the largest site's rows, not the count; a site weights its update
    # by its own released count (secagg_mod), at most that one (the rule is monotone).
    workflow.max_weight = float(max(1, released(max(0, max_examples))))
    global_layers = [np.asarray(a, dtype=np.float64) for a in arrays.to_numpy_ndarrays()]

    def screen(node: int, reply: Message, elapsed: float) -> str:
        try:
            metrics = clear_metrics(reply)
        except ContractError as exc:
            return f"malformed secure-aggregation reply: {exc}"
        if not math.isfinite(metrics.train_loss):
            return "a train loss that is not a finite number (training diverged)"
        if metrics.num_examples > max_examples:
            return f"reported {metrics.num_examples} training examples of at most {max_examples}"
        return check(node, metrics, elapsed) if check else ""

    polled = _PolledGrid(grid, poll=poll, on_reply=on_reply, screen=screen)
    strategy = _CapturingFedAvg(len(nodes), fit_config)
    manager = SimpleClientManager()
    for node in nodes:
        manager.register(GridClientProxy(node_id=node, grid=grid, run_id=0))
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        strategy=strategy,
        client_manager=manager,
    )
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord(global_layers)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
        {WorkflowKey.CURRENT_ROUND: rnd}
    )
    try:
        workflow(polled, context)
    except Exception as exc:  # noqa: BLE001 — Flower's own errors: the round cannot be summed
        raise SecAggError(f"round {rnd}: secure aggregation failed: {exc}") from None
    errors: dict[int, str] = dict(polled.refused)
    for stage, silent in polled.silent.items():
        for node in silent:
            errors.setdefault(node, f"no reply within {timeout:.0f} s (secure aggregation {stage})")
    for node in nodes:
        if node not in polled.collected:
            errors.setdefault(node, "dropped out of the secure aggregation")
    if not strategy.aggregated:
        why = "; ".join(f"node {n}: {e}" for n, e in sorted(errors.items())) or "no reason known"
        raise SecAggError(
            f"round {rnd}: secure aggregation halted: {len(polled.collected)} of {len(nodes)} "
            f"sites sent a masked update and enough shares to unmask the sum are needed ({why})"
        )
    mean = context.state.array_records[MAIN_PARAMS_RECORD].to_numpy_ndarrays()
    if [a.shape for a in mean] != [a.shape for a in global_layers]:
        raise SecAggError(f"round {rnd}: the unmasked sum does not have the model's shapes")
    new = [g + np.asarray(d, dtype=np.float64) for g, d in zip(global_layers, mean, strict=True)]
    return SecureRound(
        arrays=ArrayRecord(new),
        replies={n: clear_metrics(r) for n, (r, _) in polled.collected.items()},
        errors={n: e for n, e in errors.items() if n not in polled.collected},
    )


# ---------------------------------------------------------------------------------------------
# Site side
# ---------------------------------------------------------------------------------------------


def _legacy_to_plain(content: RecordDict) -> tuple[RecordDict, list[np.ndarray]]:
    """The app's own train content (``arrays`` + ``config``) from legacy ``fitins`` records."""
    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    layers = parameters_to_ndarrays(fitins.parameters)
    config = ConfigRecord(dict(fitins.config))
    return RecordDict({"arrays": ArrayRecord(layers), "config": config}), layers


def secagg_mod(msg: Message, ctxt: Context, call_next) -> Message:
    """ClientApp mod of the ``train`` handler: SecAgg+ messages through ``secaggplus_mod``.

    At the collect stage the app's train handler (``call_next``) runs on the legacy ``fitins``
    content turned into its own (``arrays``, ``config``); its reply's weights w_i become the
    delta w_i − w (float64 layers) in a legacy ``fitres`` with ``num_examples`` and the clear
    ``metrics`` record, which ``secaggplus_mod`` masks (arrays) and forwards (metrics). Other
    messages pass through unchanged.
    """
    if (
        msg.metadata.message_type != MessageType.TRAIN
        or RECORD_KEY_CONFIGS not in msg.content.config_records
    ):
        return call_next(msg, ctxt)

    def train_delta(inner: Message, context: Context) -> Message:
        plain, start = _legacy_to_plain(inner.content)
        inner.content = plain
        reply = call_next(inner, context)
        if reply.has_error():
            return reply
        local = reply.content["arrays"].to_numpy_ndarrays()
        metrics = reply.content["metrics"]
        delta = [
            np.asarray(w, dtype=np.float64) - np.asarray(g, dtype=np.float64)
            for w, g in zip(local, start, strict=True)
        ]
        fitres = FitRes(
            status=Status(code=Code.OK, message="ok"),
            parameters=ndarrays_to_parameters(delta),
            # weighted by the count as released, as the FedAvg of a clear round (ADR 0036)
            num_examples=released(int(metrics["num-examples"])),
            metrics=dict(metrics.items()),
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=inner)

    return secaggplus_mod(msg, ctxt, train_delta)


def fit_config(config: ConfigRecord) -> dict:
    """The legacy ``FitIns.config`` for a round from the app's train config: scalars kept, lists
    as JSON text (legacy configs hold scalars only)."""
    return {
        k: (json.dumps(list(v)) if isinstance(v, list | tuple) else v) for k, v in config.items()
    }
