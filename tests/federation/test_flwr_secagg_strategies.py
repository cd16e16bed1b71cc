"""SecAgg+ with the job's model and strategy (``frp_flwr.secagg`` + ``frp_flwr.strategies``).

The secure sum gives the ServerApp only the weighted mean w̄ = Σ n_i·w_i / Σ n_i. Checked here, in
one process through Flower's own ``SecAggPlusWorkflow`` and ``secaggplus_mod`` (the wire grid of
``test_flwr_secagg``): an MLP's layers go through the secure sum (correct value: the weighted mean
of the sites' real MLP trainings, by hand with numpy); FedAdam / FedYogi / FedAdagrad stepping
from w̄ (``strategies.aggregate_mean``) land where Flower's same strategy lands from the sites'
individual replies (the plain path); strategies that need each update are refused by the
contract, and a SecAgg run's checkpoint (global model + strategy state, no history) round-trips.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from frp_flwr import checkpoints
from frp_flwr.contract import ContractError, JobSpec, Privacy, SitePointer, TrainReply
from frp_flwr.models import model_for
from frp_flwr.secagg import SecAggParams, secagg_mod, secure_train_round
from frp_flwr.strategies import (
    SECURE_SUM_STRATEGIES,
    STRATEGIES,
    StrategySpecError,
    aggregate_mean,
    aggregate_train,
    build_strategy,
    secagg_problem,
    train_reply,
)
from tests.federation import test_flwr_secagg as base

_task_identity = base._task_identity  # Flower's runtime identity for the ServerApp side

MLP = {"kind": "mlp", "hidden": [5, 3], "activation": "tanh", "dropout": 0.0}
ROWS = {11: 30, 22: 70, 33: 50}


def _site_data(node: int):
    rng = np.random.default_rng(node)
    X = rng.normal(size=(ROWS[node], 4))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64)
    return X, y


def _local_mlp(node: int, start: list[np.ndarray]) -> list[np.ndarray]:
    X, y = _site_data(node)
    new, _ = model_for(MLP).train(
        [a.copy() for a in start],
        X,
        y,
        epochs=2,
        learning_rate=0.1,
        batch_size=16,
        seed=1,
        task="classification",
    )
    return [np.asarray(a, dtype=np.float64) for a in new]


def _mlp_app(node: int, seen: list) -> ClientApp:
    app = ClientApp()

    @app.train(mods=[secagg_mod])
    def train(msg: Message, context: Context) -> Message:
        seen.append((node, msg))
        local = _local_mlp(node, msg.content["arrays"].to_numpy_ndarrays())
        metrics = TrainReply(
            num_examples=ROWS[node],
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


class _MLPGrid(base._WireGrid):
    def __init__(self, nodes):
        super().__init__(nodes)
        self.apps = {n: _mlp_app(n, self.seen) for n in nodes}


def _secure_mean(global_layers: list[np.ndarray]) -> ArrayRecord:
    outcome = secure_train_round(
        _MLPGrid(ROWS),
        params=SecAggParams(),
        active={f"site-{n}": n for n in ROWS},
        arrays=ArrayRecord([a.copy() for a in global_layers]),
        fit_config={"server-round": 1, "preprocess": "{}"},
        rnd=1,
        max_examples=100,
        timeout=5.0,
        poll=0.001,
    )
    assert outcome.errors == {}
    return outcome.arrays


def _mlp_global() -> list[np.ndarray]:
    return model_for(MLP).init_params(4, 2, seed=3)


def test_an_mlps_layers_go_through_the_secure_sum():
    start = _mlp_global()
    got = _secure_mean(start).to_numpy_ndarrays()
    total = sum(ROWS.values())
    locals_ = {n: _local_mlp(n, start) for n in ROWS}
    want = [sum(ROWS[n] * locals_[n][k] for n in ROWS) / total for k in range(len(start))]
    assert [g.shape for g in got] == [a.shape for a in start] and len(got) == 6
    for g, w, s in zip(got, want, start, strict=True):
        assert not np.allclose(w, s)  # training moved every layer (the test can fail)
        np.testing.assert_allclose(g, w, atol=1e-4)  # 2**22 quantisation levels over ±8


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad", "fedavg", "fedprox"])
def test_fedopt_steps_from_the_secure_mean_as_from_the_individual_replies(name):
    start = _mlp_global()
    current = ArrayRecord([a.copy() for a in start])
    mean = _secure_mean(start)
    total = sum(ROWS.values())
    # the plain path: Flower's strategy on each site's own reply (not available under SecAgg+)
    plain_strategy = build_strategy({"name": name})
    plain, _ = aggregate_train(
        plain_strategy,
        1,
        current,
        [train_reply(_local_mlp(n, start), ROWS[n], node=n) for n in ROWS],
    )
    secure_strategy = build_strategy({"name": name})
    secure, _ = aggregate_mean(secure_strategy, 1, current, mean, total)
    got, want = secure.to_numpy_ndarrays(), plain.to_numpy_ndarrays()
    for g, w, s in zip(got, want, start, strict=True):
        assert not np.allclose(w, s)
        np.testing.assert_allclose(g, w, atol=5e-4)
    if name in ("fedadam", "fedyogi", "fedadagrad"):  # the server moments follow the same path
        for key in ("m_t", "v_t"):
            ours, theirs = getattr(secure_strategy, key), getattr(plain_strategy, key)
            assert ours is not None and set(ours) == set(theirs)
            for k in theirs:
                np.testing.assert_allclose(ours[k], theirs[k], atol=5e-4)


@pytest.mark.parametrize("name", ["fedmedian", "fedtrimmedavg", "krum"])
def test_aggregate_mean_refuses_strategies_that_need_each_update(name):
    with pytest.raises(StrategySpecError, match="needs each site's update"):
        aggregate_mean(
            build_strategy({"name": name}),
            1,
            ArrayRecord([np.zeros(2)]),
            ArrayRecord([np.ones(2)]),
            10,
        )


def _spec(strategy: dict, *, secagg: bool = True, model: dict | None = None) -> str:
    return JobSpec(
        sites={f"s{i}": SitePointer("k", "d", 1) for i in range(3)},
        target="y",
        strategy=strategy,
        model=model or {"kind": "linear"},
        privacy=Privacy(secagg=True) if secagg else Privacy(),
    ).to_text()


@pytest.mark.parametrize("name", sorted(set(STRATEGIES) - set(SECURE_SUM_STRATEGIES)))
def test_job_spec_refuses_secagg_with_a_strategy_that_needs_each_update(name):
    assert secagg_problem({"name": name})
    with pytest.raises(ContractError, match="job-spec.strategy: .* needs each site's update"):
        JobSpec.from_json(_spec({"name": name}))
    assert JobSpec.from_json(_spec({"name": name}, secagg=False)).strategy["name"] == name


@pytest.mark.parametrize("name", SECURE_SUM_STRATEGIES)
def test_job_spec_accepts_secagg_with_mean_based_strategies_and_the_mlp(name):
    spec = JobSpec.from_json(_spec({"name": name}, model=MLP))
    assert secagg_problem(spec.strategy) == ""
    assert SecAggParams.of(spec) is not None and spec.model["kind"] == "mlp"


def test_a_secagg_runs_checkpoint_holds_the_model_and_fedadams_state_without_history():
    strategy = build_strategy({"name": "fedadam"})
    start = _mlp_global()
    aggregate_mean(strategy, 1, ArrayRecord(start), _secure_mean(start), sum(ROWS.values()))
    state = checkpoints.strategy_state(strategy)
    assert state  # FedAdam's moments are saved
    saved = checkpoints.Checkpoint(
        job_id=7,
        round=1,
        weights=start,
        initial=start,
        history=[],
        players=["a", "b", "c"],
        active=["a", "b", "c"],
        fitted=json.dumps({}),
        preparation={},
        strategy="FedAdam",
        state=state,
    )
    back = checkpoints.Checkpoint.from_bytes(saved.to_bytes())
    assert back.history == [] and back.round == 1
    restored = build_strategy({"name": "fedadam"})
    checkpoints.strategy_restore(restored, back.state)
    for key in ("m_t", "v_t"):
        for k, v in getattr(strategy, key).items():
            np.testing.assert_array_equal(getattr(restored, key)[k], v)
