"""Differential privacy in the Flower App (``frp_flwr.privacy``, ADR 0025): Flower's fixed-clipping
wrappers and ``fixedclipping_mod`` fitted to the ServerApp's own round loop.

Unit checks on Flower's wrappers as this app drives them (clipped norms, noise std = σ·C/n by a
statistical check with a fixed seed, equal weights), then whole runs through ``server_app.run_job``
over the in-memory Grid of ``test_flwr_trust`` (the real ClientApp handlers, the client-side run
through the ClientApp's registered train function, so its mods run).
"""

# ruff: noqa: F811 — the fixtures shared with test_flwr_trust are imported by name
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr import client_app, privacy, server_app  # noqa: E402
from frp_flwr.contract import (  # noqa: E402
    ContractError,
    JobSpec,
    Privacy,
    RunConfig,
    SiteLimits,  # noqa: E402
)
from tests.federation.test_flwr_trust import (  # noqa: E402, F401 — fixtures used by name
    ROWS,
    Node,
    NodeGrid,
    Portal,
    _cfg,
    in_memory_sites,
    task_identity,
)


def _reply(arrays: list[np.ndarray], examples: int) -> Message:
    """A train reply as a site sends it (arrays + metrics), addressed to a fresh message."""
    sent = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=5, message_type="train")
    return Message(
        RecordDict(
            {
                "arrays": ArrayRecord(arrays),
                "metrics": MetricRecord({"num-examples": examples, "train-loss": 0.5}),
            }
        ),
        reply_to=sent,
    )


def _norm(arrays: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(a.astype(float) ** 2) for a in arrays)))


# --- the contract ----------------------------------------------------------------------------


def test_privacy_absent_from_old_specs_means_dp_off():
    spec = JobSpec.from_json(
        '{"sites": {"a": {"store_key": "k", "dataset": "d", "version": 1}}, "target": "y"}'
    )
    assert spec.privacy == Privacy() and not spec.privacy.enabled


@pytest.mark.parametrize(
    "raw, error",
    [
        ({"dp": "local"}, "is not one of"),
        ({"dp": "server", "noise_multiplier": 0.0, "clipping_norm": 1.0}, "noise_multiplier"),
        ({"dp": "client", "noise_multiplier": 1.0, "clipping_norm": 0.0}, "clipping_norm"),
        ({"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1.0}, "delta"),
        ({"dp": "server", "noise_multiplier": -1.0, "clipping_norm": 1.0}, "noise_multiplier"),
        ({"dp": "server", "epsilon": 3}, "unknown field"),
    ],
)
def test_privacy_out_of_range_is_a_contract_error(raw, error):
    with pytest.raises(ContractError, match=error):
        Privacy.from_json(raw)


# --- the wrappers as the loop drives them -----------------------------------------------------


def test_wrap_off_returns_the_strategy_itself():
    strategy = FedAvg()
    assert privacy.wrap(strategy, Privacy()) is strategy


def test_server_side_clips_every_update_to_the_norm_and_weighs_sites_equally():
    # Arrange: σ = 0 isolates the clipping; updates of norm 10, 0.3 and 40 around a start
    rng = np.random.default_rng(3)
    start = [rng.normal(size=(4, 3)), rng.normal(size=3)]
    directions = [[rng.normal(size=(4, 3)), rng.normal(size=3)] for _ in range(3)]
    scales = [10.0, 0.3, 40.0]
    updates = [[d * (s / _norm(ds)) for d in ds] for ds, s in zip(directions, scales, strict=True)]
    replies = [
        _reply([a + u for a, u in zip(start, upd, strict=True)], examples=n)
        for upd, n in zip(updates, (100, 5, 1000), strict=True)
    ]
    strategy = privacy.wrap(
        FedAvg(), Privacy(dp="server", noise_multiplier=1e-12, clipping_norm=1.0)
    )
    assert isinstance(strategy, DifferentialPrivacyServerSideFixedClipping)

    # Act
    replies = privacy.before_aggregate(strategy, replies, ArrayRecord(start))
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: every clipped update has norm ≤ C (the small one untouched), same direction
    clipped = []
    for reply, upd, s in zip(replies, updates, scales, strict=True):
        got = [
            b - a for a, b in zip(start, reply.content["arrays"].to_numpy_ndarrays(), strict=True)
        ]
        assert _norm(got) <= 1.0 + 1e-9
        expected = [u * min(1.0, 1.0 / s) for u in upd]
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
        clipped.append(got)
    # the aggregate is the start plus the unweighted mean of the clipped updates (not by examples)
    mean = [np.mean([c[i] for c in clipped], axis=0) for i in range(2)]
    for agg, a, m in zip(arrays.to_numpy_ndarrays(), start, mean, strict=True):
        np.testing.assert_allclose(agg, a + m, atol=1e-9)
    assert strategy.num_sampled_clients == 3


@pytest.mark.parametrize("mode", ["server", "client"])
def test_noise_std_is_sigma_c_over_n(mode):
    # Arrange: 4 sites return the start unchanged, so the aggregate's change is the noise alone
    sigma, clip, n = 1.3, 0.7, 4
    start = [np.zeros((200, 100)), np.zeros(50)]
    replies = [_reply([a.copy() for a in start], examples=10 * (i + 1)) for i in range(n)]
    strategy = privacy.wrap(FedAvg(), Privacy(dp=mode, noise_multiplier=sigma, clipping_norm=clip))
    np.random.seed(20260101)  # Flower draws its noise from NumPy's global generator

    # Act
    replies = privacy.before_aggregate(strategy, replies, ArrayRecord(start))
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: 20,050 draws; the sample std's relative error is ≈ 1/sqrt(2·20050) = 0.5 %
    noise = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
    expected = sigma * clip / n
    assert abs(noise.std() / expected - 1) < 0.02
    assert abs(noise.mean()) < 4 * expected / np.sqrt(noise.size)


def test_client_side_puts_the_clipping_norm_where_fixedclipping_mod_reads_it():
    strategy = privacy.wrap(FedAvg(), Privacy(dp="client", noise_multiplier=1.0, clipping_norm=0.5))
    assert isinstance(strategy, DifferentialPrivacyClientSideFixedClipping)
    config = ConfigRecord({"server-round": 1})
    privacy.round_config(strategy, config)
    assert config[privacy.KEY_CLIPPING_NORM] == 0.5
    plain = ConfigRecord({})
    privacy.round_config(FedAvg(), plain)
    assert privacy.KEY_CLIPPING_NORM not in plain


def _train_message(arrays, config):
    return Message(
        RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord(config)}),
        dst_node_id=5,
        message_type="train",
    )


def test_clip_mod_clips_with_the_key_and_passes_through_without_it(task_identity):
    start = [np.zeros(4)]
    big = [np.array([3.0, 4.0, 0.0, 0.0])]  # update of norm 5

    def handler(msg, ctx):
        return Message(
            RecordDict({"arrays": ArrayRecord(big), "metrics": MetricRecord({"num-examples": 1})}),
            reply_to=msg,
        )

    clipped = privacy.clip_mod(_train_message(start, {"clipping_norm": 1.0}), None, handler)
    np.testing.assert_allclose(clipped.content["arrays"].to_numpy_ndarrays()[0], [0.6, 0.8, 0, 0])
    plain = privacy.clip_mod(_train_message(start, {}), None, handler)
    np.testing.assert_allclose(plain.content["arrays"].to_numpy_ndarrays()[0], big[0])


# --- whole runs over the in-memory Grid -------------------------------------------------------


class ModNode(Node):
    """A node whose train messages go through the ClientApp's registered function (with its
    mods, as a SuperNode runs it), to record the update each site sends."""

    def __init__(self, site):
        super().__init__(site)
        self.sent_norms: list[float] = []

    def handle(self, msg, run_config):
        if msg.metadata.message_type != "train":
            return super().handle(msg, run_config)
        from flwr.app import Context

        context = Context(
            run_id=7,
            node_id=msg.metadata.dst_node_id,
            node_config=self.node_config,
            state=RecordDict(),
            run_config=run_config,
        )
        start = msg.content["arrays"].to_numpy_ndarrays()
        reply = client_app.app._registered_funcs["train.default"](msg, context)
        sent = reply.content["arrays"].to_numpy_ndarrays()
        self.sent_norms.append(_norm([b - a for a, b in zip(start, sent, strict=True)]))
        return reply


def _dp_cfg(mode: str, clip: float) -> RunConfig:
    cfg = _cfg(rounds=2)
    spec = JobSpec.from_json(cfg.job_spec)
    from dataclasses import replace

    spec = replace(spec, privacy=Privacy(dp=mode, noise_multiplier=0.5, clipping_norm=clip))
    return replace(cfg, job_spec=spec.to_text(), contribution=False)


def _limits():
    return {s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()}


def test_client_side_run_every_site_sends_a_clipped_update():
    nodes = {101: ModNode("hospital-a"), 102: ModNode("hospital-b"), 103: ModNode("hospital-c")}
    cfg = _dp_cfg("client", clip=0.05)
    portal = Portal(_limits())
    server_app.run_job(NodeGrid(nodes, cfg.to_flower()), cfg, portal)
    assert [e.round for e in portal.of("round")] == [1, 2]
    norms = [x for node in nodes.values() for x in node.sent_norms]
    assert len(norms) == 6 and max(norms) <= 0.05 + 1e-9


def test_without_dp_the_same_sites_send_unclipped_updates():
    """The check above can fail: the same training without dp sends larger updates."""
    nodes = {101: ModNode("hospital-a"), 102: ModNode("hospital-b"), 103: ModNode("hospital-c")}
    from dataclasses import replace

    cfg = replace(_cfg(rounds=1), contribution=False)
    server_app.run_job(NodeGrid(nodes, cfg.to_flower()), cfg, Portal(_limits()))
    assert min(x for node in nodes.values() for x in node.sent_norms) > 0.05


def test_server_side_run_completes_with_the_wrapper_in_the_loop(monkeypatch):
    nodes = {101: Node("hospital-a"), 102: Node("hospital-b"), 103: Node("hospital-c")}
    cfg = _dp_cfg("server", clip=0.05)
    seen = []
    real = privacy.before_aggregate

    def spy(strategy, replies, arrays):
        seen.append(type(strategy).__name__)
        return real(strategy, replies, arrays)

    monkeypatch.setattr(privacy, "before_aggregate", spy)
    portal = Portal(_limits())
    server_app.run_job(NodeGrid(nodes, cfg.to_flower()), cfg, portal)
    assert seen == ["DifferentialPrivacyServerSideFixedClipping"] * 2
    assert portal.of("finished")


def test_a_zero_update_is_aggregated_not_a_division_by_zero(task_identity):
    """Flower's clipping divides by the update's norm; a site that returns the model unchanged
    must not fail the round (server side) or the site's reply (client side)."""
    start = [np.ones(3)]
    strategy = privacy.wrap(FedAvg(), Privacy(dp="server", noise_multiplier=1e-9, clipping_norm=1))
    replies = privacy.before_aggregate(strategy, [_reply([np.ones(3)], 1)] * 2, ArrayRecord(start))
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], start[0], atol=1e-6)

    def handler(msg, ctx):
        return Message(
            RecordDict(
                {"arrays": ArrayRecord(start), "metrics": MetricRecord({"num-examples": 1})}
            ),
            reply_to=msg,
        )

    reply = privacy.clip_mod(_train_message(start, {"clipping_norm": 1.0}), None, handler)
    assert not reply.has_error()
    np.testing.assert_allclose(reply.content["arrays"].to_numpy_ndarrays()[0], start[0])
