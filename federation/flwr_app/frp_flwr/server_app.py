"""ServerApp: discovers the job's sites, runs FedAvg, reports every round to the portal.

Flow of one run (one portal job):

1. **Discovery** — a ``query`` message to every connected node; each replies with its site id (from the
   operator's ``--node-config``). The job's sites are mapped to node ids; two nodes claiming one site
   fail the run. Participating sites also return federated standardisation statistics and labels.
2. **Rounds** — FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
   Decentralized Data"), using Flower's ``FedAvg`` aggregation, over the job's nodes only (other jobs'
   sites on the same SuperLink are never sampled). Each round: train, then federated evaluation on
   each site's held-out split. Replies are attributed through ``reply_to_message_id`` → the node the
   message was sent to (SuperLink errors come from node 1). A site that errs or times out is dropped;
   fewer than ``min_sites`` replies fail the run.
3. **Reporting** — after every round a signed callback to the portal with the aggregate and per-site
   metrics (including each site's metering: CPU and wall seconds, bytes received and sent); the
   portal may answer with sites to drop (revoked grants). At the end a ``finished`` callback with
   final metrics and the model. The run's own status stays with the SuperLink.
4. **Contribution** (ADR 0010) — the app keeps, in memory, every round's starting global weights and
   each site's returned weights. After ``finished`` it rebuilds coalition models without retraining
   (``task.coalition_run_model``; per round too within a model budget), sends them all to every remaining
   site in ONE ``evaluate.coalitions`` message, and posts a ``contribution`` event with
   utility(S) = example-weighted accuracy of S's model across sites. The portal computes the
   Shapley values. A failure here is reported in the event and does not fail the run.

Polling: ``Grid.send_and_receive`` sleeps 3 s between pulls; this app pushes and pulls itself every
``poll-interval`` seconds (0.2 s by default).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from frp_flwr.task import (
    MAX_COALITION_MODELS,
    JobSpec,
    RoundLog,
    coalition_key,
    coalition_models,
    combine_sums,
    contribution_plan,
    init_params,
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
    """Posts signed JSON events to the portal's callback URL; never raises on network failure."""

    url: str
    token: str
    attempts: int = 4

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"callback-url must be http(s), not {self.url[:20]!r}")

    def post(self, event: str, payload: dict) -> dict:
        """POST ``{"event": event, **payload}``; return the portal's JSON answer (``{}`` if none)."""
        if not self.url:
            return {}
        from federation.signing import sign  # the shared signing scheme (no Django)

        body = json.dumps({"event": event, **payload}, separators=(",", ":")).encode()
        for attempt in range(self.attempts):
            headers = {"Content-Type": "application/json", **sign(self.token, body)}
            request = urllib.request.Request(  # noqa: S310 — http(s) only, checked in __post_init__
                self.url, data=body, headers=headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                    text = response.read().decode() or "{}"
                    return json.loads(text)
            except (urllib.error.URLError, TimeoutError, ValueError) as exc:
                log.warning("callback %s failed (attempt %d): %s", event, attempt + 1, exc)
                time.sleep(0.5 * 2**attempt)
        return {}


# ---------------------------------------------------------------------------------------------
# Messaging with attribution
# ---------------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """The outcome of one fan-out: replies and errors per node id, and nodes that never answered."""

    replies: dict[int, Message] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    timed_out: set[int] = field(default_factory=set)


def _record_to_json(record) -> dict:
    """A RecordDict as plain JSON: arrays as nested lists, metric/config records as dicts."""
    out = {}
    for key, value in record.items():
        if isinstance(value, ArrayRecord):
            out[key] = [a.tolist() for a in value.to_numpy_ndarrays()]
        else:
            out[key] = {
                k: (list(v) if isinstance(v, list | tuple) else v) for k, v in value.items()
            }
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
            REPLY_LOG.write(node, reply)
            if reply.has_error():
                out.errors[node] = sanitise(reply.error.reason or "unknown error")
            else:
                out.replies[node] = reply
        if pending:
            time.sleep(poll)
    out.timed_out = {node_of[m] for m in pending}
    return out


def discover(
    grid: Grid, spec: JobSpec, *, timeout: float, poll: float
) -> tuple[dict[str, int], dict[str, Message], dict[str, str]]:
    """Map the job's site ids to node ids. Returns ``(site→node, site→query reply, site→error)``.

    Raises ``JobFailed`` when two nodes claim one site.
    """
    deadline = time.monotonic() + timeout
    asked: set[int] = set()
    site_node: dict[str, int] = {}
    site_reply: dict[str, Message] = {}
    site_error: dict[str, str] = {}
    while time.monotonic() < deadline and len(site_node) < len(spec.sites):
        new = [n for n in grid.get_node_ids() if n not in asked]
        if not new:
            time.sleep(poll)
            continue
        asked.update(new)
        msgs = [
            Message(
                RecordDict({"config": ConfigRecord({})}),
                dst_node_id=n,
                message_type=MessageType.QUERY,
            )
            for n in new
        ]
        result = exchange(grid, msgs, timeout=max(1.0, deadline - time.monotonic()), poll=poll)
        for node, reply in result.replies.items():
            site = str(reply.content["info"]["site"])
            if site not in spec.sites:
                continue
            if site in site_node and site_node[site] != node:
                raise JobFailed(f"two nodes claim site {site!r}; refusing to run")
            site_node[site] = node
            site_reply[site] = reply
        for node, error in result.errors.items():
            # A member site that could not open its data names itself in the error text.
            for site in spec.sites:
                if f"site {site!r}" in error:
                    site_error[site] = error
                    site_node.setdefault(site, node)
    return site_node, site_reply, site_error


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


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
) -> Exchange:
    """Send ``arrays`` + ``config`` to every active node; mark errors and silences in ``sites_out``."""
    msgs = [
        Message(
            RecordDict({"arrays": arrays, "config": config}),
            dst_node_id=n,
            message_type=message_type,
        )
        for n in active.values()
    ]
    result = exchange(grid, msgs, timeout=timeout, poll=poll)
    for node, error in result.errors.items():
        sites_out[node_site[node]].update(ok=False, error=error)
    for node in result.timed_out:
        sites_out[node_site[node]].update(ok=False, error=f"no reply within {timeout:.0f} s")
    return result


def _site_metrics(reply: Message) -> dict:
    m = reply.content["metrics"]
    return {k: float(v) for k, v in m.items() if not isinstance(v, list)}


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
) -> dict:
    """Score coalition models at every active site with one message each; return the event payload.

    ``players``: site ids, index = player number in ``rounds``. Models: the whole run for each
    coalition of :func:`task.contribution_plan` (round key ``"0"``) and, while the message stays
    within ``MAX_COALITION_MODELS`` models, the same coalitions for every round ``t`` (key
    ``str(t)``, model ``w_{t−1} + Δ_S^t``). Utility = Σ_s n_s·acc_s(S) / Σ_s n_s over the sites that replied
    (``n_s`` held-out examples). Returns ``{"players", "method", "permutations", "seed",
    "utilities": {round key: {coalition key: utility}}, "examples", "models", "sites" (metering),
    "wall_seconds", "errors"}``. Raises ``JobFailed`` when no site replies.
    """
    t0 = time.monotonic()
    method, coalitions, permutations = contribution_plan(len(players), seed=seed)
    keys: list[str] = []
    models: list[list[np.ndarray]] = []
    with_rounds = len(coalitions) * (len(rounds) + 1) <= MAX_COALITION_MODELS
    by_round: list[tuple[str, list[np.ndarray]]] = []
    for coalition in coalitions:
        run_model, round_models = coalition_models(
            initial, rounds, coalition, with_rounds=with_rounds
        )
        keys.append(f"0|{coalition_key(coalition)}")
        models.append(run_model)
        by_round += [
            (f"{t}|{coalition_key(coalition)}", m) for t, m in enumerate(round_models, start=1)
        ]
    by_round.sort(key=lambda km: int(km[0].split("|", 1)[0]))  # round by round, as before
    keys += [k for k, _ in by_round]
    models += [m for _, m in by_round]
    cfg = ConfigRecord({**dict(config.items()), "coalition-keys": keys})
    stacked = ArrayRecord(stack_models(models))
    msgs = [
        Message(
            RecordDict({"models": stacked, "config": cfg}),
            dst_node_id=n,
            message_type=f"{MessageType.EVALUATE}.coalitions",
        )
        for n in active.values()
    ]
    result = exchange(grid, msgs, timeout=timeout, poll=poll)
    node_site = {n: s for s, n in active.items()}
    if not result.replies:
        errors = {node_site[n]: e for n, e in result.errors.items()}
        raise JobFailed(f"no site scored the coalition models: {errors or 'timed out'}")
    total = np.zeros(len(keys))
    examples: dict[str, int] = {}
    sites: dict[str, dict] = {}
    for node, reply in result.replies.items():
        site = node_site[node]
        m = reply.content["metrics"]
        n = int(m["num-examples"])
        acc = np.asarray(m["coalition-accuracy"], dtype=np.float64)
        if acc.shape != total.shape:
            raise JobFailed(f"site {site!r} scored {acc.size} of {len(keys)} coalition models")
        total += n * acc
        examples[site] = n
        sites[site] = {
            "examples": n,  # held-out rows, scored once per model in one pass
            "cpu_seconds": float(m["cpu-seconds"]),
            "wall_seconds": float(m["wall-seconds"]),
            "bytes_received": int(m["bytes-received"]),
            "bytes_sent": int(m["bytes-sent"]),
        }
    weight = sum(examples.values())
    if weight == 0:
        raise JobFailed("no held-out examples at any site to score coalition models")
    utilities: dict[str, dict[str, float]] = {}
    for key, value in zip(keys, total / weight, strict=True):
        rnd, members = key.split("|")
        utilities.setdefault(rnd, {})[members] = float(value)
    errors = {node_site[n]: e for n, e in result.errors.items()}
    errors.update({node_site[n]: f"no reply within {timeout:.0f} s" for n in result.timed_out})
    return {
        "players": players,
        "method": method,
        "permutations": permutations,
        "seed": seed,
        "utility": "example-weighted held-out accuracy",
        "utilities": utilities,
        "examples": examples,
        "models": len(keys),
        "sites": sites,
        "errors": errors,
        "wall_seconds": time.monotonic() - t0,
    }


def run_job(grid: Grid, context: Context, reporter: Reporter) -> None:
    """Discovery, FedAvg rounds and reporting for one job (see the module docstring)."""
    cfg = context.run_config
    spec = JobSpec.from_json(str(cfg["job-spec"]))
    poll = float(cfg["poll-interval"])
    round_timeout = float(cfg["round-timeout"])
    num_rounds = int(cfg["num-rounds"])

    site_node, site_reply, site_error = discover(
        grid, spec, timeout=float(cfg["discovery-timeout"]), poll=poll
    )
    missing = sorted(set(spec.sites) - set(site_node))
    active = {s: n for s, n in site_node.items() if s not in site_error}
    reporter.post(
        "started",
        {
            "nodes": {s: str(n) for s, n in site_node.items()},
            "missing": missing,
            "errors": site_error,
        },
    )
    if len(active) < spec.min_sites:
        problems = [f"{s}: not connected" for s in missing] + [
            f"{s}: {e}" for s, e in sorted(site_error.items())
        ]
        raise JobFailed(
            f"only {len(active)} of {len(spec.sites)} sites ready (need {spec.min_sites}); "
            + "; ".join(problems)
        )

    # Federated standardisation and the global class list.
    stats = [site_reply[s].content["stats"] for s in active]
    mean, std = combine_sums(
        [(int(m["num-examples"]), np.asarray(m["mean"]), np.asarray(m["m2"])) for m in stats]
    )
    classes = sort_classes({c for s in active for c in site_reply[s].content["info"]["labels"]})
    if len(classes) < 2:
        raise JobFailed(f"the target has {len(classes)} class(es) across all sites; need 2 or more")
    arrays = ArrayRecord(init_params(len(mean), len(classes)))
    config = ConfigRecord(
        {"feature-mean": mean.tolist(), "feature-std": std.tolist(), "classes": classes}
    )
    strategy = FedAvg(min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1)
    node_site = {n: s for s, n in active.items()}
    players = sorted(active)  # contribution players: index = position
    player_of = {s: i for i, s in enumerate(players)}
    initial = _arrays(arrays)
    history: list[RoundLog] = []

    last_eval: dict[str, dict] = {}
    aggregate_eval: dict[str, float] = {}
    for rnd in range(1, num_rounds + 1):
        t0 = time.monotonic()
        config["server-round"] = rnd
        sites_out: dict[str, dict] = {s: {"node_id": str(n)} for s, n in active.items()}

        fan = dict(
            grid=grid,
            active=active,
            node_site=node_site,
            config=config,
            timeout=round_timeout,
            poll=poll,
            sites_out=sites_out,
        )
        train = fan_out(MessageType.TRAIN, arrays, **fan)
        for node, reply in train.replies.items():
            m = _site_metrics(reply)
            sites_out[node_site[node]].update(
                ok=True,
                train_examples=int(m["num-examples"]),
                train_loss=m["train-loss"],
                cpu_seconds=m["cpu-seconds"],
                wall_seconds=m["wall-seconds"],
                bytes_received=int(m["bytes-received"]),
                bytes_sent=int(m["bytes-sent"]),
            )
        if len(train.replies) < spec.min_sites:
            reporter.post("round", {"round": rnd, "sites": sites_out, "partial": True})
            raise JobFailed(
                f"round {rnd}: {len(train.replies)} of {len(active)} sites replied "
                f"(need {spec.min_sites})"
            )
        history.append(
            RoundLog(
                start=_arrays(arrays),
                updates={
                    player_of[node_site[n]]: _arrays(r.content["arrays"])
                    for n, r in train.replies.items()
                },
                examples={
                    player_of[node_site[n]]: int(sites_out[node_site[n]]["train_examples"])
                    for n in train.replies
                },
            )
        )
        new_arrays, train_agg = strategy.aggregate_train(rnd, list(train.replies.values()))
        arrays = new_arrays

        evaluation = fan_out(MessageType.EVALUATE, arrays, **fan)
        for node, reply in evaluation.replies.items():
            m = _site_metrics(reply)
            entry = sites_out[node_site[node]]
            entry.update(
                eval_examples=int(m["num-examples"]),
                eval_loss=m["eval-loss"],
                eval_accuracy=m["eval-accuracy"],
                cpu_seconds=entry.get("cpu_seconds", 0.0) + m["cpu-seconds"],
                wall_seconds=entry.get("wall_seconds", 0.0) + m["wall-seconds"],
                bytes_received=entry.get("bytes_received", 0) + int(m["bytes-received"]),
                bytes_sent=entry.get("bytes_sent", 0) + int(m["bytes-sent"]),
            )
            last_eval[node_site[node]] = entry
        eval_agg = strategy.aggregate_evaluate(rnd, list(evaluation.replies.values())) or {}
        aggregate_eval = {
            "eval_loss": float(eval_agg.get("eval-loss", float("nan"))),
            "eval_accuracy": float(eval_agg.get("eval-accuracy", float("nan"))),
            "eval_examples": sum(int(e.get("eval_examples", 0)) for e in sites_out.values()),
        }
        answer = reporter.post(
            "round",
            {
                "round": rnd,
                "train_loss": float((train_agg or {}).get("train-loss", float("nan"))),
                "train_examples": sum(int(e.get("train_examples", 0)) for e in sites_out.values()),
                **aggregate_eval,
                "wall_seconds": time.monotonic() - t0,
                "sites": sites_out,
            },
        )
        # Drop sites that failed this round, and any the portal asks to drop (revoked grants).
        failed = {s for s, e in sites_out.items() if e.get("ok") is False}
        revoked = set(answer.get("drop_sites", [])) & set(active)
        for site in failed | revoked:
            active.pop(site, None)
        if rnd < num_rounds and len(active) < spec.min_sites:
            why = [f"{s}: grant revoked" for s in sorted(revoked)] + [
                f"{s}: {sites_out[s].get('error', 'failed')}" for s in sorted(failed)
            ]
            raise JobFailed(
                f"after round {rnd}, {len(active)} site(s) remain, fewer than the job's minimum "
                f"of {spec.min_sites} ({'; '.join(why)})"
            )

    reporter.post(
        "finished",
        {
            "rounds": num_rounds,
            **aggregate_eval,
            "sites": last_eval,
            "classes": classes,
            "model": [a.tolist() for a in arrays.to_numpy_ndarrays()],
        },
    )
    if not bool(cfg.get("contribution", True)):
        return
    try:
        payload = evaluate_contribution(
            grid=grid,
            players=players,
            initial=initial,
            rounds=history,
            active=active,
            config=config,
            timeout=round_timeout,
            poll=poll,
        )
    except Exception as exc:  # contribution is an add-on: the trained model stands regardless
        log.warning("contribution evaluation failed: %s", exc)
        payload = {"players": players, "error": sanitise(f"{exc}", limit=1000)}
    reporter.post("contribution", payload)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of the ServerApp; a failure is reported to the portal, then re-raised."""
    reporter = Reporter(
        str(context.run_config["callback-url"]), str(context.run_config["callback-token"])
    )
    REPLY_LOG.path = str(context.run_config.get("reply-log", ""))
    try:
        run_job(grid, context, reporter)
    except Exception as exc:
        reporter.post("failed", {"reason": sanitise(f"{exc}", limit=1000)})
        raise
