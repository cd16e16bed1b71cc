"""The pool adapters' boundary (``federation.pool_adapters``) without a cluster: the parser on
scontrol outputs recorded from the real Slurm (``recorded/slurm/``, checked against it by
``test_slurm_integration.py``), and each failure of the Slurm adapter as its typed error, with
stand-in ``scontrol`` programs. GPU lines are the recorded idle line with a ``Gres`` written in
(the test cluster has no GPU)."""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from federation.pool_adapters import (
    Capacity,
    Health,
    SlurmAdapter,
    SlurmError,
    StaticAdapter,
    parse_alloc_gpus,
    parse_gres_gpus,
    parse_record,
    reading_from_output,
)

RECORDED = Path(__file__).parent / "recorded" / "slurm"
AT = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)


def _text(name: str) -> str:
    return (RECORDED / name).read_text()


def _read(nodes: str, partition: str | None = None, name: str = "frp"):
    return reading_from_output(name, partition or _text("partition_frp.txt"), nodes, read_at=AT)


def test_idle_node_lends_its_whole_capacity():
    r = _read(_text("nodes_idle.txt"))
    assert r.total == r.free == Capacity(2, 1.0, {})
    assert (r.health, r.reason, r.nodes, r.nodes_up, r.read_at) == (Health.UP, "", 1, 1, AT)


def test_slurm_job_on_the_node_takes_its_cores_and_memory_from_free():
    r = _read(_text("nodes_mixed.txt"))
    assert r.health is Health.UP
    assert r.total == Capacity(2, 1.0, {})
    assert r.free == Capacity(1, 0.75, {})  # CPUAlloc=1, AllocMem=256 of 1024 MiB


def test_drained_node_drains_the_pool_with_slurms_reason_without_its_stamp():
    r = _read(_text("nodes_drained.txt"))
    assert r.health is Health.DRAINED
    assert r.reason == "localhost idle+drain: maintenance"
    assert r.free == Capacity(0, 0.0, {}) and r.total.cores == 2
    assert (r.nodes, r.nodes_up) == (1, 0)


def test_down_node_makes_the_pool_down():
    r = _read(_text("nodes_down.txt"))
    assert r.health is Health.DOWN
    assert r.reason.startswith("localhost down") and r.reason.endswith(": disk failed")


def test_one_node_of_two_down_is_up_with_fewer_cores_and_names_the_down_node():
    idle = _text("nodes_idle.txt").strip()
    other = (
        _text("nodes_down.txt")
        .strip()
        .replace("NodeName=localhost", "NodeName=node2")
        .replace("NodeAddr=127.0.0.1", "NodeAddr=127.0.0.2")
    )
    r = _read(idle + "\n" + other + "\n")
    assert r.health is Health.UP
    assert r.total.cores == 4 and r.free.cores == 2
    assert (r.nodes, r.nodes_up) == (2, 1)
    assert r.reason.startswith("1 of 2 nodes unavailable: node2 down")


@pytest.mark.parametrize(
    "state, health",
    [("IDLE*", Health.DOWN), ("IDLE+NOT_RESPONDING", Health.DOWN), ("FUTURE", Health.DOWN)]
    + [("IDLE+MAINT", Health.DOWN), ("MIXED+DRAIN", Health.DRAINED), ("ALLOCATED", Health.UP)],
)
def test_node_states(state, health):
    assert _read(_text("nodes_idle.txt").replace("State=IDLE", f"State={state}")).health is health


def test_nodes_of_other_partitions_are_left_out():
    nodes = _text("nodes_idle.txt").replace("Partitions=frp", "Partitions=gpu,debug")
    r = _read(nodes)
    assert (r.health, r.nodes, r.total) == (Health.DOWN, 0, Capacity())
    assert r.reason == "partition frp has no nodes"


def test_partition_not_up_lends_nothing():
    part = _text("partition_frp.txt").replace("State=UP", "State=DOWN")
    r = _read(_text("nodes_idle.txt"), part)
    assert (r.health, r.free) == (Health.DOWN, Capacity())
    assert r.reason == "partition frp is DOWN"
    part = _text("partition_frp.txt").replace("State=UP", "State=DRAIN")
    assert _read(_text("nodes_idle.txt"), part).health is Health.DRAINED


def test_partition_missing_from_the_text_is_unknown():
    with pytest.raises(SlurmError) as exc:
        _read(_text("nodes_idle.txt"), name="gpu")
    assert exc.value.kind == "unknown-partition"


def test_gpus_by_model_free_after_allocation():
    line = (
        _text("nodes_mixed.txt")
        .replace("Gres=(null)", "Gres=gpu:a100:2(S:0-1),gpu:v100:1,shard:4")
        .replace("AllocTRES=cpu=1,mem=256M", "AllocTRES=cpu=1,mem=256M,gres/gpu=1,gres/gpu:a100=1")
    )
    r = _read(line)
    assert r.total.gpus == {"a100": 2, "v100": 1}
    assert r.free.gpus == {"a100": 1, "v100": 1}
    assert r.free.gpu_count("NVIDIA A100 80GB") == 1
    assert r.total.gpu_count("") == 3


def test_gres_and_alloc_tres_forms():
    assert parse_gres_gpus("(null)") == {}
    assert parse_gres_gpus("gpu:2") == {"": 2}
    assert parse_gres_gpus("gpu:tesla:4(S:0),mps:100") == {"tesla": 4}
    assert parse_alloc_gpus("") == {}
    assert parse_alloc_gpus("cpu=2,gres/gpu=3") == {"": 3}
    assert Capacity(gpus={"": 2}).gpu_count("NVIDIA T4") == 2  # untyped GPUs count for any model


def test_record_values_with_spaces_and_reason_to_the_end():
    rec = parse_record("NodeName=n1 OS=Linux 6.1 #1 SMP State=IDLE Reason=a=b c [root@2026-12-05]")
    assert rec == {
        "NodeName": "n1",
        "OS": "Linux 6.1 #1 SMP",
        "State": "IDLE",
        "Reason": "a=b c [root@2026-12-05]",
    }


def test_static_adapter_lends_its_figures_always_up():
    r = StaticAdapter(cores=8, memory_gib=32, gpus=2, gpu_model="A100").read()
    assert r.total == r.free == Capacity(8, 32.0, {"A100": 2})
    assert r.health is Health.UP


# --- the Slurm adapter's failures, each a SlurmError of its kind -------------------------------


def _program(tmp_path: Path, body: str) -> str:
    path = tmp_path / "scontrol"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_missing_scontrol(tmp_path):
    adapter = SlurmAdapter(partition="frp", scontrol=str(tmp_path / "nowhere" / "scontrol"))
    with pytest.raises(SlurmError) as exc:
        adapter.read()
    assert exc.value.kind == "missing"
    assert "Slurm's client installed" in str(exc.value)


def test_scontrol_that_hangs_times_out(tmp_path):
    adapter = SlurmAdapter(
        partition="frp", scontrol=_program(tmp_path, "exec sleep 30"), timeout=0.5
    )
    with pytest.raises(SlurmError) as exc:
        adapter.read()
    assert exc.value.kind == "timeout"
    assert "within 0.5 s" in str(exc.value)


def test_unknown_partition_as_slurm_says_it(tmp_path):
    said = _text("partition_unknown.txt").replace("PARTITION", "gpu")
    (tmp_path / "said.txt").write_text(said)
    program = _program(tmp_path, f"cat {tmp_path / 'said.txt'}; exit 1")
    with pytest.raises(SlurmError) as exc:
        SlurmAdapter(partition="gpu", scontrol=program).read()
    assert exc.value.kind == "unknown-partition"
    assert str(exc.value) == "Slurm has no partition 'gpu'"


def test_controller_down_is_a_failed_read_with_slurms_message(tmp_path):
    program = _program(
        tmp_path,
        'echo "slurm_load_partitions error: Unable to contact slurm controller (connect failure)"'
        " >&2; exit 1",
    )
    with pytest.raises(SlurmError) as exc:
        SlurmAdapter(partition="frp", scontrol=program).read()
    assert exc.value.kind == "failed"
    assert "Unable to contact slurm controller" in str(exc.value)


def test_unparsable_output(tmp_path):
    program = _program(tmp_path, "echo 'this is not a record'")
    with pytest.raises(SlurmError) as exc:
        SlurmAdapter(partition="frp", scontrol=program).read()
    assert exc.value.kind == "unparsable"


def test_slurm_conf_is_passed_as_slurm_conf(tmp_path):
    (tmp_path / "p.txt").write_text(_text("partition_frp.txt"))
    (tmp_path / "n.txt").write_text(_text("nodes_idle.txt"))
    program = _program(
        tmp_path,
        '[ "$SLURM_CONF" = /etc/other/slurm.conf ] || exit 3\n'
        f'if [ "$3" = partition ]; then cat {tmp_path / "p.txt"}; else cat {tmp_path / "n.txt"}; fi',
    )
    adapter = SlurmAdapter(partition="frp", conf="/etc/other/slurm.conf", scontrol=program)
    assert adapter.read().total.cores == 2


@pytest.mark.parametrize("name", ["", "a b", "x;rm", "p" * 65])
def test_bad_partition_names_are_refused_before_running_anything(name):
    with pytest.raises(SlurmError) as exc:
        SlurmAdapter(partition=name)
    assert exc.value.kind == "unknown-partition"
