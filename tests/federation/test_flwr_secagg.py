"""SecAgg+ through Flower's own workflow and mod (``frp_flwr.secagg``), in one process.

The grid here carries messages to real ClientApps (Flower's ``ClientApp`` with ``secagg_mod`` on a
train handler whose update is known), copying each message as the wire would, and keeping each
node's ``Context`` between messages as a SuperNode does. Everything else is Flower's:
``SecAggPlusWorkflow``, ``secaggplus_mod``, the legacy strategy. Correct values by hand: the
weighted mean of the sites' deltas Σ n_i Δ_i / Σ n_i.
"""

from __future__ import annotations

import copy
import json
from uuid import uuid4

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.supercore.task_identity import TaskIdentity

from frp_flwr.contract import ContractError, JobSpec, Privacy, SitePointer, TrainReply
from frp_flwr.secagg import (
    SecAggError,
    SecAggParams,
    fit_config,
    secagg_mod,
    secure_train_round,
)

GLOBAL = [np.array([[0.5, -1.0], [2.0, 0.25]]), np.array([0.1, -0.2])]
# node id → (examples, delta) of each site's "training"
SITES = {
    11: (40, [np.array([[0.3, 0.1], [-0.2, 0.05]]), np.array([0.01, 0.02])]),
    22: (100, [np.array([[-0.1, 0.4], [0.6, -0.3]]), np.array([-0.05, 0.3])]),
    33: (60, [np.array([[0.2, -0.2], [0.1, 0.9]]), np.array([0.4, -0.1])]),
}


@pytest.fixture(autouse=True)
def _task_identity():
    """What Flower's runtime sets in a ServerApp process (messages are stamped with it)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _site_app(node: int, seen: list) -> ClientApp:
    app = ClientApp()

    @app.train(mods=[secagg_mod])
    def train(msg: Message, context: Context) -> Message:
        seen.append((node, msg))
        examples, delta = SITES[node]
        start = msg.content["arrays"].to_numpy_ndarrays()
        local = [g + d for g, d in zip(start, delta, strict=True)]
        metrics = TrainReply(
            num_examples=examples,
            train_loss=0.5,
            bytes_received=10,
            bytes_sent=10,
            cpu_seconds=0.01,
            wall_seconds=0.01,
        )
        return Message(
            RecordDict(
                {"arrays": ArrayRecord(local), "metrics": MetricRecord(metrics.as_record())}
            ),
            reply_to=msg,
        )

    return app


class _WireGrid:
    """A grid delivering each message (a deep copy, as serialised) to its node's ClientApp."""

    def __init__(self, nodes, *, drop_stage: dict[int, str] | None = None):
        self.seen: list = []
        self.apps = {n: _site_app(n, self.seen) for n in nodes}
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(), run_config={})
            for n in nodes
        }
        self.replies: dict[str, Message] = {}
        self.drop_stage = drop_stage or {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            node = msg.metadata.dst_node_id
            wire = copy.deepcopy(msg)
            stage = wire.content.config_records.get(RECORD_KEY_CONFIGS, {}).get(Key.STAGE)
            if self.drop_stage.get(node) != stage:
                self.replies[msg.metadata.message_id] = self.apps[node](wire, self.contexts[node])
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, ids):
        return [copy.deepcopy(self.replies.pop(i)) for i in list(ids) if i in self.replies]


def _expected(nodes) -> list[np.ndarray]:
    total = sum(SITES[n][0] for n in nodes)
    return [
        g + sum(SITES[n][0] * SITES[n][1][k] for n in nodes) / total for k, g in enumerate(GLOBAL)
    ]


def _round(grid, nodes, **kw):
    logged: list = []
    outcome = secure_train_round(
        grid,
        params=SecAggParams(),
        active={f"site-{n}": n for n in nodes},
        arrays=ArrayRecord([a.copy() for a in GLOBAL]),
        fit_config={"server-round": 1, "preprocess": "{}"},
        rnd=1,
        max_examples=kw.pop("max_examples", 200),
        timeout=5.0,
        poll=0.001,
        on_reply=lambda node, reply: logged.append((node, reply)),
        **kw,
    )
    return outcome, logged


def test_secure_round_gives_the_weighted_mean_of_the_sites_deltas():
    grid = _WireGrid(SITES)
    outcome, _ = _round(grid, list(SITES))
    got = outcome.arrays.to_numpy_ndarrays()
    for g, want in zip(got, _expected(list(SITES)), strict=True):
        # quantisation: 2**22 levels over ±8, weights n_i/200 → error well below 1e-4
        np.testing.assert_allclose(g, want, atol=1e-4)
    assert {n: m.num_examples for n, m in outcome.replies.items()} == {
        n: e for n, (e, _) in SITES.items()
    }
    assert outcome.errors == {}


class _SetupGrid(_WireGrid):
    """``_WireGrid`` keeping the ``max_weight`` each site receives at the setup stage."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.max_weight: dict[int, float] = {}

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            configs = msg.content.config_records.get(RECORD_KEY_CONFIGS, {})
            if Key.MAX_WEIGHT in configs:
                self.max_weight[msg.metadata.dst_node_id] = float(configs[Key.MAX_WEIGHT])
        return super().push_messages(messages)


def test_sites_weigh_by_released_counts_and_receive_only_the_largest_released(monkeypatch):
    """What every site receives (ADR 0036, amendment): the new global model w + Σ r_i Δ_i / Σ r_i
    weighted by the released counts r_i (43 → 45, 98 → 100, 6 → 4), and Flower's ``max_weight``
    as the released count of the largest site's rows (198 → 200), never the exact 198."""
    exact = {11: 43, 22: 98, 33: 6}
    for node, rows in exact.items():
        monkeypatch.setitem(SITES, node, (rows, SITES[node][1]))
    grid = _SetupGrid(SITES)
    outcome, _ = _round(grid, list(SITES), max_examples=198)
    assert outcome.errors == {}
    assert set(grid.max_weight) == set(SITES) and set(grid.max_weight.values()) == {200.0}
    weights = {11: 45, 22: 100, 33: 4}
    total = sum(weights.values())
    want = [
        g + sum(weights[n] * SITES[n][1][k] for n in SITES) / total for k, g in enumerate(GLOBAL)
    ]
    got = outcome.arrays.to_numpy_ndarrays()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)
    gap = max(float(np.abs(w - e).max()) for w, e in zip(want, _expected(list(SITES)), strict=True))
    assert gap > 1e-3  # the exact-count mean is measurably elsewhere
    assert {n: m.num_examples for n, m in outcome.replies.items()} == exact  # the portal's


def test_the_server_receives_only_masked_vectors_and_clear_metrics():
    grid = _WireGrid(SITES)
    _, logged = _round(grid, list(SITES))
    collect = [
        (n, r)
        for n, r in logged
        if "fitres.metrics" in r.content.config_records  # the collect stage's replies
    ]
    assert sorted(n for n, _ in collect) == sorted(SITES)
    for node, reply in collect:
        for record in reply.content.array_records.values():
            assert len(record) == 0  # secaggplus_mod cleared the plain parameters
        masked = [
            bytes_to_ndarray(b)
            for b in reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        ]
        delta = SITES[node][1]
        flat = np.concatenate([np.ravel(a) for a in masked]).astype(np.float64)
        # factor + masked layers, each entry in [0, 2**32): far from any delta (|Δ| < 1) and
        # far from its quantised form (≈ 2**21 ± …) as a whole
        assert len(masked) == len(delta) + 1
        for other in SITES.values():
            want = np.concatenate([np.ravel(a) for a in other[1]])
            assert not np.allclose(flat[-want.size :], want, atol=1e-2)
        assert flat.max() > 2**23  # masks spread over the modulus, unlike a quantised update
        metrics = TrainReply.from_record(reply.content.config_records["fitres.metrics"])
        assert metrics.num_examples == SITES[node][0]


def test_a_site_out_of_bounds_is_withheld_and_its_update_is_not_in_the_sum():
    grid = _WireGrid(SITES)
    outcome, _ = _round(
        grid,
        list(SITES),
        check=lambda node, m, elapsed: "too many examples" if node == 22 else "",
    )
    got = outcome.arrays.to_numpy_ndarrays()
    for g, want in zip(got, _expected([11, 33]), strict=True):
        np.testing.assert_allclose(g, want, atol=1e-4)
    assert outcome.errors == {22: "too many examples"}
    assert sorted(outcome.replies) == [11, 33]


def test_a_site_silent_at_the_collect_stage_is_a_dropout_the_others_survive():
    grid = _WireGrid(SITES, drop_stage={33: Stage.COLLECT_MASKED_VECTORS})
    outcome, _ = _round(grid, list(SITES))
    got = outcome.arrays.to_numpy_ndarrays()
    for g, want in zip(got, _expected([11, 22]), strict=True):
        np.testing.assert_allclose(g, want, atol=1e-4)
    assert "no reply" in outcome.errors[33]


def test_too_few_sites_halt_the_round():
    grid = _WireGrid(SITES, drop_stage={22: Stage.SETUP, 33: Stage.SETUP})
    with pytest.raises(SecAggError, match="halted"):
        _round(grid, list(SITES))


def test_a_plain_train_message_passes_through_the_mod():
    seen: list = []
    app = _site_app(11, seen)
    msg = Message(
        RecordDict({"arrays": ArrayRecord(GLOBAL), "config": ConfigRecord({"server-round": 1})}),
        dst_node_id=11,
        message_type=MessageType.TRAIN,
    )
    msg.metadata.__dict__["_message_id"] = "m1"
    reply = app(
        msg, Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={})
    )
    got = reply.content["arrays"].to_numpy_ndarrays()
    np.testing.assert_allclose(got[1], GLOBAL[1] + SITES[11][1][1])


def test_fit_config_turns_lists_into_json_text():
    cfg = fit_config(ConfigRecord({"classes": ["a", "b"], "server-round": 3, "final": True}))
    assert cfg == {"classes": json.dumps(["a", "b"]), "server-round": 3, "final": True}


def _spec(privacy, n=3) -> str:
    spec = JobSpec(
        sites={f"s{i}": SitePointer("k", "d", 1) for i in range(n)}, target="y", privacy=privacy
    )
    return spec.to_text()


def test_job_spec_privacy_defaults_off_for_old_specs():
    old = json.dumps(
        {"sites": {"s0": {"store_key": "k", "dataset": "d", "version": 1}}, "target": "y"}
    )
    spec = JobSpec.from_json(old)
    assert spec.privacy == Privacy() and SecAggParams.of(spec) is None


def test_job_spec_privacy_secagg_round_trips_with_its_settings():
    spec = JobSpec.from_json(
        _spec({"secagg": True, "secagg_num_shares": 3, "secagg_threshold": 2}, n=4)
    )
    assert SecAggParams.of(spec) == SecAggParams(num_shares=3, threshold=2)


@pytest.mark.parametrize(
    ("privacy", "n", "match"),
    [
        ({"secagg": "yes"}, 3, "secagg"),
        ({"secagg": True, "secagg_num_shares": 2}, 3, "num_shares"),
        ({"secagg": True, "secagg_num_shares": 5}, 3, "num_shares"),
        ({"secagg": True, "secagg_threshold": 3}, 3, "threshold"),
        ({"secagg": True, "secagg_threshold": 1}, 3, "threshold"),
        ({"secagg": True}, 1, "2 or more sites"),
        ({"secagg_num_shares": 3}, 3, "without secagg"),
        ({"secag": True}, 3, "unknown field"),
    ],
)
def test_job_spec_refuses_secagg_settings_that_do_not_fit(privacy, n, match):
    with pytest.raises(ContractError, match=match):
        JobSpec.from_json(_spec(privacy, n=n))
