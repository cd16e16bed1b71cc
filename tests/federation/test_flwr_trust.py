"""A site's replies are trusted only as far as it could not lie (hostile re-test of issue 9, 1a–1c).

``server_app.run_job`` runs over a Grid that stands in for the SuperLink: each node answers with
the **real ClientApp handlers** (``frp_flwr.client_app``) on its own in-memory split (the sandbox
loader is replaced by a table per site, split by the real ``preprocess.site_frame``). A hostile
node wraps the handlers' replies the way the hostile tester's ``sitecustomize.py`` did (inflated
example counts and seconds, self-serving coalition accuracies) or claims another site's name.
The portal is a recorder that parses every event with the contract, as the real Reporter does,
and answers with each site's limits (rows registered at ingest, allocated cores).
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr import client_app, preprocess, server_app, task  # noqa: E402
from frp_flwr.contract import (  # noqa: E402
    CallbackAnswer,
    JobSpec,
    RunConfig,
    SiteLimits,
    SitePointer,
    encode_event,
    json_record,
)

ROWS = {"hospital-a": 120, "hospital-b": 90, "hospital-c": 60}


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """What a ServerApp/ClientApp process has set when it builds messages."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 7), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


def _tables() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each site's rows: 3 features, 2 classes, the same linear rule everywhere."""
    rng = np.random.default_rng(11)
    w = rng.normal(size=3)
    out = {}
    for site, n in ROWS.items():
        X = rng.normal(size=(n, 3))
        out[site] = (X, np.where(X @ w > 0, "yes", "no"))
    return out


TABLES = _tables()


@pytest.fixture(autouse=True)
def in_memory_sites(monkeypatch):
    """The ClientApp's loader reads the site's table from memory and splits it for real."""

    def load(node_config, spec, *, test_fraction, seed):
        site = str(node_config["site"])
        if site not in spec.sites:
            raise task.SiteDataError(f"site {site!r} is not part of this job")
        if node_config.get("broken"):
            raise task.SiteDataError(f"site {site!r}: KeyringError: no key for this site")
        X, y = TABLES[site]
        columns = {"label": y, **{f"f{j}": X[:, j] for j in range(X.shape[1])}}
        spec = replace(spec, features=spec.features or ["f0", "f1", "f2"])
        return preprocess.site_frame(columns, spec, test_fraction=test_fraction, seed=seed)

    monkeypatch.setattr(client_app, "load_site_frame", load)


HANDLERS = {
    "query": client_app.query,
    "query.quantiles": client_app.query_quantiles,
    "query.design": client_app.query_design,
    "train": client_app.train,
    "evaluate": client_app.evaluate,
    "evaluate.coalitions": client_app.evaluate_coalitions,
}


class Node:
    """A SuperNode: its operator's node config, and what it does to the ClientApp's replies."""

    def __init__(self, site: str, tamper=None, **node_config):
        self.node_config = {"site": site, **node_config}
        self.tamper = tamper
        self.coalition_accuracy: list[float] | None = None  # what it replied, for the checks

    def handle(self, msg: Message, run_config: dict) -> Message:
        context = Context(
            run_id=7,
            node_id=msg.metadata.dst_node_id,
            node_config=self.node_config,
            state=RecordDict(),
            run_config=run_config,
        )
        try:
            reply = HANDLERS[msg.metadata.message_type](msg, context)
        except Exception as exc:  # noqa: BLE001 — Flower sends the text as the reply's error
            return Message(Error(code=0, reason=str(exc)), reply_to=msg)
        if self.tamper:
            reply = self.tamper(msg, reply)
        if msg.metadata.message_type == "evaluate.coalitions" and not reply.has_error():
            self.coalition_accuracy = list(reply.content["metrics"]["coalition-accuracy"])
        if not reply.has_error() and "coalitions" in reply.content:
            # a fused run's closing evaluate message scores them too (ADR 0032)
            self.coalition_accuracy = list(reply.content["coalitions"]["coalition-accuracy"])
        return reply


class NodeGrid:
    """The SuperLink: pushes record messages, pulls answer each with the node it was sent to."""

    def __init__(self, nodes: dict[int, Node], run_config: dict):
        self.nodes, self.run_config = nodes, run_config
        self.pushed: dict[str, Message] = {}

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.pushed[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, ids):
        out = []
        for mid in ids:
            msg = self.pushed.pop(mid, None)
            if msg is not None:
                out.append(self.nodes[msg.metadata.dst_node_id].handle(msg, self.run_config))
        return out


class Portal:
    """Records each event after the contract's own encoding (as ``Reporter.post`` does)."""

    def __init__(self, limits: dict[str, SiteLimits]):
        self.limits = limits
        self.events = []

    def post(self, event):
        encode_event(event, seq=len(self.events) + 1)  # raises ContractError as the real one
        self.events.append(event)
        return CallbackAnswer(limits=self.limits)

    def of(self, name: str):
        return [e for e in self.events if e.name == name]


def _cfg(sites=("hospital-a", "hospital-b", "hospital-c"), rounds: int = 2) -> RunConfig:
    spec = JobSpec(
        sites={s: SitePointer(store_key=f"{s}/v1", dataset=f"{s}-data", version=1) for s in sites},
        target="label",
        features=["f0", "f1", "f2"],
        min_sites=2,
    )
    return RunConfig(
        job_spec=spec.to_text(),
        num_rounds=rounds,
        local_epochs=2,
        round_timeout=30.0,
        discovery_timeout=5.0,
        poll_interval=0.001,
    )


def _run(nodes: dict[int, Node], *, limits=None, cfg=None) -> Portal:
    cfg = cfg or _cfg()
    portal = Portal(
        {s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()} if limits is None else limits
    )
    server_app.run_job(NodeGrid(nodes, cfg.to_flower()), cfg, portal)
    return portal


def _honest() -> dict[int, Node]:
    return {101: Node("hospital-a"), 102: Node("hospital-b"), 103: Node("hospital-c")}


def _metrics_tamper(record: str = "metrics", **changes):
    """A hostile site's wrapper: the named values of ``record`` replaced in every reply."""

    def tamper(msg, reply):
        if reply.has_error() or record not in reply.content:
            return reply
        metrics = dict(reply.content[record].items())
        for key, value in changes.items():
            if key in metrics:
                metrics[key] = value
        content = RecordDict({k: v for k, v in reply.content.items() if k != record})
        content[record] = MetricRecord(metrics)
        return Message(content=content, reply_to=msg)

    return tamper


# --- 1a: counts and seconds a site could not have --------------------------------------------


def test_an_honest_run_counts_each_sites_own_split():
    portal = _run(_honest())

    (last,) = [e for e in portal.of("round") if e.round == 2]
    for site, n in ROWS.items():
        _, test = preprocess.stratified_split(TABLES[site][1], test_fraction=0.2, seed=42)
        assert last.sites[site].ok
        assert last.sites[site].train_examples == n - len(test)
        assert last.sites[site].eval_examples == len(test)
    assert portal.of("contribution")[0].players == sorted(ROWS)


def test_a_site_inflating_its_examples_and_seconds_is_refused_and_the_others_go_on():
    """Variant 1a: hospital-c replied num_examples = 10**15 and 4e8 CPU/wall seconds in every
    reply; FedAvg, the chart, usage and the coalition utilities took them as true."""
    nodes = _honest()
    nodes[103].tamper = _metrics_tamper(
        **{"num-examples": 10**15, "cpu-seconds": 4e8, "wall-seconds": 4e8}
    )

    portal = _run(nodes)

    first = portal.of("round")[0]
    entry = first.sites["hospital-c"]
    assert not entry.ok
    # counts as the profile shows them: the reason reaches the job page (ADR 0036)
    assert "faulty train reply, refused: reported ≈1000000000000000 train examples" in entry.error
    assert "registered for this site has ≈60 rows" in entry.error
    for event in portal.of("round"):
        assert event.train_examples < 10**6
        assert all(s.cpu_seconds < 1e3 and s.train_examples < 10**6 for s in event.sites.values())
    assert "hospital-c" not in portal.of("round")[-1].sites  # dropped after round 1
    contribution = portal.of("contribution")[0]
    assert contribution.examples.keys() == {"hospital-a", "hospital-b"}  # c evaluated nothing
    assert max(contribution.examples.values()) < 100
    c = contribution.players.index("hospital-c")  # a player with no accepted update:
    whole = contribution.utilities["0"]
    assert whole[str(c)] == whole[""]  # its coalition model is the initial one
    assert portal.of("finished")


def _summary_tamper(**changes):
    """A hostile site's wrapper: fields of its discovery ``summary`` replaced."""

    def tamper(msg, reply):
        if reply.has_error() or "summary" not in reply.content:
            return reply
        body = json.loads(str(reply.content["summary"]["json"]))
        body.update(changes)
        content = RecordDict({k: v for k, v in reply.content.items() if k != "summary"})
        content["summary"] = ConfigRecord(json_record(body))
        return Message(content=content, reply_to=msg)

    return tamper


def test_a_site_claiming_more_rows_at_discovery_is_refused():
    """The discovery summary's row count (the preprocessing's weights) is bounded too."""
    nodes = _honest()
    nodes[102].tamper = _summary_tamper(rows=10**12)

    portal = _run(nodes)

    entry = portal.of("round")[0].sites["hospital-b"]
    assert not entry.ok and "faulty discovery reply, refused" in entry.error
    assert portal.of("contribution")[0].players == ["hospital-a", "hospital-c"]


def test_a_refused_sites_aggregates_do_not_shape_the_preprocessing():
    """The refused site is left out of the preprocessing too: ``started`` is posted again with
    the sites left, and its preparation covers only them."""
    nodes = _honest()
    nodes[102].tamper = _summary_tamper(rows=10**12)

    portal = _run(nodes)

    first, second = portal.of("started")
    assert set(first.preparation.sites) == set(ROWS)
    assert set(second.nodes) == set(second.preparation.sites) == {"hospital-a", "hospital-c"}


class RefusingPortal(Portal):
    """A portal whose answer to ``started`` drops ``refuse`` (an impostor node, or a revoked
    grant, as ``federation.services.job_callback_record`` answers)."""

    def __init__(self, limits, refuse: list[str]):
        super().__init__(limits)
        self.refuse = refuse

    def post(self, event):
        answer = super().post(event)
        if event.name == "started":
            return replace(answer, drop_sites=[s for s in self.refuse if s in event.nodes])
        return answer


def test_the_sites_the_portal_drops_at_discovery_take_no_part():
    """Issue 9: the portal holds each found node against the site's registered SuperNode; the
    ServerApp drops the sites it refuses before any round and fits the preprocessing without
    them."""
    cfg = _cfg()
    portal = RefusingPortal(
        {s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()}, ["hospital-b"]
    )
    server_app.run_job(NodeGrid(_honest(), cfg.to_flower()), cfg, portal)

    assert set(portal.of("started")[-1].preparation.sites) == {"hospital-a", "hospital-c"}
    entry = portal.of("round")[0].sites["hospital-b"]
    assert not entry.ok and "refused by the portal at discovery" in entry.error
    for event in portal.of("round")[1:]:
        assert "hospital-b" not in event.sites
    assert portal.of("contribution")[0].players == ["hospital-a", "hospital-c"]


def test_too_few_sites_left_after_the_portal_refuses_fails_the_job():
    cfg = _cfg()
    portal = RefusingPortal(
        {s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()}, ["hospital-b", "hospital-c"]
    )
    with pytest.raises(server_app.JobFailed, match="Only 1 sites could take part"):
        server_app.run_job(NodeGrid(_honest(), cfg.to_flower()), cfg, portal)
    assert not portal.of("round")


def test_coalition_utilities_are_the_median_of_the_evaluating_sites():
    """Variant 1a (contribution): hospital-c scored coalitions with itself 1.0 and without it
    0.0 and got a Shapley share of 1.0. Its scores cannot be verified; the median of three sites
    stays between the two honest sites' own scores, and its disagreement is flagged."""
    nodes = _honest()
    players = sorted(ROWS)
    c = players.index("hospital-c")

    def self_serving(msg, reply):
        keys = list(msg.content["config"]["coalition-keys"])
        forged = [1.0 if str(c) in key.split("|", 1)[1].split(",") else 0.0 for key in keys]
        return _metrics_tamper("metrics", **{"coalition-accuracy": forged})(msg, reply)

    def tamper(msg, reply):
        if msg.metadata.message_type == "evaluate.coalitions":
            return self_serving(msg, reply)
        if "models" in msg.content:  # a fused run's closing message (ADR 0032)
            keys = list(msg.content["config"]["coalition-keys"])
            forged = [1.0 if str(c) in key.split("|", 1)[1].split(",") else 0.0 for key in keys]
            return _metrics_tamper("coalitions", **{"coalition-accuracy": forged})(msg, reply)
        return reply

    nodes[103].tamper = tamper

    portal = _run(nodes)

    event = portal.of("contribution")[0]
    keys = [k for k in _keys(event)]
    honest = np.array([nodes[101].coalition_accuracy, nodes[102].coalition_accuracy])
    for i, (rnd, members) in enumerate(keys):
        u = event.utilities[rnd][members]
        assert honest[:, i].min() - 1e-12 <= u <= honest[:, i].max() + 1e-12, (rnd, members)
    assert event.utility == "median over the evaluating sites of held-out accuracy"
    assert event.disagreement["hospital-c"] > 3 * max(
        event.disagreement["hospital-a"], event.disagreement["hospital-b"]
    )


def _keys(event):
    """The (round, coalition) keys in the order the ServerApp sent the models."""
    order = []
    for rnd in sorted(event.utilities, key=int):
        order += [(rnd, k) for k in event.utilities[rnd]]
    # the ServerApp sends the whole run ("0") first, then round by round, coalitions in its plan
    # order, which is the insertion order of each round's table
    return order


# --- 1b: a node claiming another site's name --------------------------------------------------


def test_an_error_naming_a_site_does_not_knock_that_site_out():
    """Variant 1b: a rogue node with --node-config site=hospital-b that fails with an error
    naming "site 'hospital-b'" marked the real hospital-b failed (text matching)."""
    nodes = _honest()
    nodes[999] = Node("hospital-c-rogue")

    def raise_as_b(msg, reply):
        return Message(
            Error(code=0, reason="site 'hospital-b': KeyringError: no key for this site"),
            reply_to=msg,
        )

    nodes[999].tamper = raise_as_b

    portal = _run(nodes)

    started = portal.of("started")[0]
    assert started.nodes["hospital-b"] == "102" and started.errors == {}
    assert portal.of("round")[-1].sites["hospital-b"].ok


@pytest.mark.parametrize("rogue_broken", [False, True], ids=["answers", "says-it-is-broken"])
def test_two_nodes_claiming_one_site_leave_it_out_visibly_and_the_others_run(rogue_broken):
    """A second node claiming hospital-b (answering with hospital-c's data, or saying its data
    cannot be opened) failed the whole run ("two nodes claim site") or knocked b out silently.
    Now b is left out with a reason naming both nodes, whatever order the replies come in, and
    the job runs on the other two sites."""
    for order in ([102, 998], [998, 102]):
        nodes = {101: Node("hospital-a"), 103: Node("hospital-c")}
        for n in order:
            nodes[n] = (
                Node("hospital-b")
                if n == 102
                else Node("hospital-b", broken=True)
                if rogue_broken
                else Node("hospital-b")
            )

        portal = _run(nodes)

        started = portal.of("started")[0]
        assert "hospital-b" not in started.nodes
        assert started.errors["hospital-b"].startswith("nodes 102, 998 all claim site 'hospital-b'")
        assert portal.of("contribution")[0].players == ["hospital-a", "hospital-c"]


# --- 1c: values that fit alone but not summed -------------------------------------------------


def test_replies_that_fit_alone_but_overflow_the_sum_drop_only_that_site():
    """Variant 1c: train and evaluate replies each with cpu_seconds = 1e9 − 1 (each within the
    contract) summed past its limit in the ServerApp's own check, and the run failed for all
    three sites. Without limits from the portal (none answered), the site is dropped as faulty."""
    nodes = _honest()
    train_metrics = _metrics_tamper(**{"cpu-seconds": 1e9 - 1})
    evaluation = _metrics_tamper("evaluation", **{"cpu-seconds": 1e9 - 1})  # fused (ADR 0032)
    nodes[103].tamper = lambda msg, reply: evaluation(msg, train_metrics(msg, reply))

    portal = _run(nodes, limits={})

    entry = portal.of("round")[0].sites["hospital-c"]
    assert not entry.ok and "faulty replies, refused: sites.hospital-c.cpu_seconds" in entry.error
    assert entry.cpu_seconds == 0.0
    assert portal.of("finished") and not portal.of("failed")
    assert portal.of("round")[-1].sites.keys() == {"hospital-a", "hospital-b"}
