"""The ServerApp's round loop with gradient-boosted trees (``model.kind == "xgboost"``).

``server_app.run_job`` over the stand-in SuperLink of ``test_flwr_trust`` (each node answers with
the real ClientApp handlers on its own in-memory split): the rounds carry the booster, the
``finished`` event has the federated metrics and no weights, no coalition evaluation is sent, and
the global booster's tree count is rounds × sites × local rounds.
"""

from __future__ import annotations

import json
from dataclasses import replace

from frp_flwr import server_app, trees
from frp_flwr.contract import JobSpec, RunConfig
from tests.federation.test_flwr_trust import (  # noqa: F401 — its autouse fixtures
    ROWS,
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
