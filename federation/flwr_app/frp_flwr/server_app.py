"""ServerApp: discovers the job's sites, runs the job's strategy, reports every round to the portal.

Flow of one run (one portal job):

1. **Discovery** — a ``query`` message to every connected node; each replies with its site id (from the
   operator's ``--node-config``). The job's sites are mapped to node ids from those structured
   replies only (never from an error's text); a site two nodes claim is left out with a reason
   naming both. Participating sites also return federated standardisation statistics and labels.
   The portal's answer to ``started`` gives each site's limits (rows registered at ingest,
   allocated cores): every reply's example count and CPU/wall seconds are checked against them
   and the time measured here (ADR 0024); a site out of bounds is faulty and dropped.
2. **Rounds** — FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
   Decentralized Data") by default, or the job's strategy (``frp_flwr.strategies``: Flower's
   FedProx, FedAdam, FedYogi, FedAdagrad, FedMedian, FedTrimmedAvg, Krum), with Flower's own
   aggregation, over the job's nodes only (other jobs'
   sites on the same SuperLink are never sampled). Each round: train, then federated evaluation on
   each site's held-out split — fused (issue 12, ADR 0032): the train message of round r > 1
   carries round r − 1's global model, which each site evaluates before it trains, and one closing
   evaluate message scores the final model; round r's event is posted when its evaluation is in.
   Replies are attributed through ``reply_to_message_id`` → the node the
   message was sent to (SuperLink errors come from node 1). A site that errs, times out or sends a
   reply that does not fit the contract (``frp_flwr.contract``: types, ranges, finite numbers, the
   global model's shapes) is dropped; fewer than ``min_sites`` replies fail the run.
   The replies reach the strategy in the sites' name order (the contribution's player order),
   whatever order they arrived in and whatever node ids the SuperNodes drew: Krum keeps the first
   of tied candidates (with three sites and f = 0 the closest pair always tie), and medians, trims
   and weighted sums round differently in another order (:func:`parse_replies`).
   A secure-aggregation job (``JobSpec.privacy.secagg``) trains through Flower's SecAgg+ workflow
   instead (``frp_flwr.secagg``, ADR 0027): the ServerApp gets only the sum of the sites' updates
   (each site's metrics in clear, bounded as above) and no contribution is evaluated. The job's
   strategy then steps from that weighted mean (``strategies.aggregate_mean``: FedAvg, FedProx,
   FedOpt's pseudo-gradient); strategies that need each update are refused by the contract.
   Its round checkpoints hold the global model and the strategy's state, no per-site history.
   Its rounds are not fused: a train and an evaluate message each (``_unfused_round`` says why).
3. **Reporting** — after every round a signed callback to the portal with the aggregate and per-site
   metrics (including each site's metering: CPU and wall seconds, bytes received and sent); the
   portal may answer with sites to drop (revoked grants). At the end a ``finished`` callback with
   final metrics and the model (a final loss that is not finite fails the run instead). Events are
   typed (``frp_flwr.contract``) and signed with a key derived from this host's platform callback
   key (``frp_flwr.signing``, ADR 0014), which no SuperNode ever sees. The run's own status stays
   with the SuperLink.
4. **Contribution** (ADR 0010) — the app keeps, in memory, every round's starting global weights and
   each site's returned weights. After the last round it rebuilds coalition models without
   retraining (``task.coalition_run_model``; per round too within a model budget), sends them all
   to every site in the closing evaluate message (beside the final model; scores of the sites
   still in after the last round's drops are used), and after ``finished`` posts a
   ``contribution`` event with
   utility(S) = the median over the sites of S's model's held-out accuracy (ADR 0024). The portal computes the
   Shapley values. A failure here is reported in the event and does not fail the run.

Gradient-boosted trees (``model.kind == "xgboost"``, ADR 0023): the rounds carry the booster's
bytes instead of weights, train replies hold each site's new trees and are bagged with Flower's
``FedXgbBagging.aggregate_train`` (``frp_flwr.trees``); no coalition models are scored (bagged
trees cannot be rebuilt per coalition), so the portal credits data volume.

Polling: ``Grid.send_and_receive`` sleeps 3 s between pulls; this app pushes and pulls itself every
``poll-interval`` seconds (0.2 s by default).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from frp_flwr import checkpoints, privacy, trees
from frp_flwr.coalitions import coalition_key, contribution_plan
from frp_flwr.contract import (
    COALITION_ERROR_RECORD,
    COALITIONS_RECORD,
    EVALUATE_INCOMING,
    EVALUATION_RECORD,
    TRAIN_ERROR_RECORD,
    CallbackAnswer,
    CoalitionReply,
    ContractError,
    Contribution,
    DesignStats,
    EvalReport,
    EvaluateReply,
    Event,
    Failed,
    Finished,
    JobSpec,
    Metering,
    Preparation,
    Round,
    RunConfig,
    SiteEvaluation,
    SiteInfo,
    SiteLimits,
    SiteQuantiles,
    SiteRound,
    SiteSummary,
    Started,
    TrainReply,
    about,
    encode_event,
    examples_problem,
    finite_or_none,
    metering_problem,
    released,
    reply_error,
)
from frp_flwr.metrics import baseline, pooled_metrics, site_metrics
from frp_flwr.models import model_for
from frp_flwr.preprocess import (
    Fitted,
    PreprocessError,
    fit,
    quantile_grids,
    standardise_from,
)
from frp_flwr.secagg import SecAggError, SecAggParams, fit_config, secure_train_round
from frp_flwr.signing import SignatureError, job_key, master_key_from_environ, sign
from frp_flwr.strategies import (
    aggregate_mean,
    aggregate_train,
    build_strategy,
    weigh_by_released,
)
from frp_flwr.strategies import coalition_models as strategy_coalition_models
from frp_flwr.task import (
    MAX_COALITION_MODELS,
    RoundLog,
    readable_error,
    sanitise,
    sort_classes,
    stack_models,
)

log = logging.getLogger("frp_flwr.server")
app = ServerApp()


class JobFailed(Exception):
    """The run cannot continue; the message is shown to the researcher."""


# ---------------------------------------------------------------------------------------------
# Portal callbacks
# ---------------------------------------------------------------------------------------------


@dataclass
class Reporter:
    """Posts signed events (``frp_flwr.contract``) to the portal; never raises on network failure.

    ``key`` is the run's job key (``signing.job_key``), derived from the platform callback key in
    this host's environment: nothing a SuperNode receives can sign. Events are numbered 1, 2, 3 …
    (``seq``); a retry sends the same number, so the portal records each event once. Transient
    failures (network, HTTP 5xx, 503 while the portal has not yet recorded the run) are retried
    with exponential back-off; any other refusal (4xx) is logged and not retried, and neither is
    a TLS failure (an ``https://`` portal whose certificate does not verify against
    ``FRP_CALLBACK_CA_FILE``, or that file unreadable): the answer's ``error`` says which.
    """

    url: str
    key: bytes = b""
    attempts: int = 6
    seq: int = 0

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"callback-url must be http(s), not {self.url[:20]!r}")
        if self.url and not self.key:
            raise ValueError("a callback URL needs a callback key")

    def post(self, event: Event) -> CallbackAnswer:
        """POST ``event`` as the next of the run; return the portal's answer (empty if none)."""
        if not self.url:
            return CallbackAnswer()
        self.seq += 1
        body = encode_event(event, seq=self.seq)
        try:
            context = _tls_context(self.url)
        except ValueError as exc:
            log.error("callback %s not sent: %s", event.name, exc)
            return CallbackAnswer(ok=False, error=str(exc))
        for attempt in range(self.attempts):
            headers = {"Content-Type": "application/json", **sign(self.key, body)}
            request = urllib.request.Request(  # noqa: S310 — http(s) only, checked in __post_init__
                self.url, data=body, headers=headers, method="POST"
            )
            try:
                with urllib.request.urlopen(  # noqa: S310
                    request, timeout=10, context=context
                ) as response:
                    return _answer(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    log.warning(
                        "callback %s refused (%d): %s", event.name, exc.code, exc.read()[:500]
                    )
                    return CallbackAnswer(ok=False, error=f"HTTP {exc.code}")
                log.warning(
                    "callback %s failed (attempt %d): HTTP %d", event.name, attempt + 1, exc.code
                )
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                if isinstance(reason, ssl.SSLError):  # will not verify on a second try either
                    error = _tls_refusal(self.url, reason)
                    log.error("callback %s not sent: %s", event.name, error)
                    return CallbackAnswer(ok=False, error=error)
                log.warning("callback %s failed (attempt %d): %s", event.name, attempt + 1, exc)
            time.sleep(0.5 * 2**attempt)
        return CallbackAnswer(ok=False, error="the portal did not answer")


#: The CA certificate (PEM file) the portal's HTTPS certificate is verified with, from this host's
#: environment; unset: the system's trust store.
CALLBACK_CA_ENV = "FRP_CALLBACK_CA_FILE"


def _tls_context(url: str) -> ssl.SSLContext | None:
    """The TLS context for an ``https://`` callback URL (certificate and host name verified
    against ``FRP_CALLBACK_CA_FILE``, else the system trust store); ``None`` for ``http://``.
    Raises ``ValueError`` when the CA file cannot be read or holds no certificate."""
    if not url.startswith("https://"):
        return None
    cafile = os.environ.get(CALLBACK_CA_ENV) or None
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{CALLBACK_CA_ENV}={cafile} cannot be used: {exc}") from None


def _tls_refusal(url: str, exc: ssl.SSLError) -> str:
    """What to tell of a TLS failure with the portal at ``url`` (no secret: URL host only)."""
    host = urllib.parse.urlsplit(url).netloc
    if isinstance(exc, ssl.SSLCertVerificationError):
        cafile = os.environ.get(CALLBACK_CA_ENV)
        against = (
            f"{CALLBACK_CA_ENV}={cafile}"
            if cafile
            else f"the system trust store ({CALLBACK_CA_ENV} is not set in this host's environment)"
        )
        return (
            f"the portal's TLS certificate at {host} is not trusted (certificate verify failed: "
            f"{exc.verify_message}); checked against {against}"
        )
    return f"TLS with the portal at {host} failed: {exc}"


def _answer(raw: bytes) -> CallbackAnswer:
    try:
        return CallbackAnswer.from_json(json.loads(raw or b"{}"))
    except (ValueError, RecursionError) as exc:
        log.warning("the portal's answer does not fit the contract: %s", exc)
        return CallbackAnswer(ok=False, error="the portal's answer does not fit the contract")


# ---------------------------------------------------------------------------------------------
# Messaging with attribution
# ---------------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """The outcome of one fan-out: replies and errors per node id, and nodes that never answered."""

    replies: dict[int, Message] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    timed_out: set[int] = field(default_factory=set)
    #: node → seconds from pushing its message to pulling its reply (the ServerApp's own clock)
    elapsed: dict[int, float] = field(default_factory=dict)


def _json_scalar(value):
    """A record value as JSON: bytes as hex text (SecAgg+'s keys, shares and masked vectors)."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_json_scalar(v) for v in value]
    return value


def _record_to_json(record) -> dict:
    """A RecordDict as plain JSON: arrays as nested lists, metric/config records as dicts
    (bytes as hex text)."""
    out = {}
    for key, value in record.items():
        if isinstance(value, ArrayRecord):
            out[key] = [a.tolist() for a in value.to_numpy_ndarrays()]
        else:
            out[key] = {k: _json_scalar(v) for k, v in value.items()}
    return out


@dataclass
class ReplyLog:
    """Appends every reply the ServerApp receives (JSON lines) to ``path``; off when empty.

    An operator's record of exactly what left each site during a run (model updates, metrics,
    standardisation statistics), for audits such as the data-residency test.
    """

    path: str = ""

    def write(self, node: int, reply: Message) -> None:
        if not self.path:
            return
        entry = {
            "node_id": str(node),
            "message_type": reply.metadata.message_type,
            "error": reply.error.reason if reply.has_error() else None,
            "content": None if reply.has_error() else _record_to_json(reply.content),
        }
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


REPLY_LOG = ReplyLog()


def exchange(grid: Grid, messages: list[Message], *, timeout: float, poll: float) -> Exchange:
    """Push ``messages``, pull replies every ``poll`` seconds until all arrive or ``timeout`` (s)."""
    dst = [m.metadata.dst_node_id for m in messages]
    t0 = time.monotonic()
    ids = list(grid.push_messages(messages))
    node_of = dict(zip(ids, dst, strict=True))
    pending = set(ids)
    out = Exchange()
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            pending.discard(mid)
            node = node_of[mid]
            out.elapsed[node] = time.monotonic() - t0
            REPLY_LOG.write(node, reply)
            if reply.has_error():
                out.errors[node] = sanitise(readable_error(reply.error.reason))
            else:
                out.replies[node] = reply
        if pending:
            time.sleep(poll)
    out.timed_out = {node_of[m] for m in pending}
    return out


def discover(
    grid: Grid, spec: JobSpec, *, timeout: float, poll: float
) -> tuple[dict[str, int], dict[str, tuple[SiteInfo, SiteSummary]], dict[str, str]]:
    """Map the job's site ids to node ids.

    Returns ``(site→node, site→(info, summary) of its discovery reply, site→error)``.

    A site is known only from a node's own structured reply (:class:`SiteInfo`; a member that
    cannot open its data says why in ``info.error``): an error reply (an exception on the node,
    or the SuperLink's) is that node's alone and is never attributed to a site by its text. A
    member's reply that does not fit the contract is that site's error. When two or more nodes
    claim one site, the site is left out of the job with an error naming the nodes, whatever
    order their replies came in: a site's name is its operator's own ``--node-config``, so the
    ServerApp cannot tell which claim is true (binding node ids to sites is SuperNode
    authentication's, issue 13). After every site is claimed, nodes that connected meanwhile are
    asked too, so a second claim is seen.
    """
    deadline = time.monotonic() + timeout
    asked: set[int] = set()
    claims: dict[str, dict[int, Message]] = {}

    def ask(nodes: list[int]) -> None:
        asked.update(nodes)
        msgs = [
            Message(
                RecordDict({"config": ConfigRecord({})}),
                dst_node_id=n,
                message_type=MessageType.QUERY,
            )
            for n in nodes
        ]
        result = exchange(grid, msgs, timeout=max(1.0, deadline - time.monotonic()), poll=poll)
        for node, error in result.errors.items():
            log.warning("node %s: discovery failed (attributed to no site): %s", node, error)
        for node, reply in result.replies.items():
            try:
                info = SiteInfo.from_record(reply.content["info"])
            except (ContractError, KeyError) as exc:
                log.warning("node %s: discovery reply does not fit the contract: %s", node, exc)
                continue
            if info.site in spec.sites:
                claims.setdefault(info.site, {})[node] = reply

    while time.monotonic() < deadline and len(claims) < len(spec.sites):
        new = [n for n in grid.get_node_ids() if n not in asked]
        if not new:
            time.sleep(poll)
            continue
        ask(new)
    late = [n for n in grid.get_node_ids() if n not in asked]
    if late:
        ask(late)

    site_node: dict[str, int] = {}
    site_reply: dict[str, tuple[SiteInfo, SiteSummary]] = {}
    site_error: dict[str, str] = {}
    for site, by_node in sorted(claims.items()):
        if len(by_node) > 1:
            nodes = ", ".join(str(n) for n in sorted(by_node))
            site_error[site] = (
                f"nodes {nodes} all claim site {site!r}; a site's name is its operator's own "
                "node config, so none can be trusted and the site is left out of this job"
            )
            continue
        ((node, reply),) = by_node.items()
        site_node[site] = node
        info = SiteInfo.from_record(reply.content["info"])
        if info.error:
            site_error[site] = sanitise(info.error)
            continue
        try:
            summary = SiteSummary.from_record(reply.content["summary"])
        except (ContractError, KeyError) as exc:
            site_error[site] = sanitise(f"malformed discovery reply: {exc}")
            continue
        site_reply[site] = (info, summary)
    return site_node, site_reply, site_error


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


#: ``check(site, parsed metrics, elapsed seconds) -> problem`` ("" when the reply may be true).
ReplyCheck = Callable[[str, Any, float], str]


def bounds_check(
    kind: str, limits: dict[str, SiteLimits], *, test_fraction: float, classes: int
) -> ReplyCheck:
    """A :data:`ReplyCheck` of ``kind`` (``"train"`` or ``"test"`` examples) against the portal's
    ``limits`` (``contract.examples_problem`` and ``contract.metering_problem``). A site without
    limits (no portal answered) is not checked."""

    def check(site: str, metrics, elapsed: float) -> str:
        lim = limits.get(site)
        if lim is None:
            return ""
        return examples_problem(
            kind, metrics.num_examples, lim, test_fraction=test_fraction, classes=classes
        ) or metering_problem(metrics.cpu_seconds, metrics.wall_seconds, elapsed, lim)

    return check


def fan_out(
    message_type: str,
    arrays: ArrayRecord,
    *,
    grid: Grid,
    active: dict[str, int],
    node_site: dict[int, str],
    config: ConfigRecord,
    timeout: float,
    poll: float,
    sites_out: dict[str, dict],
    reply_type: type[TrainReply] | type[EvaluateReply],
    check: ReplyCheck | None = None,
    rnd: int = 0,
) -> dict[int, tuple[Message, TrainReply | EvaluateReply]]:
    """Send ``arrays`` + ``config`` to every active node; return node → (reply, parsed metrics),
    in the sites' name order (:func:`parse_replies`).

    Errors, silences, replies that do not fit ``reply_type`` and replies ``check`` finds out of
    bounds (``check(site, metrics, elapsed seconds) -> problem``) mark the site's entry in
    ``sites_out`` with ``ok=False`` and the reason; such replies are not returned. A reply whose
    loss or weights are NaN or infinite raises ``NonFinite`` naming the site and round ``rnd``:
    training has diverged or the data hold values no model can use, and averaging it would spoil
    every site's model.
    """
    msgs = [
        Message(
            RecordDict({"arrays": arrays, "config": config}),
            dst_node_id=n,
            message_type=message_type,
        )
        for n in active.values()
    ]
    result = exchange(grid, msgs, timeout=timeout, poll=poll)
    return parse_replies(
        result,
        message_type=message_type,
        sent=arrays,
        node_site=node_site,
        sites_out=sites_out,
        reply_type=reply_type,
        check=check,
        rnd=rnd,
        timeout=timeout,
    )


def parse_replies(
    result: Exchange,
    *,
    message_type: str,
    sent: ArrayRecord,
    node_site: dict[int, str],
    sites_out: dict[str, dict],
    reply_type: type[TrainReply] | type[EvaluateReply],
    check: ReplyCheck | None = None,
    rnd: int = 0,
    timeout: float = 0.0,
) -> dict[int, tuple[Message, TrainReply | EvaluateReply]]:
    """The replies of ``result`` that fit: node → (reply, parsed ``reply_type`` metrics), as
    :func:`fan_out` returns them (its docstring: errors, silences, misfits and out-of-bounds
    replies mark ``sites_out``; NaN or infinity raises ``NonFinite``). ``sent``: the global
    model the messages carried (a train reply's weights must have its shapes); ``timeout``: the
    seconds a silent node was waited for (said in its error).

    The returned dict is in the order of the sites' names (``node_site``), which is the order the
    strategy aggregates them in: not their arrival order nor their node ids (random at each
    SuperNode's registration), on which a Krum tie or a float sum would otherwise depend."""

    def fail(node: int, error: str) -> None:  # the round's first reason for a site is kept
        entry = sites_out[node_site[node]]
        if entry.get("ok") is not False:
            entry.update(ok=False, error=error)

    for node, error in result.errors.items():
        fail(node, error)
    for node in result.timed_out:
        fail(node, f"no reply within {timeout:.0f} s")
    parsed = {}
    for node, reply in sorted(result.replies.items(), key=lambda item: node_site[item[0]]):
        what = _non_finite(reply)
        if what:
            site = node_site[node]
            sites_out[site].update(ok=False, error=what)
            raise NonFinite(
                f"round {rnd}: site {site} returned {what} in its {message_type} reply (NaN, "
                "infinity or divergence); the job is stopped. Lower the learning rate, or check "
                "the features' scales and missing-value handling."
            )
        try:
            if message_type == MessageType.TRAIN:
                _check_shapes(reply.content["arrays"], sent)
            metrics = reply_type.from_record(reply.content["metrics"], "metrics")
        except (ContractError, KeyError) as exc:
            fail(node, sanitise(f"malformed {message_type} reply: {exc}"))
            continue
        problem = check(node_site[node], metrics, result.elapsed.get(node, 0.0)) if check else ""
        if problem:
            fail(node, f"faulty {message_type} reply, refused: {problem}")
            continue
        parsed[node] = (reply, metrics)
    return parsed


def _view(reply: Message, **records) -> Message:
    """``reply`` with only ``records`` as its content (same metadata): one part of a fused reply
    (ADR 0032) as the single-part reply Flower's strategies and :func:`parse_replies` read."""
    view = copy.copy(reply)
    view.content = RecordDict(records)
    return view


#: A loss above this is divergence, not a result (the contract's range for losses).
MAX_LOSS = 1e12


class NonFinite(JobFailed):
    """A site's reply or the aggregated model holds NaN or infinity (the message names which)."""


def _non_finite(reply: Message) -> str:
    """What in a train or evaluate reply is NaN or infinite (``""``: nothing)."""
    metrics = reply.content.get("metrics") if hasattr(reply.content, "get") else None
    for key in ("train-loss", "eval-loss"):
        value = metrics.get(key) if metrics is not None else None
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and not np.isfinite(value):
            return f"a {key.replace('-', ' ')} that is not a finite number"
        if number and abs(value) > MAX_LOSS:
            return f"a {key.replace('-', ' ')} of {value:.3g}: training has diverged"
    arrays = reply.content.get("arrays") if hasattr(reply.content, "get") else None
    if isinstance(arrays, ArrayRecord):
        try:
            layers = arrays.to_numpy_ndarrays()
        except Exception:  # noqa: BLE001 — a malformed record is the contract check's error
            return ""
        if not all(np.isfinite(np.asarray(a, dtype=np.float64)).all() for a in layers):
            return "model weights that are not finite numbers"
    return ""


def _check_shapes(returned: ArrayRecord, sent: ArrayRecord) -> None:
    """A train reply's weights must have the global model's shapes and be finite; a booster's
    reply must hold its new trees (``trees.check_reply``)."""
    if trees.is_booster(sent):
        trees.check_reply(returned)
        return
    got, want = returned.to_numpy_ndarrays(), sent.to_numpy_ndarrays()
    if [a.shape for a in got] != [a.shape for a in want]:
        raise ContractError("arrays: not the shapes of the global model")
    if not all(np.isfinite(a).all() for a in got):
        raise ContractError("arrays: not finite numbers")


def _arrays(record: ArrayRecord) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in record.to_numpy_ndarrays()]


def evaluate_contribution(
    *,
    grid: Grid,
    players: list[str],
    initial: list[np.ndarray],
    rounds: list[RoundLog],
    active: dict[str, int],
    config: ConfigRecord,
    timeout: float,
    poll: float,
    seed: int = 0,
    check: ReplyCheck | None = None,
    task: str = "classification",
    strategy: dict | None = None,
) -> Contribution:
    """Score coalition models at every active site with one message each; return the event.

    ``players``: site ids, index = player number in ``rounds``. Models: the whole run for each
    coalition of :func:`coalitions.contribution_plan` (round key ``"0"``) and, while the message stays
    within ``MAX_COALITION_MODELS`` models, the same coalitions for every round ``t`` (key
    ``str(t)``, model ``w_{t−1} + Δ_S^t``). Every coalition model is scored by every site on its
    own held-out split: acc_s(S) for classification, −√MSE_s(S) (negative RMSE, standardised
    target) for regression. Utility(S) = the **median over the evaluating sites** of that score
    (ADR 0024): a site's scores of coalitions that include itself cannot be verified, and the
    median keeps one site's (unweighted, so its example count does not matter) from moving the
    utility beyond the other sites' range when three or more sites evaluate. ``disagreement``: per
    site, the mean |score_s(S) − utility(S)| over all models (a site far from the others stands
    out). A site whose reply does not fit the contract or ``check`` (bounds of its held-out rows
    and metering) is left out (named in ``errors``). ``strategy``: the job's strategy spec; the
    coalition models re-apply it (``strategies.coalition_models``, ADR 0022). Raises
    ``JobFailed`` when no site replies.
    """
    t0 = time.monotonic()
    plan = coalition_plan(players, initial, rounds, seed=seed, strategy=strategy)
    cfg = ConfigRecord({**dict(config.items()), "coalition-keys": plan.keys})
    msgs = [
        Message(
            RecordDict({"models": plan.stacked, "config": cfg}),
            dst_node_id=n,
            message_type=f"{MessageType.EVALUATE}.coalitions",
        )
        for n in active.values()
    ]
    result = exchange(grid, msgs, timeout=timeout, poll=poll)
    return score_coalitions(
        plan,
        result,
        active=active,
        timeout=timeout,
        check=check,
        task=task,
        wall_seconds=time.monotonic() - t0,
    )


@dataclass
class CoalitionPlan:
    """The coalition models of a contribution evaluation (:func:`coalition_plan`): ``keys``
    (``"<round>|<coalition key>"``, round ``0`` the whole run) and the models stacked in that
    order (``stacked``: each layer on axis 0, ``task.stack_models``)."""

    players: list[str]
    method: str
    permutations: int
    seed: int
    keys: list[str]
    stacked: ArrayRecord


def coalition_plan(
    players: list[str],
    initial: list[np.ndarray],
    rounds: list[RoundLog],
    *,
    seed: int = 0,
    strategy: dict | None = None,
) -> CoalitionPlan:
    """The coalitions of :func:`coalitions.contribution_plan` and their models (the whole run,
    and each round while the message stays within ``MAX_COALITION_MODELS`` models), rebuilt under
    the job's ``strategy`` (``strategies.coalition_models``): see :func:`evaluate_contribution`."""
    method, coalitions, permutations = contribution_plan(len(players), seed=seed)
    keys: list[str] = []
    models: list[list[np.ndarray]] = []
    with_rounds = len(coalitions) * (len(rounds) + 1) <= MAX_COALITION_MODELS
    by_round: list[tuple[str, list[np.ndarray]]] = []
    for coalition in coalitions:
        run_model, round_models = strategy_coalition_models(
            strategy, initial, rounds, coalition, with_rounds=with_rounds
        )
        keys.append(f"0|{coalition_key(coalition)}")
        models.append(run_model)
        by_round += [
            (f"{t}|{coalition_key(coalition)}", m) for t, m in enumerate(round_models, start=1)
        ]
    by_round.sort(key=lambda km: int(km[0].split("|", 1)[0]))  # round by round, as before
    keys += [k for k, _ in by_round]
    models += [m for _, m in by_round]
    return CoalitionPlan(
        players, method, permutations, seed, keys, ArrayRecord(stack_models(models))
    )


def score_coalitions(
    plan: CoalitionPlan,
    result: Exchange,
    *,
    active: dict[str, int],
    timeout: float,
    check: ReplyCheck | None = None,
    task: str = "classification",
    wall_seconds: float = 0.0,
) -> Contribution:
    """The ``contribution`` event from the sites' coalition replies in ``result`` (each reply's
    ``metrics`` a :class:`CoalitionReply`; nodes of ``active`` only): the utilities, disagreement
    and errors of :func:`evaluate_contribution`. ``wall_seconds``: the evaluation's time, which
    bounds each site's metering at the portal. Raises ``JobFailed`` when no site scored."""
    keys = plan.keys
    node_site = {n: s for s, n in active.items()}
    errors = {node_site[n]: e for n, e in result.errors.items() if n in node_site}
    errors.update(
        {
            node_site[n]: f"no reply within {timeout:.0f} s"
            for n in result.timed_out
            if n in node_site
        }
    )
    scores: dict[str, np.ndarray] = {}
    examples: dict[str, int] = {}
    sites: dict[str, Metering] = {}
    for node, reply in result.replies.items():
        if node not in node_site:
            continue
        site = node_site[node]
        try:
            m = CoalitionReply.from_record(reply.content["metrics"], "metrics")
        except (ContractError, KeyError) as exc:
            errors[site] = sanitise(f"malformed coalition reply: {exc}")
            continue
        if len(m.coalition_accuracy) != len(keys):
            errors[site] = f"scored {len(m.coalition_accuracy)} of {len(keys)} coalition models"
            continue
        problem = check(site, m, result.elapsed.get(node, 0.0)) if check else ""
        if problem:
            errors[site] = f"faulty coalition reply, refused: {problem}"
            continue
        if task == "regression":
            scores[site] = -np.sqrt(np.asarray(m.coalition_loss, dtype=np.float64))
        else:
            scores[site] = np.asarray(m.coalition_accuracy, dtype=np.float64)
        examples[site] = m.num_examples
        sites[site] = Metering(
            examples=m.num_examples,  # held-out rows, scored once per model in one pass
            cpu_seconds=m.cpu_seconds,
            wall_seconds=m.wall_seconds,
            bytes_received=m.bytes_received,
            bytes_sent=m.bytes_sent,
        )
    scores = {s: a for s, a in scores.items() if examples[s] > 0}
    if not scores:
        raise JobFailed(f"no site scored the coalition models: {errors or 'no held-out examples'}")
    table = np.stack([scores[s] for s in sorted(scores)])  # (sites, models)
    utility = np.median(table, axis=0)
    disagreement = {
        site: round(float(np.mean(np.abs(table[i] - utility))), 6)
        for i, site in enumerate(sorted(scores))
    }
    utilities: dict[str, dict[str, float]] = {}
    for key, value in zip(keys, utility, strict=True):
        rnd, members = key.split("|")
        utilities.setdefault(rnd, {})[members] = float(value)
    return Contribution(
        players=plan.players,
        method=plan.method,
        permutations=plan.permutations,
        seed=plan.seed,
        utility=(
            "median over the evaluating sites of negative held-out RMSE (standardised target)"
            if task == "regression"
            else "median over the evaluating sites of held-out accuracy"
        ),
        utilities=utilities,
        examples=examples,
        models=len(keys),
        sites=sites,
        errors=errors,
        wall_seconds=wall_seconds,
        disagreement=disagreement,
    )


def _site_round(entry: dict) -> SiteRound:
    return SiteRound(
        **{
            k: (finite_or_none(v) if k in ("train_loss", "eval_loss", "eval_accuracy") else v)
            for k, v in entry.items()
        }
    )


#: Fields of a site's round entry that are its metering or figures (zeroed when it is refused).
_FIGURES = (
    "train_examples",
    "eval_examples",
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "cpu_seconds",
    "wall_seconds",
    "bytes_received",
    "bytes_sent",
)


def _refuse_unfit_entries(sites_out: dict[str, dict]) -> None:
    """Refuse, per site, a round entry that does not fit the contract (its train and evaluate
    metering summed: each reply may fit while the sum does not), and then, while the round's totals
    do not fit, the site with the most examples: that site is faulty (``ok=False``, its figures
    dropped, the reason said), and the others' round goes on (hostile re-test, finding 1c)."""

    def refuse(site: str, why: str) -> None:
        entry = sites_out[site]
        for key in _FIGURES:
            entry.pop(key, None)
        entry.update(ok=False, error=sanitise(f"faulty replies, refused: {why}", limit=1000))

    for site, entry in sites_out.items():
        try:
            SiteRound.from_json(_site_round(entry).to_json(), f"sites.{site}")
        except ContractError as exc:
            refuse(site, str(exc))
    while True:
        ok = [s for s, e in sites_out.items() if e.get("ok") is True]
        totals = {
            "train_examples": sum(int(sites_out[s].get("train_examples", 0)) for s in ok),
            "eval_examples": sum(int(sites_out[s].get("eval_examples", 0)) for s in ok),
        }
        try:
            Round.from_json({"round": 1, **totals})
            return
        except ContractError as exc:
            biggest = max(
                ok,
                key=lambda s: (
                    int(sites_out[s].get("train_examples", 0))
                    + int(sites_out[s].get("eval_examples", 0)),
                    s,
                ),
            )
            refuse(biggest, f"its counts overflow the round's total ({exc})")


def _ask(
    grid: Grid,
    active: dict[str, int],
    step: str,
    config: dict,
    parse,
    *,
    timeout: float,
    poll: float,
) -> dict:
    """One preparation step (``query.<step>``) at every active site: site → parsed reply, in the
    sites' name order (the pooled statistics are float sums: the same in every run).
    Raises ``JobFailed`` naming the sites that erred, fell silent or sent a malformed reply
    (every site must apply the same rules, so the job cannot go on without one)."""
    node_site = {n: s for s, n in active.items()}
    msgs = [
        Message(
            RecordDict({"config": ConfigRecord(config)}),
            dst_node_id=n,
            message_type=f"{MessageType.QUERY}.{step}",
        )
        for n in active.values()
    ]
    result = exchange(grid, msgs, timeout=timeout, poll=poll)
    problems = {node_site[n]: e for n, e in result.errors.items()}
    problems.update({node_site[n]: f"no reply within {timeout:.0f} s" for n in result.timed_out})
    out = {}
    for node, reply in result.replies.items():
        try:
            out[node_site[node]] = parse(reply.content[step])
        except (ContractError, KeyError) as exc:
            problems[node_site[node]] = sanitise(f"malformed {step} reply: {exc}")
    if problems:
        raise JobFailed(
            f"preparing the data ({step}) failed at "
            + "; ".join(f"{s}: {e}" for s, e in sorted(problems.items()))
        )
    return dict(sorted(out.items()))


@dataclass
class Prepared:
    """The outcome of the federated preprocessing (``frp_flwr.preprocess``).

    ``train_labels``: label → the sites' exact training rows, summed (the ServerApp's own use:
    the baseline's majority class); ``released_labels``: label → the sum of the sites' counts
    as released (``trees.released_labels``), for what is sent to every site (the binary
    ``base_score``)."""

    fitted: Fitted
    preparation: Preparation
    train_labels: dict[str, int]
    released_labels: dict[str, int] = field(default_factory=dict)


def prepare(
    grid: Grid,
    spec: JobSpec,
    active: dict[str, int],
    site_reply: dict[str, tuple[SiteInfo, SiteSummary]],
    *,
    timeout: float,
    poll: float,
) -> Prepared:
    """Fit the job's preprocessing from the sites' aggregates (module doc of
    ``frp_flwr.preprocess``): the discovery summaries, quantiles for median fills, then the
    prepared matrices' statistics for standardisation. Raises ``JobFailed``."""
    features = spec.features
    if not features:  # every numeric column the sites share, in the first site's order
        infos = [site_reply[s][0] for s in sorted(active)]
        shared = set.intersection(*(set(i.features) for i in infos))
        features = [f for f in infos[0].features if f in shared]
    spec = replace(spec, features=features)
    summaries = [site_reply[s][1] for s in sorted(active)]
    classes: list[str] = []
    if spec.task == "classification":
        # Every site receives the classes (in each message's config) and the portal shows them:
        # a label is named only where some site holds more than small_count rows of it, as a
        # feature's categories are (issue 9, hostile re-test: a one-row label reached every
        # site). Rows of a label rare at every site are dropped where they are (transform).
        classes = sort_classes(
            {
                label
                for s in active
                for label, rows in site_reply[s][1].labels.items()
                if rows > spec.small_count
            }
        )
        if len(classes) < 2:
            raise JobFailed(
                f"the target has {len(classes)} class(es) held by more than {spec.small_count} "
                "rows at some site; need 2 or more (a label held by fewer rows at every site is "
                "never named, and its rows are left out)"
            )
    grids = quantile_grids(spec, summaries)
    quantiles = None
    if grids:
        quantiles = list(
            _ask(
                grid,
                active,
                "quantiles",
                {"grids": json.dumps(grids)},
                SiteQuantiles.from_record,
                timeout=timeout,
                poll=poll,
            ).values()
        )
    try:
        fitted = fit(spec, summaries, classes, quantiles, grids)
        stats = _ask(
            grid,
            active,
            "design",
            {"preprocess": fitted.to_text()},
            DesignStats.from_record,
            timeout=timeout,
            poll=poll,
        )
        standardise_from(fitted, list(stats.values()))
    except PreprocessError as exc:
        raise JobFailed(f"preparing the data: {exc}") from None
    train_labels: dict[str, int] = {}
    for st in stats.values():
        for label, count in st.labels.items():
            train_labels[label] = train_labels.get(label, 0) + count
    preparation = Preparation(
        task=spec.task,
        columns=fitted.columns(),
        fills=fitted.fills(),
        notes=fitted.notes,
        sites={s: st.preparation for s, st in stats.items()},
    )
    released_labels = trees.released_labels(st.labels for st in stats.values())
    return Prepared(fitted, preparation, train_labels, released_labels)


def _without_site(error: str, site: str) -> str:
    """``error`` without its leading ``site 'x':`` (the sentence names the site already)."""
    prefix = f"site {site!r}: "
    if error.lower().startswith(prefix):
        error = error[len(prefix) :]
    return error[:1].upper() + error[1:]


@dataclass
class _Run:
    """What one run carries from step to step (see :func:`run_job`).

    ``active``: site → node id of the sites still training (shrinks as sites drop);
    ``node_site``/``player_of``: fixed at the start, for every site that began (``players``:
    sorted site ids, index = contribution player); ``arrays``: the current global model;
    ``config``: what every site gets with it (the fitted ``preprocess`` rules, the global
    ``classes``, ``server-round``, ``final``); ``prepared``: the federated preprocessing;
    ``initial``: the starting weights and ``history``: one :class:`task.RoundLog` per round (both
    for the contribution); ``last_eval``: each site's latest evaluation; ``reports``: each site's
    final evaluation aggregates; ``aggregate_eval``: the latest round's federated evaluation
    (``eval_loss``, ``eval_accuracy``: finite or ``None``; ``eval_examples``); ``limits``: the
    portal's :class:`SiteLimits` per site and ``train_check``/``test_check`` the bounds on
    replies built from them (ADR 0024); ``faulty``: site → reason of the sites refused after
    discovery (reported with round 1), ``site_node`` their node ids.
    """

    grid: Grid
    cfg: RunConfig
    reporter: Reporter
    active: dict[str, int]
    arrays: ArrayRecord
    config: ConfigRecord
    prepared: Prepared
    node_site: dict[int, str]
    players: list[str]
    player_of: dict[str, int]
    initial: list[np.ndarray]
    #: The job's Flower strategy (``frp_flwr.strategies.build_strategy``); FedAvg by default.
    strategy: Any = field(default_factory=lambda: build_strategy(None))
    history: list[RoundLog] = field(default_factory=list)
    last_eval: dict[str, SiteEvaluation] = field(default_factory=dict)
    reports: dict[str, EvalReport] = field(default_factory=dict)
    aggregate_eval: dict = field(default_factory=dict)
    limits: dict[str, SiteLimits] = field(default_factory=dict)
    faulty: dict[str, str] = field(default_factory=dict)
    site_node: dict[str, int] = field(default_factory=dict)
    train_check: ReplyCheck | None = None
    test_check: ReplyCheck | None = None
    #: SecAgg+ settings of a secure-aggregation job (``frp_flwr.secagg``), else ``None``
    secagg: SecAggParams | None = None
    #: the most rows any site holds (the portal's limits, else the discovery summaries)
    max_rows: int = 0
    #: the model store checkpoints go to (``None``: none are saved)
    store: Any = None
    #: a fused run's round trained whose evaluation comes with the next message (ADR 0032)
    pending: Any = None
    #: node → (CPU s, wall s) of the evaluation that came in the current fused message
    fused_metering: dict = field(default_factory=dict)
    #: the contribution event a fused run's closing message scored (posted after ``finished``)
    contribution: Contribution | None = None
    #: why the contribution was turned off during the run (:func:`_heed_contribution`), or ""
    contribution_off: str = ""

    @property
    def fused(self) -> bool:
        """Rounds are fused (ADR 0032): every job but SecAgg+ (see :func:`_unfused_round`)."""
        return self.secagg is None

    @property
    def task(self) -> str:
        return self.prepared.fitted.task

    @property
    def is_trees(self) -> bool:
        """The job trains gradient-boosted trees (``frp_flwr.trees``), not weights."""
        return self.cfg.spec.model_kind == "xgboost"

    @property
    def classes(self) -> list[str]:
        return self.prepared.fitted.classes

    def send_model(
        self, message_type: str, reply_type, sites_out: dict[str, dict], rnd: int, check=None
    ):
        """:func:`fan_out` of the current model to the active sites, with the run's settings and
        the bounds ``check``; a non-finite reply posts the round as partial, then raises
        ``NonFinite``."""
        try:
            return fan_out(
                message_type,
                self.arrays,
                grid=self.grid,
                active=self.active,
                node_site=self.node_site,
                config=self.config,
                timeout=self.cfg.round_timeout,
                poll=self.cfg.poll_interval,
                sites_out=sites_out,
                reply_type=reply_type,
                check=check,
                rnd=rnd,
            )
        except NonFinite:
            self.post_partial(rnd, sites_out)
            raise

    def post_partial(self, rnd: int, sites_out: dict[str, dict]) -> None:
        """Post round ``rnd`` as partial: only the sites' parts are recorded."""
        self.reporter.post(
            Round(
                round=rnd,
                sites={s: _site_round(e) for s, e in sites_out.items()},
                partial=True,
            )
        )


@dataclass
class _Discovered:
    """What discovery hands to :func:`_start`: the ready sites (site → node), their replies,
    every claimed site's node and the ``started`` event to post (with the preparation)."""

    active: dict[str, int]
    site_reply: dict[str, tuple[SiteInfo, SiteSummary]]
    site_node: dict[str, int]
    started: Started


def _discover_sites(grid: Grid, cfg: RunConfig, reporter: Reporter) -> _Discovered:
    """Step 1: find the job's sites. Raises ``JobFailed`` (after posting ``started``) when fewer
    than ``min_sites`` are ready."""
    spec = cfg.spec
    site_node, site_reply, site_error = discover(
        grid, spec, timeout=cfg.discovery_timeout, poll=cfg.poll_interval
    )
    missing = sorted(set(spec.sites) - set(site_node) - set(site_error))
    active = {s: n for s, n in site_node.items() if s not in site_error}
    started = Started(
        nodes={s: str(n) for s, n in site_node.items()}, missing=missing, errors=site_error
    )
    if len(active) < spec.min_sites:
        reporter.post(started)
        problems = [f"{s} is not connected." for s in missing] + [
            f"{s} could not take part: {_without_site(e, s)}" for s, e in sorted(site_error.items())
        ]
        raise JobFailed(
            f"Only {len(active)} of {len(spec.sites)} sites could take part, and the job needs "
            f"{spec.min_sites}. " + " ".join(problems)
        )
    return _Discovered(active, site_reply, site_node, started)


def _refuse_by_limits(
    found: _Discovered, limits: dict[str, SiteLimits], min_sites: int
) -> dict[str, str]:
    """Refuse the sites whose discovery summary counts rows other than the portal's
    :class:`SiteLimits` (rows of the dataset version registered at ingest; ADR 0024): they are
    faulty, removed from ``found.active``; returns site → why. Raises ``JobFailed`` when fewer
    than ``min_sites`` are left."""
    faulty: dict[str, str] = {}
    for site in sorted(found.active):
        lim = limits.get(site)
        summary = found.site_reply[site][1]
        if lim is None:
            continue
        if summary.rows != lim.rows or summary.target_missing > summary.rows:
            faulty[site] = (  # the reason reaches the job page: counts as the profile shows
                f"faulty discovery reply, refused: reported {about(summary.rows)} rows "
                f"({about(summary.target_missing)} without a target); the dataset version "
                f"registered for this site has {about(lim.rows)} rows"
            )
            found.active.pop(site)
    if len(found.active) < min_sites:
        raise JobFailed(
            f"Only {len(found.active)} sites could take part, and the job needs {min_sites}. "
            + " ".join(f"{s} could not take part: {e}" for s, e in sorted(faulty.items()))
        )
    return faulty


def _refused_by_portal(found: _Discovered, drop: list[str], min_sites: int) -> dict[str, str]:
    """Remove from ``found.active`` the sites the portal's answer to ``started`` drops: a node
    that is not the SuperNode registered for the site it names, or a site whose grant is no
    longer valid (the portal keeps the reason on the job's site). Returns site → why. Raises
    ``JobFailed`` when fewer than ``min_sites`` are left."""
    refused = {
        site: "refused by the portal at discovery (its node is not the SuperNode registered for "
        "this site, or its grant is no longer valid)"
        for site in sorted(set(drop) & set(found.active))
    }
    for site in refused:
        found.active.pop(site)
    if refused and len(found.active) < min_sites:
        raise JobFailed(
            f"Only {len(found.active)} sites could take part, and the job needs {min_sites}. "
            + " ".join(f"{s} was {e}." for s, e in refused.items())
        )
    return refused


def _start(grid: Grid, cfg: RunConfig, reporter: Reporter, found: _Discovered) -> _Run:
    """Step 2: the federated preprocessing (:func:`prepare`: fills, vocabularies,
    standardisation, the global class list), posted with ``started``; the portal's answer's
    limits refuse the sites whose discovery row counts are out of them (:func:`_refuse_by_limits`)
    and bound every later reply (:func:`bounds_check`), its ``drop_sites`` refuse impostor nodes
    and revoked grants (:func:`_refused_by_portal`); when any site is refused the preprocessing
    is fitted again without it and ``started`` posted again with the sites left; the initial
    model. Raises ``JobFailed`` (after posting ``started``) when the data cannot be prepared or
    too few sites are left."""
    active, site_reply, started = found.active, found.site_reply, found.started
    try:
        prepared = prepare(
            grid, cfg.spec, active, site_reply, timeout=cfg.round_timeout, poll=cfg.poll_interval
        )
    except JobFailed:
        reporter.post(started)
        raise
    answer = reporter.post(replace(started, preparation=prepared.preparation))
    faulty = _refuse_by_limits(found, answer.limits, cfg.spec.min_sites)
    faulty.update(_refused_by_portal(found, answer.drop_sites, cfg.spec.min_sites))
    if faulty:  # a refused site's aggregates must not shape the preprocessing: prepare again
        try:
            prepared = prepare(
                grid,
                cfg.spec,
                active,
                site_reply,
                timeout=cfg.round_timeout,
                poll=cfg.poll_interval,
            )
        except JobFailed:
            reporter.post(replace(started, nodes={s: started.nodes[s] for s in active}))
            raise
        answer = reporter.post(
            replace(
                started,
                nodes={s: started.nodes[s] for s in active},
                preparation=prepared.preparation,
            )
        )
    limits = answer.limits
    fitted = prepared.fitted
    arrays = ArrayRecord(
        model_for(cfg.spec.model).init_params(
            len(fitted.mean), max(1, len(fitted.classes)), seed=cfg.split_seed
        )
    )  # xgboost: the empty booster (frp_flwr.models.TreesModel)
    players = sorted(active)  # contribution players: index = position
    run = _make_run(
        grid, cfg, reporter, found, prepared, arrays, limits, faulty, players, _arrays(arrays)
    )
    _heed_contribution(run, answer)
    return run


def _heed_contribution(run: _Run, answer: CallbackAnswer) -> None:
    """Turn the run's contribution off for good when the portal's ``answer`` says it is no
    longer allowed (a steward withdrew the Shapley opt-in, or a grant was revoked, ADR 0036), or
    when there is no answer to go by (the portal refused the event, did not answer, or answered
    outside the contract: the answer that ended the consent may be the one lost, and a retry
    of an event the portal recorded is refused as a replay). Fails closed: no coalition model
    is built or sent after this, whatever the run config said; the contribution event says why
    (the sites are then credited by data volume or not at all, never disclosed)."""
    if not run.cfg.contribution:
        return
    if not answer.ok or not answer.contribution:
        run.cfg = replace(run.cfg, contribution=False)
        run.contribution_off = (
            "the portal withdrew it during the run (a data steward's opt-in or a grant ended)"
            if answer.ok
            else f"an event of the run had no answer from the portal ({answer.error or 'none'})"
        )
        log.info("job %s: contribution off: %s", run.cfg.job_id, run.contribution_off)


def _make_run(
    grid: Grid,
    cfg: RunConfig,
    reporter: Reporter,
    found: _Discovered,
    prepared: Prepared,
    arrays: ArrayRecord,
    limits: dict[str, SiteLimits],
    faulty: dict[str, str],
    players: list[str],
    initial: list[np.ndarray],
) -> _Run:
    """The :class:`_Run` of a fresh (:func:`_start`) or resumed (:func:`_resume`) run.

    The job's strategy: ``build_strategy(spec.strategy)``, or for gradient-boosted trees
    (``model.kind == "xgboost"``) Flower's ``FedXgbBagging`` (``trees.strategy``) and the binary
    ``base_score`` (the share of the second class among the sites' released training labels,
    ``trees.base_score`` of ``prepared.released_labels``) in the config the sites get — set here
    so that a resumed run has them too. A checkpoint written before the released labels were
    kept has none: its pooled counts are then released as one count each (ADR 0023)."""
    active, fitted = found.active, prepared.fitted
    classes = fitted.classes
    config = ConfigRecord({"preprocess": fitted.to_text(), "classes": fitted.classes or [""]})
    if cfg.spec.model_kind == "xgboost":  # gradient-boosted trees, bagged (frp_flwr.trees)
        strategy = trees.strategy()
        labels = prepared.released_labels or trees.released_labels([prepared.train_labels])
        config["xgb-base-score"] = trees.base_score(labels, classes)
    else:
        strategy = build_strategy(cfg.spec.strategy)
    run = _Run(
        grid=grid,
        cfg=cfg,
        reporter=reporter,
        active=active,
        arrays=arrays,
        config=config,
        prepared=prepared,
        node_site={n: s for s, n in active.items()},
        players=players,
        player_of={s: i for i, s in enumerate(players)},
        initial=initial,
        strategy=strategy,
        limits=limits,
        faulty=faulty,
        site_node=found.site_node,
        train_check=bounds_check(
            "train", limits, test_fraction=cfg.test_fraction, classes=len(classes)
        ),
        test_check=bounds_check(
            "test", limits, test_fraction=cfg.test_fraction, classes=len(classes)
        ),
        secagg=SecAggParams.of(cfg.spec),
        max_rows=max((lim.rows for lim in limits.values()), default=0)
        or max(found.site_reply[s][1].rows for s in active),
    )
    run.strategy = privacy.wrap(run.strategy, cfg.spec.privacy)  # dp off: unchanged
    privacy.round_config(run.strategy, run.config)
    return run


def _train_round(run: _Run, rnd: int, sites_out: dict[str, dict]) -> dict:
    """Round step a: train at the active sites, log the round for the contribution and move the
    global model to Flower's FedAvg aggregate. Returns the aggregated train metrics. A site's
    outcome goes into ``sites_out``; with fewer than ``min_sites`` replies the round is posted
    as partial and ``JobFailed`` raised; a reply or an aggregate with NaN or infinity raises
    ``NonFinite`` naming the round (and the site)."""
    secure = None
    if run.secagg is not None:
        train, secure = _secure_train(run, rnd, sites_out)
    else:
        train = run.send_model(MessageType.TRAIN, TrainReply, sites_out, rnd, check=run.train_check)
    return _aggregate_round(run, rnd, sites_out, train, secure)


def _aggregate_round(run: _Run, rnd: int, sites_out: dict[str, dict], train: dict, secure=None):
    """Round step a's second half: ``train`` (node → (reply, :class:`TrainReply`) of the replies
    that fit) into ``sites_out``, the round's log for the contribution and the new global model
    (``secure``: a SecAgg+ round's summed model). Returns the aggregated train metrics. Raises
    ``JobFailed`` (fewer than ``min_sites`` replies) and ``NonFinite`` as :func:`_train_round`."""
    min_sites = run.cfg.spec.min_sites
    for node, (_, m) in train.items():
        sites_out[run.node_site[node]].update(
            ok=True,
            train_examples=m.num_examples,
            train_loss=m.train_loss,
            cpu_seconds=m.cpu_seconds,
            wall_seconds=m.wall_seconds,
            bytes_received=m.bytes_received,
            bytes_sent=m.bytes_sent,
        )
    if len(train) < min_sites:
        run.post_partial(rnd, sites_out)
        raise JobFailed(
            f"round {rnd}: {len(train)} of {len(run.active)} sites replied (need {min_sites})"
        )
    if run.is_trees:  # FedXgbBagging: every site's new trees appended (frp_flwr.trees)
        run.arrays, train_agg = trees.aggregate(
            run.strategy, run.arrays, rnd, [r for r, _ in train.values()]
        )
        return train_agg or {}
    if run.secagg is not None:  # no individual update exists here: no round log, no contribution
        # the job's strategy steps from the secure weighted mean (FedOpt: its pseudo-gradient)
        arrays, _ = aggregate_mean(
            run.strategy, rnd, run.arrays, secure, sum(m.num_examples for _, m in train.values())
        )
        if arrays is None or not all(np.isfinite(a).all() for a in _arrays(arrays)):
            run.post_partial(rnd, sites_out)
            raise NonFinite(f"round {rnd}: the aggregated model is not finite (NaN or infinity)")
        run.arrays = arrays
        return {"train-loss": _weighted_loss([m for _, m in train.values()])}
    # The model every site receives next, and the coalition models of the closing evaluation,
    # are weighted by the released counts, not the exact ones (weigh_by_released, ADR 0036).
    player = {n: run.player_of[run.node_site[n]] for n in train}
    run.history.append(
        RoundLog(
            start=_arrays(run.arrays),
            updates={player[n]: _arrays(r.content["arrays"]) for n, (r, _) in train.items()},
            examples={player[n]: released(m.num_examples) for n, (_, m) in train.items()},
        )
    )
    replies = weigh_by_released(run.strategy, [r for r, _ in train.values()])
    replies = privacy.before_aggregate(run.strategy, replies, run.arrays)
    arrays, train_agg = aggregate_train(run.strategy, rnd, run.arrays, replies)
    if not all(np.isfinite(a).all() for a in _arrays(arrays)):
        run.post_partial(rnd, sites_out)
        raise NonFinite(f"round {rnd}: the aggregated model is not finite (NaN or infinity)")
    run.arrays = arrays
    return train_agg or {}


def _secure_train(run: _Run, rnd: int, sites_out: dict[str, dict]):
    """Round step a of a SecAgg+ job (``frp_flwr.secagg.secure_train_round``): returns node →
    (``None``, clear metrics) of the sites whose masked update is in the sum, and the new global
    model; the others' entries in ``sites_out`` say why they are not. Raises ``JobFailed``."""
    try:
        outcome = secure_train_round(
            run.grid,
            params=run.secagg,
            active=run.active,
            arrays=run.arrays,
            fit_config=fit_config(run.config),
            rnd=rnd,
            max_examples=run.max_rows,
            timeout=run.cfg.round_timeout,
            poll=run.cfg.poll_interval,
            on_reply=REPLY_LOG.write,
            check=lambda node, m, elapsed: (
                run.train_check(run.node_site[node], m, elapsed) if run.train_check else ""
            ),
        )
    except (SecAggError, ContractError) as exc:
        run.post_partial(rnd, sites_out)
        raise JobFailed(str(exc)) from None
    for node, error in outcome.errors.items():
        if node in run.node_site:
            sites_out[run.node_site[node]].update(ok=False, error=sanitise(error))
    if not all(np.isfinite(a).all() for a in _arrays(outcome.arrays)):
        run.post_partial(rnd, sites_out)
        raise NonFinite(f"round {rnd}: the aggregated model is not finite (NaN or infinity)")
    return {n: (None, m) for n, m in outcome.replies.items()}, outcome.arrays


def _weighted_loss(replies: list[TrainReply]) -> float | None:
    """The train loss averaged over the sites, weighted by their examples (FedAvg's metric)."""
    total = sum(m.num_examples for m in replies)
    return sum(m.train_loss * m.num_examples for m in replies) / total if total else None


def _evaluate_round(run: _Run, rnd: int, sites_out: dict[str, dict]) -> None:
    """Round step b: federated evaluation of the new global model at the active sites; each
    site's figures (and metering, added to its training's) go into ``sites_out`` and
    ``run.last_eval``, Flower's aggregate into ``run.aggregate_eval``. After the last round each
    site's final aggregates (``contract.EvalReport``) go into ``run.reports`` and its metrics
    into ``run.last_eval``. Replies out of the portal's bounds are refused (``run.test_check``)."""
    evaluation = run.send_model(
        MessageType.EVALUATE, EvaluateReply, sites_out, rnd, check=run.test_check
    )
    _record_evaluation(run, rnd, sites_out, evaluation, final=rnd == run.cfg.num_rounds)


def _record_evaluation(
    run: _Run, rnd: int, sites_out: dict[str, dict], evaluation: dict, *, final: bool
) -> None:
    """Round step b's second half: ``evaluation`` (node → (reply, :class:`EvaluateReply`) of the
    replies that fit; with ``final`` each reply's ``report`` too) into ``sites_out``,
    ``run.last_eval``, ``run.reports`` and ``run.aggregate_eval`` (:func:`_evaluate_round`)."""
    for node, (reply, m) in evaluation.items():
        site = run.node_site[node]
        entry = sites_out[site]
        accuracy = m.eval_accuracy if run.task == "classification" else None
        entry.update(
            eval_examples=m.num_examples,
            eval_loss=m.eval_loss,
            eval_accuracy=accuracy,
            cpu_seconds=entry.get("cpu_seconds", 0.0) + m.cpu_seconds,
            wall_seconds=entry.get("wall_seconds", 0.0) + m.wall_seconds,
            bytes_received=entry.get("bytes_received", 0) + m.bytes_received,
            bytes_sent=entry.get("bytes_sent", 0) + m.bytes_sent,
        )
        site_scores = None
        if final:
            try:
                run.reports[site] = EvalReport.from_record(reply.content["report"])
                site_scores = site_metrics(run.task, run.reports[site])
            except (ContractError, KeyError) as exc:
                entry.update(ok=False, error=sanitise(f"malformed evaluation report: {exc}"))
        run.last_eval[site] = SiteEvaluation(
            eval_examples=m.num_examples,
            eval_loss=m.eval_loss,
            eval_accuracy=accuracy,
            metrics=site_scores,
        )
    _refuse_unfit_entries(sites_out)
    ok_sites = {s for s, e in sites_out.items() if e.get("ok") is True}
    eval_agg = (
        run.strategy.aggregate_evaluate(
            rnd, [r for n, (r, _) in evaluation.items() if run.node_site[n] in ok_sites]
        )
        or {}
    )
    run.aggregate_eval = {
        "eval_loss": finite_or_none(eval_agg.get("eval-loss")),
        "eval_accuracy": (
            finite_or_none(eval_agg.get("eval-accuracy")) if run.task == "classification" else None
        ),
        "eval_examples": sum(int(sites_out[s].get("eval_examples", 0)) for s in ok_sites),
    }


def _drop_sites(run: _Run, rnd: int, sites_out: dict[str, dict], answer: CallbackAnswer) -> None:
    """Round step d: drop the sites that failed this round and any the portal asks to drop
    (revoked grants). Raises ``JobFailed`` when rounds remain and fewer than ``min_sites`` stay."""
    min_sites = run.cfg.spec.min_sites
    failed = {s for s, e in sites_out.items() if e.get("ok") is False} & set(run.active)
    revoked = set(answer.drop_sites) & set(run.active)
    for site in failed | revoked:
        run.active.pop(site, None)
    if rnd < run.cfg.num_rounds and len(run.active) < min_sites:
        why = [f"{s}: grant revoked" for s in sorted(revoked)] + [
            f"{s}: {sites_out[s].get('error', 'failed')}" for s in sorted(failed)
        ]
        raise JobFailed(
            f"after round {rnd}, {len(run.active)} site(s) remain, fewer than the job's minimum "
            f"of {min_sites} ({'; '.join(why)})"
        )


def _round(run: _Run, rnd: int) -> None:
    """One round: :func:`_fused_round` (ADR 0032), or for a SecAgg+ job train, evaluate, post
    the ``round`` event (step c), drop sites (:func:`_unfused_round`)."""
    if run.fused:
        _fused_round(run, rnd)
    else:
        _unfused_round(run, rnd)


def _first_sites_out(run: _Run, rnd: int) -> dict[str, dict]:
    """Round ``rnd``'s entries of the active sites; round 1 also reports the sites refused after
    discovery."""
    sites_out: dict[str, dict] = {s: {"node_id": str(n)} for s, n in run.active.items()}
    if rnd == 1:
        for site, error in run.faulty.items():
            sites_out[site] = {"node_id": str(run.site_node[site]), "ok": False, "error": error}
    return sites_out


def _post_round(
    run: _Run, rnd: int, sites_out: dict[str, dict], train_agg: dict, wall: float
) -> CallbackAnswer:
    """Step c and d: post round ``rnd`` (its train aggregate ``train_agg``, ``run.aggregate_eval``
    and ``wall`` seconds), then drop the sites it failed and the sites the portal's answer drops
    (:func:`_drop_sites`, which raises ``JobFailed``)."""
    answer = run.reporter.post(
        Round(
            round=rnd,
            train_loss=finite_or_none(train_agg.get("train-loss")),
            train_examples=sum(
                int(e.get("train_examples", 0)) for e in sites_out.values() if e.get("ok") is True
            ),
            wall_seconds=wall,
            sites={s: _site_round(e) for s, e in sites_out.items()},
            **run.aggregate_eval,
        )
    )
    _heed_contribution(run, answer)
    _drop_sites(run, rnd, sites_out, answer)
    return answer


def _unfused_round(run: _Run, rnd: int) -> None:
    """One round of a SecAgg+ job: train, evaluate, post the ``round`` event, drop sites.

    Not fused (ADR 0032): SecAgg+'s train replies are masked vectors summed over several protocol
    stages in ``frp_flwr.secagg`` (Flower's ``SecAggPlusWorkflow``), and a site that drops out
    mid-protocol is unmasked by the others' shares; evaluating inside that exchange would tie the
    evaluation's replies to the protocol's dropouts and thresholds. Two messages per round stay."""
    t0 = time.monotonic()
    run.config["server-round"] = rnd
    run.config["final"] = rnd == run.cfg.num_rounds
    sites_out = _first_sites_out(run, rnd)
    train_agg = _train_round(run, rnd, sites_out)
    _evaluate_round(run, rnd, sites_out)
    _post_round(run, rnd, sites_out, train_agg, time.monotonic() - t0)


@dataclass
class _Pending:
    """A fused round trained and aggregated whose evaluation comes with the next message:
    its number, its sites' entries (train figures), the aggregated train metrics, its start
    (``time.monotonic``) and, when a checkpoint is due, the run's state after its aggregation
    (``_snapshot``)."""

    rnd: int
    sites_out: dict[str, dict]
    train_agg: dict
    t0: float
    snapshot: dict | None = None


def _snapshot(run: _Run) -> dict:
    """The state a checkpoint of the current round saves (model, history, strategy state),
    copied now: the checkpoint is written one message later (:func:`_fused_round`)."""
    return {
        "weights": list(run.arrays.to_numpy_ndarrays()),
        "history": list(run.history),
        "state": copy.deepcopy(checkpoints.strategy_state(run.strategy)),
    }


def _model_messages(run: _Run, plan: dict[int, tuple[str, ConfigRecord, dict]]) -> Exchange:
    """Send the current global model to each node of ``plan`` (node → (message type, config,
    more records)) in one push; pull the replies (:func:`exchange`)."""
    msgs = [
        Message(
            RecordDict({"arrays": run.arrays, "config": config, **extra}),
            dst_node_id=node,
            message_type=message_type,
        )
        for node, (message_type, config, extra) in plan.items()
    ]
    return exchange(run.grid, msgs, timeout=run.cfg.round_timeout, poll=run.cfg.poll_interval)


def _parts(result: Exchange, nodes, part) -> Exchange:
    """``result`` restricted to ``nodes``, each reply as ``part(reply)``: a view
    (:func:`_view`), or a text, which becomes that node's error."""
    out = Exchange(elapsed=result.elapsed)
    out.errors = {n: e for n, e in result.errors.items() if n in nodes}
    out.timed_out = {n for n in result.timed_out if n in nodes}
    for node, reply in result.replies.items():
        if node in nodes:
            view = part(reply)
            if isinstance(view, str):
                out.errors[node] = view
            else:
                out.replies[node] = view
    return out


def _evaluation_part(reply: Message) -> Message | str:
    """The evaluation of a fused reply (a train reply's :data:`EVALUATION_RECORD`, or a plain
    evaluate reply's ``metrics`` and ``report``) as a single-part evaluate reply."""
    if reply.metadata.message_type == MessageType.TRAIN:
        if EVALUATION_RECORD not in reply.content:
            return "malformed train reply: no evaluation of the global model it received"
        return _view(reply, metrics=reply.content[EVALUATION_RECORD])
    records = {k: reply.content[k] for k in ("metrics", "report") if k in reply.content}
    return _view(reply, **records)


def _train_part(reply: Message) -> Message | str:
    """The training of a fused train reply (``arrays``, ``metrics``), or its
    :data:`TRAIN_ERROR_RECORD`'s reason as text."""
    if TRAIN_ERROR_RECORD in reply.content:
        try:
            return sanitise(readable_error(reply_error(reply.content[TRAIN_ERROR_RECORD], "error")))
        except ContractError as exc:
            return sanitise(f"malformed train reply: {exc}")
    return _view(
        reply, **{k: reply.content[k] for k in ("arrays", "metrics") if k in reply.content}
    )


def _parse_round(run: _Run, rnd: int, sites_out: dict[str, dict], result: Exchange, kind: str):
    """:func:`parse_replies` of ``kind`` (``train`` or ``evaluate``) parts of round ``rnd``; a
    non-finite one posts the round as partial, then raises ``NonFinite``. The train parts are
    bounded with the metering of the evaluation that came in the same reply added
    (``run.fused_metering``: node → (CPU s, wall s)), the whole reply's work within its time."""
    if kind == MessageType.TRAIN:
        extra = run.fused_metering

        def check(site, m, elapsed):
            cpu, wall = extra.get(run.active.get(site, -1), (0.0, 0.0))
            summed = replace(m, cpu_seconds=m.cpu_seconds + cpu, wall_seconds=m.wall_seconds + wall)
            return run.train_check(site, summed, elapsed) if run.train_check else ""

        reply_type = TrainReply
    else:
        check, reply_type = run.test_check, EvaluateReply
    try:
        return parse_replies(
            result,
            message_type=kind,
            sent=run.arrays,
            node_site=run.node_site,
            sites_out=sites_out,
            reply_type=reply_type,
            check=check,
            rnd=rnd,
            timeout=run.cfg.round_timeout,
        )
    except NonFinite:
        run.post_partial(rnd, sites_out)
        raise


def _fused_round(run: _Run, rnd: int) -> None:
    """One fused round (issue 12, ADR 0032): ONE message per site carries the global model of
    round ``rnd − 1``, which the site evaluates (the figures of round ``rnd − 1``), then trains
    from; round ``rnd − 1`` is then complete: its ``round`` event is posted, its failed and
    revoked sites dropped (their round-``rnd`` training is discarded, as if never sent) and its
    checkpoint saved; then round ``rnd`` is aggregated from the sites left and waits
    (``run.pending``) for its evaluation in the next message (:func:`_close` after the last).

    A site that failed round ``rnd − 1``'s training gets a plain evaluate message instead, as
    before. Raises ``JobFailed`` / ``NonFinite`` as the unfused round does, naming the round the
    failing part belongs to (the evaluation's round ``rnd − 1``, the training's ``rnd``)."""
    t0 = time.monotonic()
    pending = run.pending
    run.config["server-round"] = rnd
    run.config["final"] = rnd == run.cfg.num_rounds
    fused = ConfigRecord({**dict(run.config.items()), EVALUATE_INCOMING: pending is not None})
    failed_before = set()
    if pending is not None:  # a site that failed the round before only evaluates, as before
        failed_before = {
            run.active[s]
            for s, e in pending.sites_out.items()
            if s in run.active and e.get("ok") is not True
        }
    before = ConfigRecord({**dict(run.config.items()), "server-round": rnd - 1, "final": False})
    plan = {
        n: (MessageType.EVALUATE, before, {})
        if n in failed_before
        else (MessageType.TRAIN, fused, {})
        for n in run.active.values()
    }
    result = _model_messages(run, plan)
    run.fused_metering = {}
    if pending is not None:
        evaluation = _parse_round(
            run,
            pending.rnd,
            pending.sites_out,
            _parts(result, set(plan), _evaluation_part),
            MessageType.EVALUATE,
        )
        _record_evaluation(run, pending.rnd, pending.sites_out, evaluation, final=False)
        run.fused_metering = {
            n: (m.cpu_seconds, m.wall_seconds) for n, (_, m) in evaluation.items()
        }
        _post_round(
            run, pending.rnd, pending.sites_out, pending.train_agg, time.monotonic() - pending.t0
        )
        _checkpoint(run, pending.rnd, pending.snapshot)
    sites_out = _first_sites_out(run, rnd)
    trained = {n for n in run.active.values() if n not in failed_before}
    train_result = _parts(result, trained, _train_part)
    if pending is not None:  # silences and errors were the evaluation's (round rnd − 1)'s
        train_result.errors = {n: e for n, e in train_result.errors.items() if n in result.replies}
        train_result.timed_out = set()
    train = _parse_round(run, rnd, sites_out, train_result, MessageType.TRAIN)
    train_agg = _aggregate_round(run, rnd, sites_out, train)
    due = run.store is not None and rnd < run.cfg.num_rounds
    run.pending = _Pending(rnd, sites_out, train_agg, t0, _snapshot(run) if due else None)


def _close(run: _Run) -> None:
    """The closing message of a fused run (ADR 0032): the final model to every active site, with
    the coalition models beside it when the contribution is measured (not to a site that failed
    the last round's training: it is dropped before the contribution, as before). Posts the last
    round's ``round`` event and drops sites; the contribution event is kept in
    ``run.contribution`` for :func:`_report_contribution` (after ``finished``)."""
    pending, run.pending = run.pending, None
    if pending is None:  # no round ran (a resume past the last round): _finish says so
        return
    rnd = pending.rnd
    run.config["server-round"] = rnd
    run.config["final"] = True
    plan_c = None
    if run.cfg.contribution and not run.is_trees:
        try:
            plan_c = coalition_plan(
                run.players, run.initial, run.history, strategy=run.cfg.spec.strategy
            )
        except Exception as exc:  # contribution is an add-on: the trained model stands regardless
            log.warning("contribution evaluation failed: %s", exc)
            run.contribution = Contribution(
                players=run.players, error=sanitise(f"{exc}", limit=1000)
            )
    scoring = {
        n
        for s, n in run.active.items()
        if plan_c is not None and pending.sites_out.get(s, {}).get("ok") is True
    }
    with_keys = (
        ConfigRecord({**dict(run.config.items()), "coalition-keys": plan_c.keys})
        if plan_c is not None
        else run.config
    )
    plan = {
        n: (MessageType.EVALUATE, with_keys, {"models": plan_c.stacked})
        if n in scoring
        else (MessageType.EVALUATE, run.config, {})
        for n in run.active.values()
    }
    t0 = time.monotonic()
    result = _model_messages(run, plan)
    wall = time.monotonic() - t0
    evaluation = _parse_round(
        run,
        rnd,
        pending.sites_out,
        _parts(result, set(plan), _evaluation_part),
        MessageType.EVALUATE,
    )
    _record_evaluation(run, rnd, pending.sites_out, evaluation, final=True)
    _post_round(run, rnd, pending.sites_out, pending.train_agg, time.monotonic() - pending.t0)
    if plan_c is None:
        return
    metering = {n: (m.cpu_seconds, m.wall_seconds) for n, (_, m) in evaluation.items()}

    def coalition_part(reply: Message) -> Message | str:
        if COALITION_ERROR_RECORD in reply.content:
            try:
                return sanitise(
                    readable_error(reply_error(reply.content[COALITION_ERROR_RECORD], "error"))
                )
            except ContractError as exc:
                return sanitise(f"malformed coalition reply: {exc}")
        if COALITIONS_RECORD not in reply.content:
            return "malformed evaluate reply: no scores of the coalition models"
        return _view(reply, metrics=reply.content[COALITIONS_RECORD])

    def check(site, m, elapsed):  # the evaluation's metering added: the reply's work in its time
        cpu, wall_ = metering.get(run.active.get(site, -1), (0.0, 0.0))
        summed = replace(m, cpu_seconds=m.cpu_seconds + cpu, wall_seconds=m.wall_seconds + wall_)
        return run.test_check(site, summed, elapsed) if run.test_check else ""

    scorers = {s: n for s, n in run.active.items() if n in scoring}  # after the drops
    try:
        run.contribution = score_coalitions(
            plan_c,
            _parts(result, set(scorers.values()), coalition_part),
            active=scorers,
            timeout=run.cfg.round_timeout,
            check=check,
            task=run.task,
            wall_seconds=wall,
        )
    except Exception as exc:  # contribution is an add-on: the trained model stands regardless
        log.warning("contribution evaluation failed: %s", exc)
        run.contribution = Contribution(players=run.players, error=sanitise(f"{exc}", limit=1000))


def _finish(run: _Run) -> None:
    """Step 4: post ``finished`` with the final model, the pooled metrics and the baseline
    (``frp_flwr.metrics``) and the fitted preprocessing. Raises ``JobFailed`` when the final
    federated loss is not finite (the model diverged)."""
    if run.aggregate_eval.get("eval_loss") is None:
        raise JobFailed("the final model's federated loss is not a finite number (it diverged)")
    pooled = baseline_ = None
    if run.reports:
        reports = list(run.reports.values())
        pooled = pooled_metrics(run.task, reports)
        baseline_ = baseline(
            run.task,
            reports,
            pooled,
            classes=run.classes,
            train_labels=run.prepared.train_labels,
        )
    run.reporter.post(
        Finished(
            rounds=run.cfg.num_rounds,
            sites=run.last_eval,
            classes=run.classes,
            model=[] if run.is_trees else [a.tolist() for a in run.arrays.to_numpy_ndarrays()],
            metrics=pooled,
            baseline=baseline_,
            preprocessing=json.loads(run.prepared.fitted.to_text()),
            **run.aggregate_eval,
        )
    )


def _report_contribution(run: _Run) -> None:
    """Step 5: :func:`evaluate_contribution` at the remaining sites, posted as ``contribution``;
    a failure is posted in the event (never raised: the trained model stands regardless). A fused
    run scored the coalitions in its closing message (:func:`_close`): that event is posted."""
    if run.contribution is not None:
        run.reporter.post(run.contribution)
        return
    try:
        event = evaluate_contribution(
            grid=run.grid,
            players=run.players,
            initial=run.initial,
            rounds=run.history,
            active=run.active,
            config=run.config,
            timeout=run.cfg.round_timeout,
            poll=run.cfg.poll_interval,
            check=run.test_check,
            task=run.task,
            strategy=run.cfg.spec.strategy,
        )
    except Exception as exc:  # contribution is an add-on: the trained model stands regardless
        log.warning("contribution evaluation failed: %s", exc)
        event = Contribution(players=run.players, error=sanitise(f"{exc}", limit=1000))
    run.reporter.post(event)


def run_job(grid: Grid, cfg: RunConfig, reporter: Reporter, *, store=None) -> None:
    """Discovery, preparation, FedAvg rounds and reporting for one job (module docstring).

    ``store``: the model store of this host (``checkpoints.store_from_environ``; ``None``: no
    checkpoints): after every round but the last the run's state is saved there
    (:func:`_checkpoint`); with ``cfg.resume_round = k`` the run starts from round ``k``'s
    checkpoint instead of preparing the data again (:func:`_resume`) and trains rounds k+1 ….

    Steps: :func:`_discover_sites`, :func:`_start` (the federated preprocessing, posted with
    ``started``; classes; initial model), ``num_rounds`` × :func:`_round` (train, evaluate,
    ``round``, drop sites), :func:`_finish` (``finished``) and, unless ``cfg.contribution`` is
    off (or the portal's answer to an event turned it off, :func:`_heed_contribution`),
    :func:`_report_contribution`. Raises ``JobFailed`` with the reason the run cannot go on.
    """
    found = _discover_sites(grid, cfg, reporter)
    if cfg.resume_round:
        run = _resume(grid, cfg, reporter, found, store)
    else:
        run = _start(grid, cfg, reporter, found)
    run.store = store
    for rnd in range(cfg.resume_round + 1, cfg.num_rounds + 1):
        _round(run, rnd)
        if not run.fused:  # a fused round's checkpoint is saved when its evaluation is in
            _checkpoint(run, rnd)
    if run.fused:
        _close(run)
    _finish(run)
    # trees: data volume, at the portal (ADR 0023); SecAgg+: no update to rebuild coalitions from
    if not run.is_trees and run.secagg is None:
        if run.contribution is not None or run.cfg.contribution:
            # scored in the closing message (before any later answer turned it off: the
            # portal refuses it if the consent has ended), or to be scored now
            _report_contribution(run)
        elif run.contribution_off:
            run.reporter.post(Contribution(players=run.players, error=run.contribution_off))


def reporter_for(cfg: RunConfig, *, run_id: int, environ=None) -> Reporter:
    """The run's reporter: its job key from this host's platform callback key (never the run
    config). Raises ``JobFailed`` when the callback URL is set but this host has no key."""
    if not cfg.callback_url:
        return Reporter("")
    try:
        master = master_key_from_environ(environ)
    except SignatureError as exc:
        raise JobFailed(str(exc)) from None
    return Reporter(cfg.callback_url, job_key(master, job_id=cfg.job_id, run_id=run_id))


# ---------------------------------------------------------------------------------------------
# Round checkpoints and resuming (issue 14, point 5; frp_flwr.checkpoints)
# ---------------------------------------------------------------------------------------------


def _model_store():
    """This host's model store (``FRP_MODEL_STORE_URL``), or ``None``: a misconfigured store is
    logged, and the run goes on without checkpoints."""
    try:
        return checkpoints.store_from_environ()
    except checkpoints.CheckpointError as exc:
        log.warning("no round checkpoints: %s", exc)
        return None


def _checkpoint(run: _Run, rnd: int, snapshot: dict | None = None) -> None:
    """Save the run's state after round ``rnd`` (not after the last: the final model is the
    ``finished`` event's) to ``run.store``: the global model, the strategy's state, the round
    history the contribution needs and the fitted preprocessing. A store that fails is logged;
    training goes on (the run then resumes from an earlier round).

    A fused round (ADR 0032) is checkpointed when its ``round`` event is posted, one message after
    its aggregation: ``snapshot`` (:func:`_snapshot`) holds the model, history and strategy state
    of then; the active sites are those left after its drops, as for an unfused round. So a
    checkpoint of round k always follows round k's event, and a resumed run's first message
    trains round k + 1 with nothing to evaluate."""
    if run.store is None or rnd >= run.cfg.num_rounds:
        return
    state = snapshot or _snapshot(run)
    checkpoint = checkpoints.Checkpoint(
        job_id=run.cfg.job_id,
        round=rnd,
        weights=state["weights"],
        initial=run.initial,
        history=state["history"],
        players=run.players,
        active=sorted(run.active),
        fitted=run.prepared.fitted.to_text(),
        preparation=run.prepared.preparation.to_json(),
        train_labels=run.prepared.train_labels,
        released_labels=run.prepared.released_labels,
        strategy=type(run.strategy).__name__,
        state=state["state"],
    )
    try:
        checkpoints.save(run.store, checkpoint)
    except checkpoints.CheckpointError as exc:
        log.warning("round %d: %s", rnd, exc)


def _resume(grid: Grid, cfg: RunConfig, reporter: Reporter, found: _Discovered, store) -> _Run:
    """Step 2 of a resumed run: the run of round ``cfg.resume_round``'s checkpoint (its
    preprocessing, model, strategy state and history) at the sites found now that were still
    training then; ``started`` is posted with the checkpoint's preparation. Raises ``JobFailed``
    when this host has no model store, the checkpoint cannot be read or too few sites are left."""
    if store is None:
        reporter.post(found.started)
        raise JobFailed(
            f"resume-round is {cfg.resume_round}, but this ServerApp host has no model store "
            f"({checkpoints.STORE_ENV})"
        )
    try:
        saved = checkpoints.load(store, cfg.job_id, cfg.resume_round)
    except checkpoints.CheckpointError as exc:
        reporter.post(found.started)
        raise JobFailed(f"cannot resume: {exc}") from None
    for site in [s for s in found.active if s not in saved.active]:
        found.active.pop(site)  # dropped before the checkpoint: it stays out
    prepared = Prepared(
        Fitted.from_text(saved.fitted),
        Preparation.from_json(saved.preparation),
        saved.train_labels,
        saved.released_labels,
    )
    answer = reporter.post(replace(found.started, preparation=prepared.preparation))
    faulty = _refuse_by_limits(found, answer.limits, cfg.spec.min_sites)
    # impostor nodes and revoked grants are refused; the checkpoint's preprocessing stays
    faulty.update(_refused_by_portal(found, answer.drop_sites, cfg.spec.min_sites))
    run = _make_run(
        grid,
        cfg,
        reporter,
        found,
        prepared,
        ArrayRecord(saved.weights),
        answer.limits,
        faulty,
        saved.players,
        saved.initial,
    )
    _heed_contribution(run, answer)
    run.history = list(saved.history)
    checkpoints.strategy_restore(run.strategy, saved.state)
    log.info("job %s resumed after round %d", cfg.job_id, cfg.resume_round)
    return run


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of the ServerApp; a failure is reported to the portal, then re-raised."""
    cfg = RunConfig.from_flower(context.run_config)
    reporter = reporter_for(cfg, run_id=context.run_id)
    REPLY_LOG.path = cfg.reply_log
    try:
        run_job(grid, cfg, reporter, store=_model_store())
    except Exception as exc:
        reporter.post(Failed(reason=sanitise(f"{exc}", limit=1000)))
        raise
