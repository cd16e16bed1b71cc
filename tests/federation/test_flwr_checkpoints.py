"""Round checkpoints (``frp_flwr.checkpoints``) and resuming a run from one (issue 14, point 5).

The run tests use the real ClientApp handlers over the in-memory Grid of ``test_flwr_trust``; a
"crash" is the ServerApp process ending at a round (``SystemExit`` from inside the round loop, as
a SIGKILL would end it, with nothing posted). The resumed run must give the uninterrupted run's
model, rounds and contribution exactly (every site's training is seeded by its round number).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr import checkpoints, server_app  # noqa: E402
from frp_flwr.contract import RunConfig, SiteLimits  # noqa: E402
from frp_flwr.task import RoundLog  # noqa: E402
from sandbox.storage import FilesystemStore  # noqa: E402
from tests.federation.test_flwr_trust import (  # noqa: E402, F401 — fixtures used by name
    ROWS,
    NodeGrid,
    Portal,
    _cfg,
    _honest,
    in_memory_sites,
    task_identity,
)


def _checkpoint(job_id=5, rnd=2) -> checkpoints.Checkpoint:
    rng = np.random.default_rng(3)
    model = [rng.normal(size=(4, 3)), rng.normal(size=3)]
    log = RoundLog(
        start=[np.zeros((4, 3)), np.zeros(3)],
        updates={0: [m + 1 for m in model], 2: [m - 1 for m in model]},
        examples={0: 40, 2: 17},
    )
    return checkpoints.Checkpoint(
        job_id=job_id,
        round=rnd,
        weights=model,
        initial=[np.zeros((4, 3)), np.zeros(3)],
        history=[log, log],
        players=["a", "b", "c"],
        active=["a", "c"],
        fitted='{"task": "classification"}',
        preparation={"task": "classification", "sites": {}},
        train_labels={"yes": 30, "no": 27},
        released_labels={"yes": 30, "no": 25},
        state={"m_t/d/0": np.ones(3)},
    )


def test_checkpoint_round_trips_every_array_and_field():
    saved = _checkpoint()

    back = checkpoints.Checkpoint.from_bytes(saved.to_bytes())

    assert (back.job_id, back.round, back.players, back.active) == (
        5,
        2,
        ["a", "b", "c"],
        ["a", "c"],
    )
    assert back.train_labels == {"yes": 30, "no": 27}
    assert back.released_labels == {"yes": 30, "no": 25}
    assert all(np.array_equal(a, b) for a, b in zip(back.weights, saved.weights, strict=True))
    assert back.history[1].examples == {0: 40, 2: 17}
    assert np.array_equal(back.history[0].updates[2][0], saved.history[0].updates[2][0])
    assert np.array_equal(back.state["m_t/d/0"], np.ones(3))


def test_a_checkpoint_written_before_released_labels_reads_with_none():
    saved = _checkpoint()
    npz = dict(np.load(io.BytesIO(saved.to_bytes()), allow_pickle=False))
    manifest = json.loads(bytes(npz["manifest"]).decode())
    del manifest["released_labels"]
    npz["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **npz)

    back = checkpoints.Checkpoint.from_bytes(buffer.getvalue())

    assert back.released_labels == {} and back.train_labels == {"yes": 30, "no": 27}


@pytest.mark.parametrize("raw", [b"", b"not an npz", b"PK\x03\x04broken"])
def test_checkpoint_from_bytes_refuses_what_is_not_one(raw):
    with pytest.raises(checkpoints.CheckpointError, match="not a readable checkpoint"):
        checkpoints.Checkpoint.from_bytes(raw)


def test_store_keeps_the_latest_round_and_refuses_another_jobs_object(tmp_path):
    store = FilesystemStore(tmp_path / "models")
    assert checkpoints.latest_round(store, 5) == 0

    checkpoints.save(store, _checkpoint(rnd=1))
    checkpoints.save(store, _checkpoint(rnd=2))

    assert checkpoints.latest_round(store, 5) == 2
    assert checkpoints.load(store, 5, 1).round == 1
    with pytest.raises(checkpoints.CheckpointError, match="no round 3 checkpoint"):
        checkpoints.load(store, 5, 3)
    # an object copied under another job's key is not taken for that job's
    (tmp_path / "models/checkpoints/job-6").mkdir(parents=True)
    (tmp_path / "models/checkpoints/job-6/round-002.npz").write_bytes(
        _checkpoint(job_id=5).to_bytes()
    )
    with pytest.raises(checkpoints.CheckpointError, match="is job 5's round 2"):
        checkpoints.load(store, 6, 2)


def test_store_from_environ_is_off_without_the_variable_and_names_a_bad_url():
    assert checkpoints.store_from_environ({}) is None
    with pytest.raises(checkpoints.CheckpointError, match="FRP_MODEL_STORE_URL"):
        checkpoints.store_from_environ({"FRP_MODEL_STORE_URL": "ftp://x/y"})


def test_strategy_state_of_fedavg_is_empty_and_fedavgm_and_fedadam_come_back():
    assert checkpoints.strategy_state(FedAvg()) == {}
    momentum = FedAvgM()
    momentum.momentum_vector = [np.full((2, 2), 0.5), np.arange(2.0)]
    momentum.current_arrays = ArrayRecord([np.ones((2, 2)), np.zeros(2)])
    adam = FedAdam()
    adam.m_t, adam.v_t = {"0": np.ones(2)}, {"0": np.full(2, 2.0)}
    adam.current_arrays = {"0": np.zeros(2)}

    fresh_m, fresh_a = FedAvgM(), FedAdam()
    checkpoints.strategy_restore(fresh_m, checkpoints.strategy_state(momentum))
    checkpoints.strategy_restore(fresh_a, checkpoints.strategy_state(adam))

    assert np.array_equal(fresh_m.momentum_vector[0], np.full((2, 2), 0.5))
    assert np.array_equal(fresh_m.current_arrays.to_numpy_ndarrays()[0], np.ones((2, 2)))
    assert np.array_equal(fresh_a.v_t["0"], np.full(2, 2.0))
    assert np.array_equal(fresh_a.current_arrays["0"], np.zeros(2))


def test_a_registered_strategy_state_is_used_for_its_class():
    class Clipped(FedAvg):
        clip = 1.0

    checkpoints.register_strategy_state(
        "Clipped",
        lambda s: {"clip": np.array(s.clip)},
        lambda s, st: setattr(s, "clip", float(st["clip"])),
    )
    old, new = Clipped(), Clipped()
    old.clip = 0.25

    checkpoints.strategy_restore(new, checkpoints.strategy_state(old))

    assert new.clip == 0.25


# --- resuming a run ----------------------------------------------------------------------------


def _run(cfg: RunConfig, store) -> Portal:
    portal = Portal({s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()})
    server_app.run_job(NodeGrid(_honest(), cfg.to_flower()), cfg, portal, store=store)
    return portal


def test_a_run_killed_after_round_2_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    cfg = RunConfig(**{**_cfg(rounds=4).__dict__, "job_id": 9})
    whole = _run(cfg, FilesystemStore(tmp_path / "whole"))

    store = FilesystemStore(tmp_path / "crashed")
    real_round = server_app._round
    crashed = Portal({s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()})

    def killed_in_round_4(run, rnd):
        # fused rounds (ADR 0032): round 2 is posted and checkpointed when round 3's train
        # replies (which evaluate it) are in; killed before round 4's, round 3 is trained only
        if rnd == 4:
            raise SystemExit("SIGKILL")  # nothing is posted, as when the process is killed
        real_round(run, rnd)

    monkeypatch.setattr(server_app, "_round", killed_in_round_4)
    with pytest.raises(SystemExit):
        server_app.run_job(NodeGrid(_honest(), cfg.to_flower()), cfg, crashed, store=store)
    assert checkpoints.latest_round(store, 9) == 2
    assert [e.round for e in crashed.of("round")] == [1, 2]
    monkeypatch.setattr(server_app, "_round", real_round)

    resumed = _run(RunConfig(**{**cfg.__dict__, "resume_round": 2}), store)

    assert [e.round for e in resumed.of("round")] == [3, 4]  # rounds 1–2 are not run again
    assert resumed.of("started")[0].preparation is not None  # the checkpoint's preparation
    (a,), (b,) = whole.of("finished"), resumed.of("finished")
    assert len(a.model) == len(b.model) == 2
    for layer_a, layer_b in zip(a.model, b.model, strict=True):
        # two uninterrupted runs differ by float summation order alone (≈1e-16)
        np.testing.assert_allclose(np.asarray(layer_a), np.asarray(layer_b), rtol=0, atol=1e-12)
    assert np.abs(np.asarray(a.model[0])).sum() > 0  # a trained model, not the zero start
    assert a.eval_accuracy == b.eval_accuracy
    assert [e.eval_loss for e in whole.of("round")][2:] == [
        e.eval_loss for e in resumed.of("round")
    ]
    (ca,), (cb,) = whole.of("contribution"), resumed.of("contribution")
    assert ca.utilities.keys() == cb.utilities.keys() == {"0", "1", "2", "3", "4"}
    for rnd, by_coalition in ca.utilities.items():  # the history came back whole
        assert by_coalition == pytest.approx(cb.utilities[rnd], abs=1e-12)


def test_resuming_without_a_store_or_a_checkpoint_fails_with_the_reason(tmp_path):
    cfg = RunConfig(**{**_cfg(rounds=3).__dict__, "job_id": 9, "resume_round": 1})
    with pytest.raises(server_app.JobFailed, match="no model store"):
        _run(cfg, None)
    with pytest.raises(server_app.JobFailed, match="cannot resume: no round 1 checkpoint"):
        _run(cfg, FilesystemStore(tmp_path / "empty"))


def test_no_checkpoint_is_written_after_the_last_round(tmp_path):
    store = FilesystemStore(tmp_path / "s")
    _run(RunConfig(**{**_cfg(rounds=2).__dict__, "job_id": 4}), store)

    assert checkpoints.latest_round(store, 4) == 1
    pointer = json.loads(store.get_bytes(checkpoints.latest_key(4)))
    assert pointer["key"] == "checkpoints/job-4/round-001.npz"


def test_the_store_url_reaches_the_superlink_and_no_supernode(settings, tmp_path, monkeypatch):
    """The model store URL (which may hold S3 credentials) is the ServerApp host's, like the
    callback key: in the SuperLink's environment, stripped from every other process's."""
    from federation import callbacks, runtime

    settings.FRP_MODEL_STORE_URL = "s3://AK:SK@127.0.0.1:9/models"
    settings.FRP_CALLBACK_KEY = "k" * 64

    assert callbacks.serverapp_environment()[checkpoints.STORE_ENV] == settings.FRP_MODEL_STORE_URL
    assert checkpoints.STORE_ENV in callbacks.SECRET_ENV
    monkeypatch.setenv(checkpoints.STORE_ENV, settings.FRP_MODEL_STORE_URL)
    assert checkpoints.STORE_ENV not in runtime._env(tmp_path / "home")  # a SuperNode's
