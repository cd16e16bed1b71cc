"""Fused rounds (issue 12): the train message of round r > 1 carries round r − 1's global model,
which the site evaluates before it trains; one closing evaluate message after the last round
scores the final model and the coalition models (ADR 0032).

``server_app.run_job`` runs over the stand-in SuperLink of ``test_flwr_trust`` (each node answers
with the real ClientApp handlers on its own in-memory split). The expected figures come from an
independent, unfused FedAvg loop written here: the ClientApp's ``train`` and ``evaluate``
handlers called one after the other per round (train, average weighted by examples, evaluate),
as the app did before; contribution utilities from the coalitions' FedAvg deltas replayed here
and scored by each site's ``evaluate`` handler.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import replace

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from frp_flwr import checkpoints, client_app, server_app
from frp_flwr.contract import RunConfig, SiteLimits, released
from frp_flwr.task import SiteDataError
from sandbox.storage import FilesystemStore
from tests.federation.test_flwr_trust import (  # noqa: F401 — its autouse fixtures
    ROWS,
    NodeGrid,
    Portal,
    _cfg,
    _honest,
    in_memory_sites,
    task_identity,
)

SITES = sorted(ROWS)
NODE = {"hospital-a": 101, "hospital-b": 102, "hospital-c": 103}


class CountingGrid(NodeGrid):
    """The stand-in SuperLink, recording every pushed message's type and round; ``kill`` (a
    predicate of a pushed message) ends the process there, as a SIGKILL would."""

    def __init__(self, nodes, run_config, kill=None):
        super().__init__(nodes, run_config)
        self.sent: list[tuple[str, int, int]] = []  # (message type, node, server-round)
        self.kill = kill
        self.configs: list[dict] = []

    def push_messages(self, messages):
        for msg in messages:
            config = dict(msg.content["config"].items()) if "config" in msg.content else {}
            if self.kill and self.kill(msg.metadata.message_type, config):
                raise SystemExit("SIGKILL")
            self.sent.append(
                (msg.metadata.message_type, msg.metadata.dst_node_id, config.get("server-round", 0))
            )
            self.configs.append(config)
        return super().push_messages(messages)

    def count(self, message_type: str) -> int:
        return sum(1 for t, _, _ in self.sent if t == message_type)


def _limits():
    return {s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()}


def _run(cfg: RunConfig, *, portal=None, store=None, nodes=None, kill=None):
    portal = portal or Portal(_limits())
    grid = CountingGrid(nodes or _honest(), cfg.to_flower(), kill=kill)
    server_app.run_job(grid, cfg, portal, store=store)
    return portal, grid


# --- the independent, unfused reference ----------------------------------------------------


def _call(handler, site: str, content: RecordDict, message_type: str, run_config: dict):
    msg = Message(content, dst_node_id=NODE[site], message_type=message_type)
    msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    context = Context(
        run_id=7,
        node_id=NODE[site],
        node_config={"site": site},
        state=RecordDict(),
        run_config=run_config,
    )
    return handler(msg, context)


def _unfused(cfg: RunConfig, base_config: dict, *, drop_after: dict[int, set[str]] | None = None):
    """FedAvg as before issue 12, straight from the ClientApp's handlers: per round every site
    trains from the global model, the weights are averaged by examples, then every site evaluates
    the new global model. ``drop_after``: round → sites that take no part after it. Returns the
    per-round figures, the initial weights and the per-round updates (for the coalitions)."""
    run_config = cfg.to_flower()
    init = [np.asarray(a, dtype=np.float64) for a in base_config["__initial__"].to_numpy_ndarrays()]
    weights, sites, rounds, logs = [a.copy() for a in init], list(SITES), [], []
    for rnd in range(1, cfg.num_rounds + 1):
        config = {k: v for k, v in base_config.items() if not k.startswith("__")}
        config.update({"server-round": rnd, "final": rnd == cfg.num_rounds})
        config.pop("evaluate-incoming", None)
        trained = {}
        for site in sites:
            content = RecordDict({"arrays": ArrayRecord(weights), "config": ConfigRecord(config)})
            reply = _call(client_app.train, site, content, MessageType.TRAIN, run_config)
            trained[site] = (
                [np.asarray(a, np.float64) for a in reply.content["arrays"].to_numpy_ndarrays()],
                int(reply.content["metrics"]["num-examples"]),
                float(reply.content["metrics"]["train-loss"]),
            )
        n = sum(t[1] for t in trained.values())
        # FedAvg weighs by the counts as released (ADR 0036), the train loss too (Flower's
        # metric aggregation uses the same weight)
        w = {s: released(t[1]) for s, t in trained.items()}
        total = sum(w.values())
        start = weights
        weights = [
            sum(t[0][i] * w[s] for s, t in trained.items()) / total for i in range(len(start))
        ]
        logs.append((start, {s: (t[0], w[s]) for s, t in trained.items()}))
        evaluated = {}
        for site in sites:
            content = RecordDict({"arrays": ArrayRecord(weights), "config": ConfigRecord(config)})
            reply = _call(client_app.evaluate, site, content, MessageType.EVALUATE, run_config)
            m = reply.content["metrics"]
            evaluated[site] = (
                int(m["num-examples"]),
                float(m["eval-loss"]),
                float(m["eval-accuracy"]),
            )
        e = sum(v[0] for v in evaluated.values())
        rounds.append(
            {
                "train_loss": sum(t[2] * w[s] for s, t in trained.items()) / total,
                "train_examples": n,
                "eval_examples": e,
                "eval_loss": sum(v[0] * v[1] for v in evaluated.values()) / e,
                "eval_accuracy": sum(v[0] * v[2] for v in evaluated.values()) / e,
                "sites": evaluated,
            }
        )
        sites = [s for s in sites if s not in (drop_after or {}).get(rnd, set())]
    return rounds, init, logs, weights


def _base_config(grid: CountingGrid, cfg: RunConfig) -> dict:
    """The fitted preprocessing and classes the run sent (its inputs, not its results), and the
    initial model the ServerApp starts from (``model_for(...).init_params``, seeded)."""
    from frp_flwr.models import model_for
    from frp_flwr.preprocess import Fitted

    config = next(c for (t, _, _), c in zip(grid.sent, grid.configs, strict=True) if t == "train")
    fitted = Fitted.from_text(str(config["preprocess"]))
    init = model_for(cfg.spec.model).init_params(
        len(fitted.mean), max(1, len(fitted.classes)), seed=cfg.split_seed
    )
    return {**config, "__initial__": ArrayRecord(init)}


def _assert_rounds_match(events, reference, rounds):
    by_round = {e.round: e for e in events if not e.partial}
    assert sorted(by_round) == list(rounds)
    for rnd in rounds:
        event, want = by_round[rnd], reference[rnd - 1]
        assert event.train_loss == pytest.approx(want["train_loss"], rel=1e-9, abs=1e-12)
        assert event.eval_loss == pytest.approx(want["eval_loss"], rel=1e-9, abs=1e-12)
        assert event.eval_accuracy == pytest.approx(want["eval_accuracy"], rel=1e-9, abs=1e-12)
        assert event.train_examples == want["train_examples"]
        assert event.eval_examples == want["eval_examples"]
        for site, (n, loss, acc) in want["sites"].items():
            entry = event.sites[site]
            assert entry.ok and entry.eval_examples == n
            assert entry.eval_loss == pytest.approx(loss, rel=1e-9, abs=1e-12)
            assert entry.eval_accuracy == pytest.approx(acc, rel=1e-9, abs=1e-12)


# --- message count ---------------------------------------------------------------------------


@pytest.mark.parametrize("rounds", [1, 3])
def test_r_rounds_cost_r_train_messages_and_one_closing_evaluate_per_site(rounds):
    cfg = _cfg(rounds=rounds)

    portal, grid = _run(cfg)

    sites = len(ROWS)
    assert grid.count("train") == rounds * sites
    assert grid.count("evaluate") == sites  # the closing evaluation, with the coalition models
    assert grid.count("evaluate.coalitions") == 0
    assert [e.round for e in portal.of("round")] == list(range(1, rounds + 1))  # each once
    assert len(portal.of("finished")) == len(portal.of("contribution")) == 1
    first = [c for (t, _, r), c in zip(grid.sent, grid.configs, strict=True) if t == "train"]
    # round 1 has no incoming model to evaluate; every later train message evaluates one
    assert [bool(c.get("evaluate-incoming")) for c in first] == [False] * sites + [True] * (
        (rounds - 1) * sites
    )


# --- the figures of the unfused flow ---------------------------------------------------------


def test_fused_rounds_report_the_figures_of_the_unfused_flow():
    cfg = _cfg(rounds=3)

    portal, grid = _run(cfg)

    reference, init, logs, final = _unfused(cfg, _base_config(grid, cfg))
    _assert_rounds_match(portal.of("round"), reference, range(1, 4))
    (finished,) = portal.of("finished")
    assert finished.eval_loss == pytest.approx(reference[-1]["eval_loss"], rel=1e-9)
    assert finished.eval_accuracy == pytest.approx(reference[-1]["eval_accuracy"], rel=1e-9)
    for got, want in zip(finished.model, final, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)
    assert set(finished.sites) == set(SITES) and all(s.metrics for s in finished.sites.values())


def test_the_closing_message_scores_the_coalitions_as_the_separate_message_did():
    """Utility(S) = median over the sites of S's whole-run model's held-out accuracy (ADR 0024),
    with S's model replayed here from the reference rounds' updates (Song et al. 2019's MR)."""
    cfg = _cfg(rounds=2)

    portal, grid = _run(cfg)

    base = _base_config(grid, cfg)
    _, init, logs, _ = _unfused(cfg, base)
    (contribution,) = portal.of("contribution")
    assert contribution.players == SITES and contribution.errors == {}
    config = {k: v for k, v in base.items() if not k.startswith("__")}
    config.update({"server-round": 2, "final": False})
    config.pop("evaluate-incoming", None)
    for size in range(len(SITES) + 1):
        for members in itertools.combinations(range(len(SITES)), size):
            weights = [a.copy() for a in init]
            for start, updates in logs:
                chosen = {SITES[i]: updates[SITES[i]] for i in members}
                n = sum(c[1] for c in chosen.values())
                if n:
                    for layer in range(len(weights)):
                        weights[layer] = (
                            weights[layer]
                            + sum((c[0][layer] - start[layer]) * c[1] for c in chosen.values()) / n
                        )
            scores = []
            for site in SITES:
                content = RecordDict(
                    {"arrays": ArrayRecord(weights), "config": ConfigRecord(config)}
                )
                reply = _call(
                    client_app.evaluate, site, content, MessageType.EVALUATE, cfg.to_flower()
                )
                scores.append(float(reply.content["metrics"]["eval-accuracy"]))
            key = ",".join(str(i) for i in members)
            assert contribution.utilities["0"][key] == pytest.approx(
                float(np.median(scores)), abs=1e-12
            ), key
    assert set(contribution.sites) == set(SITES)
    assert all(m.examples > 0 and m.bytes_received > 0 for m in contribution.sites.values())


# --- sites that fail or are dropped ----------------------------------------------------------


def test_a_site_whose_training_fails_keeps_its_evaluation_of_the_round_before(monkeypatch):
    """hospital-c evaluates round 1's model, then its training of round 2 fails: its round 1
    stands (evaluated), its round 2 says why, and it takes no part after (as when the train
    message of round 2 failed before issue 12)."""
    real = client_app._prepared

    def prepared(context, config, part):
        site = context.node_config["site"]
        if part == "train" and site == "hospital-c" and int(config["server-round"]) == 2:
            raise SiteDataError("the site's disk is full")
        return real(context, config, part)

    monkeypatch.setattr(client_app, "_prepared", prepared)
    cfg = _cfg(rounds=3)

    portal, grid = _run(cfg)

    r1, r2, r3 = portal.of("round")
    assert r1.sites["hospital-c"].ok and r1.sites["hospital-c"].eval_examples > 0
    assert not r2.sites["hospital-c"].ok
    assert r2.sites["hospital-c"].error == "The site's disk is full."
    assert "hospital-c" not in r3.sites
    assert portal.of("finished") and not portal.of("failed")
    monkeypatch.setattr(client_app, "_prepared", real)
    reference, *_ = _unfused(cfg, _base_config(grid, cfg), drop_after={1: {"hospital-c"}})
    _assert_rounds_match([r1], reference, [1])


class RevokingPortal(Portal):
    """Answers round ``after``'s event with ``drop`` (a grant revoked meanwhile)."""

    def __init__(self, limits, drop: str, after: int):
        super().__init__(limits)
        self.drop, self.after = drop, after

    def post(self, event):
        answer = super().post(event)
        if event.name == "round" and event.round == self.after:
            return replace(answer, drop_sites=[self.drop])
        return answer


def test_a_site_the_portal_drops_after_round_1_takes_no_part_in_round_2():
    """The answer to round 1's event arrives after round 2's train replies: the dropped site's
    round 2 update is discarded, so round 2's model is the one the other two sites make."""
    cfg = _cfg(rounds=3)
    portal = RevokingPortal(_limits(), "hospital-b", after=1)

    portal, grid = _run(cfg, portal=portal)

    rounds = portal.of("round")
    assert "hospital-b" in rounds[0].sites
    assert all("hospital-b" not in e.sites for e in rounds[1:])
    reference, *_ = _unfused(cfg, _base_config(grid, cfg), drop_after={1: {"hospital-b"}})
    _assert_rounds_match(rounds, reference, range(1, 4))
    assert portal.of("contribution")[0].examples.keys() == {"hospital-a", "hospital-c"}


def test_a_nan_in_the_evaluation_of_round_1_fails_the_job_naming_round_1():
    def nan_eval(msg, reply):
        if reply.has_error() or "evaluation" not in reply.content:
            return reply
        reply.content["evaluation"]["eval-loss"] = float("nan")
        return reply

    nodes = _honest()
    nodes[102].tamper = nan_eval

    with pytest.raises(
        server_app.NonFinite,
        match="round 1: site hospital-b returned .*eval loss that is not a finite",
    ):
        _run(_cfg(rounds=3), nodes=nodes)


# --- a kill between two train messages, and resuming -----------------------------------------


def _kill_at(message_type: str, rnd: int):
    return lambda t, config: t == message_type and config.get("server-round") == rnd


@pytest.mark.parametrize(
    ("kill", "saved"),
    [
        (_kill_at("train", 3), 1),  # round 2 trained, its evaluation never came
        (_kill_at("train", 4), 2),  # round 3 trained: round 2 evaluated, posted, checkpointed
        (_kill_at("evaluate", 4), 3),  # the closing evaluation never came
    ],
    ids=["before-train-3", "before-train-4", "before-closing"],
)
def test_a_run_killed_between_two_train_messages_resumes_with_every_round_once(
    tmp_path, kill, saved
):
    cfg = replace(_cfg(rounds=4), job_id=9)
    whole, _ = _run(cfg, store=FilesystemStore(tmp_path / "whole"))
    store = FilesystemStore(tmp_path / "crashed")

    crashed = Portal(_limits())
    with pytest.raises(SystemExit):
        _run(cfg, portal=crashed, store=store, kill=kill)
    assert checkpoints.latest_round(store, 9) == saved
    resumed, grid = _run(replace(cfg, resume_round=saved), store=store)

    posted = [e.round for e in crashed.of("round")] + [e.round for e in resumed.of("round")]
    assert posted == [1, 2, 3, 4]  # every round once, none lost
    assert grid.count("train") == (4 - saved) * len(ROWS)
    first = [c for (t, _, _), c in zip(grid.sent, grid.configs, strict=True) if t == "train"]
    assert not any(c.get("evaluate-incoming") for c in first[: len(ROWS)])
    want = {e.round: e for e in whole.of("round")}
    for e in crashed.of("round") + resumed.of("round"):
        assert e.eval_loss == pytest.approx(want[e.round].eval_loss, abs=1e-12)
        assert e.train_loss == pytest.approx(want[e.round].train_loss, abs=1e-12)
    (a,), (b,) = whole.of("finished"), resumed.of("finished")
    assert a.eval_accuracy == b.eval_accuracy
    (ca,), (cb,) = whole.of("contribution"), resumed.of("contribution")
    for rnd, by_coalition in ca.utilities.items():
        assert by_coalition == pytest.approx(cb.utilities[rnd], abs=1e-12)


def test_a_failed_training_after_its_evaluation_passes_the_clipping_mod_as_it_is():
    """Client-side DP: Flower's ``fixedclipping_mod`` wants one ArrayRecord in the reply; a fused
    reply whose training failed has none, and goes back with its evaluation and reason."""
    from flwr.app import MetricRecord

    from frp_flwr import privacy

    sent = Message(
        RecordDict(
            {
                "arrays": ArrayRecord([np.zeros(3)]),
                "config": ConfigRecord({"clipping_norm": 1.0, "evaluate-incoming": True}),
            }
        ),
        dst_node_id=5,
        message_type="train",
    )

    def handler(msg, ctx):
        return Message(
            RecordDict(
                {
                    "evaluation": MetricRecord({"num-examples": 4, "eval-loss": 0.5}),
                    "train-error": ConfigRecord({"error": "the site's disk is full"}),
                }
            ),
            reply_to=msg,
        )

    reply = privacy.clip_mod(sent, None, handler)

    assert not reply.has_error()
    assert reply.content["train-error"]["error"] == "the site's disk is full"
    assert reply.content["evaluation"]["eval-loss"] == 0.5


class ModelsGrid(CountingGrid):
    """``CountingGrid`` keeping, per destination node, the coalition models and keys of the
    closing evaluate message: what every site receives."""

    def __init__(self, nodes, run_config):
        super().__init__(nodes, run_config)
        self.coalitions: dict[int, tuple[list[str], list]] = {}

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            if "models" in msg.content:
                keys = list(msg.content["config"]["coalition-keys"])
                stacked = msg.content["models"].to_numpy_ndarrays()
                models = [[layer[k] for layer in stacked] for k in range(stacked[0].shape[0])]
                self.coalitions[msg.metadata.dst_node_id] = (keys, models)
        return super().push_messages(messages)


def test_the_coalition_models_a_site_receives_give_only_released_training_counts():
    """The hostile re-test of issue 9 (ADR 0036, amendment): after one FedAvg round the model of
    coalition S is ``w0 + Σ_S n_i (w_i − w0) / Σ_S n_i``, so a site receiving M{a}, M{b} and
    M{a,b} solves ``(M{a,b} − M{b}) / (M{a} − M{b}) = n_a / (n_a + n_b)``. The ratio must be the
    one of the counts as released (96 → 95, 72 → 70 training rows), never of the exact ones."""
    cfg = _cfg(rounds=1)
    portal = Portal(_limits())
    grid = ModelsGrid(_honest(), cfg.to_flower())
    server_app.run_job(grid, cfg, portal)

    (contribution,) = portal.of("contribution")
    players = contribution.players
    train = {s: round(ROWS[s] * 0.8) for s in SITES}  # the split's training rows: 96, 72, 48
    assert grid.coalitions, "no coalition models were sent to the sites"
    for keys, models in grid.coalitions.values():  # what each site received
        model = dict(zip(keys, models, strict=True))
        for a, b in itertools.permutations(range(len(players)), 2):
            # "0|<members>": the whole run's model of the coalition (round 0)
            ab = model["0|" + ",".join(str(i) for i in sorted((a, b)))]
            ma, mb = model[f"0|{a}"], model[f"0|{b}"]
            num = sum(float(np.vdot(x - y, z - y)) for x, y, z in zip(ab, mb, ma, strict=True))
            den = sum(float(np.vdot(z - y, z - y)) for z, y in zip(ma, mb, strict=True))
            n_a, n_b = train[players[a]], train[players[b]]
            assert num / den == pytest.approx(
                released(n_a) / (released(n_a) + released(n_b)), abs=1e-9
            ), (players[a], players[b])
            assert abs(num / den - n_a / (n_a + n_b)) > 1e-4  # the exact ratio is not there


def test_a_label_rare_at_every_site_is_never_sent_and_its_rows_are_left_out(monkeypatch):
    """Hostile re-test of issue 9 (F2): a site's labels held by one row each (an identifier used
    as a label) reached every site in each message's config and the portal in the finished
    event. A label is named only where some site holds more than ``small_count`` (7) rows of it,
    as a feature's categories are; the rows of one rare everywhere are dropped at their site."""
    from tests.federation import test_flwr_trust

    X, y = test_flwr_trust.TABLES["hospital-c"]
    y = y.copy().astype(object)
    y[:3] = ["PATIENT-1000", "PATIENT-1001", "PATIENT-1002"]
    monkeypatch.setitem(test_flwr_trust.TABLES, "hospital-c", (X, y))
    cfg = _cfg(rounds=1)

    portal, grid = _run(cfg)

    sent = json.dumps([{k: str(v) for k, v in c.items()} for c in grid.configs])
    assert "PATIENT" not in sent  # in no config any site received
    (finished,) = portal.of("finished")
    assert finished.classes == ["no", "yes"]
    for event in portal.events:  # nothing the portal received names them
        assert "PATIENT" not in json.dumps(event.to_json()), event.name
    (started,) = portal.of("started")
    c = started.preparation.sites["hospital-c"]
    assert c.dropped_rows == 3 and c.train_rows + c.test_rows == ROWS["hospital-c"] - 3


def test_a_portal_answer_withdrawing_the_contribution_stops_every_coalition_model():
    """The portal answers round 1 with ``contribution`` false (a withdrawal): the run's closing
    message carries no coalition model and no contribution is posted; with the same portal
    answering true, it does (not vacuous). Stand-in SuperLink of test_flwr_fused."""

    class Withdrawing(Portal):
        def __init__(self, limits, withdraw: bool):
            super().__init__(limits)
            self.withdraw = withdraw

        def post(self, event):
            answer = super().post(event)
            if self.withdraw and event.name == "round" and event.round == 1:
                return replace(answer, contribution=False)
            return answer

    for withdraw in (False, True):
        portal = Withdrawing(_limits(), withdraw)
        grid = CountingGrid(_honest(), _cfg(rounds=3).to_flower())
        pushed = []
        push = grid.push_messages

        def spy(messages, push=push, pushed=pushed):
            messages = list(messages)
            pushed.extend(m for m in messages if "models" in m.content)
            return push(messages)

        grid.push_messages = spy
        server_app.run_job(grid, _cfg(rounds=3), portal)
        assert portal.of("finished")
        if withdraw:
            assert not pushed
            (event,) = portal.of("contribution")  # says why, measures nothing
            assert "withdrew it during the run" in event.error and not event.utilities
        else:
            assert pushed and portal.of("contribution")


@pytest.mark.parametrize("lost", ["refused", "unreadable"])
def test_a_lost_answer_turns_the_contribution_off_it_fails_closed(lost):
    """The answer that ended the consent may be the one lost (a timeout after the portal's
    commit, then a retry refused as a replay): an answer that is not ok — refused, or outside
    the contract — turns the contribution off, so no coalition model is sent (hostile re-test)."""
    from frp_flwr.contract import CallbackAnswer

    class Losing(Portal):
        def post(self, event):
            answer = super().post(event)
            if event.name == "round" and event.round == 1:
                if lost == "refused":
                    return CallbackAnswer(ok=False, error="HTTP 409")
                return server_app._answer(b'{"ok": "maybe"}')
            return answer

    portal = Losing(_limits())
    grid = CountingGrid(_honest(), _cfg(rounds=3).to_flower())
    pushed = []
    push = grid.push_messages

    def spy(messages):
        messages = list(messages)
        pushed.extend(m for m in messages if "models" in m.content)
        return push(messages)

    grid.push_messages = spy
    server_app.run_job(grid, _cfg(rounds=3), portal)
    assert portal.of("finished") and not pushed
    (event,) = portal.of("contribution")
    assert "had no answer from the portal" in event.error
