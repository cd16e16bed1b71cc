"""The ServerApp's round loop with gradient-boosted trees (``model.kind == "xgboost"``).

``server_app.run_job`` over the stand-in SuperLink of ``test_flwr_trust`` (each node answers with
the real ClientApp handlers on its own in-memory split): the rounds carry the booster, the
``finished`` event has the federated metrics and no weights, no coalition evaluation is sent, and
the global booster's tree count is rounds × sites × local rounds.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from flwr.serverapp.strategy import FedXgbBagging

from frp_flwr import checkpoints, server_app, trees
from frp_flwr.contract import DesignStats, JobSpec, RunConfig, SiteLimits, released
from sandbox.storage import FilesystemStore
from tests.federation.test_flwr_trust import (  # noqa: F401 — its autouse fixtures
    ROWS,
    Node,
    NodeGrid,
    Portal,
    _cfg,
    _honest,
    _run,
    in_memory_sites,
    task_identity,
)

ROUNDS, LOCAL = 3, 2


def _trees_cfg() -> RunConfig:
    base = _cfg(rounds=ROUNDS)
    spec = JobSpec.from_json(base.job_spec)
    spec = replace(spec, model={"kind": "xgboost", "local_rounds": LOCAL, "max_depth": 2})
    return replace(base, job_spec=JobSpec.from_json(spec.to_text()).to_text())


def test_a_trees_run_bags_every_sites_trees_and_scores_no_coalitions(monkeypatch):
    seen = {}
    real = trees.aggregate

    def spy(bagging, global_model, rnd, replies):
        arrays, metrics = real(bagging, global_model, rnd, replies)
        seen[rnd] = trees.tree_count(trees.booster_bytes(arrays))
        return arrays, metrics

    monkeypatch.setattr(server_app.trees, "aggregate", spy)
    nodes = _honest()

    portal = _run(nodes, cfg=_trees_cfg())

    assert not portal.of("failed"), portal.of("failed")
    assert seen == {r: r * len(ROWS) * LOCAL for r in range(1, ROUNDS + 1)}
    (finished,) = portal.of("finished")
    assert finished.model == [] and finished.metrics.accuracy > 0.8
    assert len(portal.of("round")) == ROUNDS
    assert not portal.of("contribution")  # bagged trees: data volume, at the portal
    assert json.loads(_trees_cfg().job_spec)["model"]["kind"] == "xgboost"


def _stored_run(cfg: RunConfig, store) -> Portal:
    portal = Portal({s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()})
    server_app.run_job(NodeGrid(_honest(), cfg.to_flower()), cfg, portal, store=store)
    return portal


def test_a_trees_run_killed_after_round_2_resumes_with_fedxgbbagging_and_its_booster(
    tmp_path, monkeypatch
):
    """The strategy and the base score are set in ``_make_run``, so a resumed run bags with
    FedXgbBagging on top of the checkpoint's booster: round 3 ends with 3 × sites × local trees
    and the same evaluation as the uninterrupted run."""
    cfg = replace(_trees_cfg(), job_id=11)
    whole = _stored_run(cfg, FilesystemStore(tmp_path / "whole"))

    store = FilesystemStore(tmp_path / "crashed")
    real_close = server_app._close

    def killed_before_the_closing_evaluation(run):
        # fused rounds (ADR 0032): round 2 is checkpointed when round 3's train replies (which
        # evaluate it) are in; round 3 is trained, its evaluation never comes
        raise SystemExit("SIGKILL")  # nothing is posted, as when the process is killed

    monkeypatch.setattr(server_app, "_close", killed_before_the_closing_evaluation)
    with pytest.raises(SystemExit):
        _stored_run(cfg, store)
    assert checkpoints.latest_round(store, 11) == 2
    saved = checkpoints.load(store, 11, 2)
    assert trees.tree_count(saved.weights[0].tobytes()) == 2 * len(ROWS) * LOCAL
    monkeypatch.setattr(server_app, "_close", real_close)

    seen = {}
    real = trees.aggregate

    def spy(bagging, global_model, rnd, replies):
        arrays, metrics = real(bagging, global_model, rnd, replies)
        seen[rnd] = (type(bagging), trees.tree_count(trees.booster_bytes(arrays)))
        return arrays, metrics

    monkeypatch.setattr(server_app.trees, "aggregate", spy)
    resumed = _stored_run(replace(cfg, resume_round=2), store)

    assert not resumed.of("failed"), resumed.of("failed")
    assert [e.round for e in resumed.of("round")] == [3]
    assert seen == {3: (FedXgbBagging, ROUNDS * len(ROWS) * LOCAL)}
    (a,), (b,) = whole.of("finished"), resumed.of("finished")
    assert b.model == [] and a.eval_accuracy == b.eval_accuracy
    assert a.eval_loss == pytest.approx(b.eval_loss, abs=1e-12)
    assert not resumed.of("contribution")


def _recorder(seen: list):
    """A site's wrapper that records every (message, reply) pair and changes nothing."""

    def tamper(msg, reply):
        seen.append((msg.metadata.message_type, msg.content, reply.content))
        return reply

    return tamper


def test_a_trees_run_sends_no_training_statistics_and_a_base_score_of_released_counts():
    """Issue 9, finding 5: what crosses the network (every site's reply, every global booster
    sent to the sites) carries no gains, covers or internal weights, and the binary base score
    every site is sent is the share of the sites' released training labels, not the exact
    pooled share (whose denominator is the pooled rows)."""
    seen: list = []
    nodes = {101 + i: Node(site, tamper=_recorder(seen)) for i, site in enumerate(sorted(ROWS))}

    portal = _run(nodes, cfg=_trees_cfg())

    assert not portal.of("failed"), portal.of("failed")
    labels = [
        DesignStats.from_record(reply["design"]).labels
        for kind, _, reply in seen
        if kind == "query.design"
    ]
    assert len(labels) == len(ROWS)
    yes = sum(released(site.get("yes", 0)) for site in labels)
    total = sum(released(n) for site in labels for n in site.values())
    exact = sum(site.get("yes", 0) for site in labels) / sum(sum(s.values()) for s in labels)
    boosters = []
    for kind, msg, reply in seen:
        if kind == "train":
            assert msg["config"]["xgb-base-score"] == yes / total != exact
            boosters += [trees.booster_bytes(msg["arrays"]), trees.booster_bytes(reply["arrays"])]
    boosters = [raw for raw in boosters if raw]  # round 1's global booster is empty
    assert len(boosters) == (2 * ROUNDS - 1) * len(ROWS)
    for raw in boosters:
        doc = json.loads(raw)
        score = float(doc["learner"]["learner_model_param"]["base_score"].strip("[]"))
        assert score == pytest.approx(yes / total, rel=1e-6)  # XGBoost keeps a float32
        for tree in doc["learner"]["gradient_booster"]["model"]["trees"]:
            assert set(tree["loss_changes"]) == {0.0}
            assert tree["sum_hessian"][0] == tree["left_children"].count(-1)  # leaves
