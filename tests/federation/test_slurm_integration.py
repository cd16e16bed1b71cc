"""The Slurm pool adapter against a real Slurm (Debian's slurm-wlm and munge on loopback).

One cluster per module (``slurm_support.slurm_cluster``: one node ``localhost`` with 2 CPUs and
1 GiB in partition ``frp``). The adapter reads it; a Slurm job holding a core makes the pool lend
one core fewer; ``scontrol update … State=DRAIN Reason="maintenance"`` makes the pool unhealthy
with that reason and a job at it waits with ``NodeDown``; resuming the node brings it back. Each
scenario's scontrol output is compared with the one recorded under ``recorded/slurm/`` that the
parser's unit tests read (``test_pool_adapters.py``), so the recorded outputs are checked against
the real Slurm. ``FRP_SLURM_RECORD=1`` rewrites them. The SuperLink is the service tests' fake.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.urls import reverse

from federation import pool_adapters, pool_services, services
from federation.models import ComputePool, JobStatus
from portal.models import Role
from tests.factories import MembershipFactory
from tests.federation import slurm_support
from tests.federation import test_services as svc

world, fake_superlink, launch = svc.world, svc.fake_superlink, svc.launch

RECORDED = Path(__file__).parent / "recorded" / "slurm"
_missing = slurm_support.missing_binaries()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(_missing),
        reason="Slurm is not installed (missing: "
        + ", ".join(_missing)
        + "); apt-get install slurm-wlm munge",
    ),
]

#: Fields of scontrol's records that depend only on the cluster's configuration and state (not on
#: the machine, the clock or the run): compared between the real and the recorded outputs.
NODE_FIELDS = (
    "NodeName",
    "CPUAlloc",
    "CPUEfctv",
    "CPUTot",
    "Gres",
    "NodeAddr",
    "NodeHostName",
    "Version",
    "RealMemory",
    "AllocMem",
    "State",
    "Partitions",
    "CfgTRES",
    "AllocTRES",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_support.slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture
def idle(cluster):
    """The node idle and resumed, no job, before and after each test."""

    def reset():
        cluster.run("scancel", "--partition", cluster.partition, check=False)
        if cluster.node_state() != "idle":
            cluster.run("scontrol", "update", "NodeName=localhost", "State=RESUME", check=False)
        cluster.wait(lambda: cluster.node_state() == "idle", "the node idle again")

    reset()
    yield cluster
    reset()


def _adapter(cluster, **kw) -> pool_adapters.SlurmAdapter:
    return pool_adapters.SlurmAdapter(
        partition=kw.pop("partition", cluster.partition), conf=str(cluster.conf), **kw
    )


def _stable(rec: dict) -> dict:
    out = {k: rec.get(k) for k in NODE_FIELDS if k in rec}
    if "Reason" in rec:  # without Slurm's "[user@time]"
        out["Reason"] = re.sub(r"\s*\[[^\]]*\]$", "", rec["Reason"])
    return out


def _reading(text_partition: str, text_nodes: str):
    r = pool_adapters.reading_from_output(
        slurm_support.PARTITION, text_partition, text_nodes, read_at=_EPOCH
    )
    return replace(r, read_at=_EPOCH)


_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def check_recorded(name: str, real: str) -> None:
    """The recorded output ``name`` has the real output's fields, in its order, with the same
    configuration- and state-dependent values (``FRP_SLURM_RECORD=1``: record it instead)."""
    path = RECORDED / name
    if os.environ.get("FRP_SLURM_RECORD"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(real)
        return
    recorded = path.read_text()
    real_recs = pool_adapters.parse_records(real)
    rec_recs = pool_adapters.parse_records(recorded)
    assert [list(r) for r in real_recs] == [list(r) for r in rec_recs], (
        f"scontrol's fields differ from {path.name} (another Slurm version?): re-record with "
        "FRP_SLURM_RECORD=1"
    )
    if name.startswith("partition"):
        assert real_recs == rec_recs
    else:
        assert [_stable(r) for r in real_recs] == [_stable(r) for r in rec_recs]


def _outputs(cluster, state: str) -> tuple[str, str]:
    part, nodes = _adapter(cluster).outputs()
    check_recorded("partition_frp.txt", part)
    check_recorded(f"nodes_{state}.txt", nodes)
    return part, nodes


def test_adapter_reads_the_real_partitions_capacity(idle):
    reading = _adapter(idle).read()
    assert reading.health is pool_adapters.Health.UP
    assert reading.reason == ""
    assert reading.total == pool_adapters.Capacity(2, 1.0, {})
    assert reading.free == reading.total
    assert (reading.nodes, reading.nodes_up) == (1, 1)
    part, nodes = _outputs(idle, "idle")
    # the parser reads the recorded output as it reads the real one
    recorded = _reading(
        (RECORDED / "partition_frp.txt").read_text(), (RECORDED / "nodes_idle.txt").read_text()
    )
    assert _reading(part, nodes) == recorded == replace(reading, read_at=_EPOCH)


def test_unknown_partition_is_a_typed_error(idle):
    with pytest.raises(pool_adapters.SlurmError) as exc:
        _adapter(idle, partition="nosuch").read()
    assert exc.value.kind == "unknown-partition"
    assert "nosuch" in str(exc.value)
    done = idle.run("scontrol", "--oneliner", "show", "partition", "nosuch", check=False)
    assert done.returncode == 1
    printed = done.stdout + done.stderr  # Slurm 22.05 says it on stdout
    assert "nosuch" in printed
    check_recorded_text("partition_unknown.txt", printed.replace("nosuch", "PARTITION"))


def check_recorded_text(name: str, real: str) -> None:
    path = RECORDED / name
    if os.environ.get("FRP_SLURM_RECORD"):
        path.write_text(real)
        return
    assert path.read_text() == real


def test_controller_not_answering_is_a_typed_error(idle, tmp_path):
    conf = tmp_path / "slurm.conf"
    port = slurm_support._free_port()  # nothing listens there
    conf.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={port}", idle.conf.read_text()))
    adapter = pool_adapters.SlurmAdapter(partition="frp", conf=str(conf), timeout=20)
    with pytest.raises(pool_adapters.SlurmError) as exc:
        adapter.read()
    assert exc.value.kind in ("failed", "timeout")
    assert "Unable to contact slurm controller" in str(exc.value) or "within" in str(exc.value)


@pytest.fixture
def slurm_pool(idle, world):
    """The first site's pool lends the real partition (8 cores lent at most: Slurm has 2)."""
    site = world["versions"][0].dataset.site
    pool = ComputePool.objects.get(site=site)
    pool.adapter, pool.slurm_partition, pool.slurm_conf = "slurm", "frp", str(idle.conf)
    pool.cores, pool.memory_gib = 8, 32
    pool.save()
    return pool


@pytest.mark.django_db
def test_a_slurm_job_holding_a_core_leaves_the_pool_one_core(
    slurm_pool, idle, world, fake_superlink, launch
):
    idle.run("sbatch", "-p", "frp", "-c", "1", "--mem=256", "-o", "/dev/null", "--wrap=sleep 600")
    idle.wait(lambda: idle.node_state() == "mixed", "the Slurm job to run")
    _outputs(idle, "mixed")
    reading = pool_services.pool_reading_refresh(pool=slurm_pool)
    assert reading.free == pool_adapters.Capacity(1, 0.75, {})
    assert reading.health is pool_adapters.Health.UP

    two = launch(world, schedule={"cores": 2, "memory_gib": 1})
    assert (two.status, two.sched_reason) == (JobStatus.QUEUED, "Resources")
    one = launch(world, schedule={"cores": 1, "memory_gib": 0.5})
    assert one.status == JobStatus.RUNNING
    assert fake_superlink.submitted and len(fake_superlink.submitted) == 1


@pytest.mark.django_db
def test_drained_node_makes_the_pool_unhealthy_then_resume_brings_it_back(
    slurm_pool, idle, world, fake_superlink, launch, client
):
    idle.run("scontrol", "update", "NodeName=localhost", "State=DRAIN", "Reason=maintenance")
    idle.wait(lambda: idle.node_state() == "drained", "the node drained")
    _outputs(idle, "drained")
    assert pool_services.pool_reading_refresh(pool=slurm_pool) is not None
    slurm_pool.refresh_from_db()
    assert slurm_pool.health == "drained"
    assert "maintenance" in slurm_pool.health_reason

    job = launch(world)
    assert (job.status, job.sched_reason) == (JobStatus.QUEUED, "NodeDown")
    assert "maintenance" in job.status_detail
    assert fake_superlink.submitted == []

    admin = MembershipFactory(
        institution=slurm_pool.site.institution, role=Role.INSTITUTION_ADMIN
    ).user
    client.force_login(admin)
    page = client.get(reverse("federation:pool_edit", args=[slurm_pool.pk])).content.decode()
    assert "Drained" in page and "maintenance" in page

    idle.run("scontrol", "update", "NodeName=localhost", "State=RESUME")
    idle.wait(lambda: idle.node_state() == "idle", "the node resumed")
    pool_services.pool_reading_refresh(pool=slurm_pool)
    slurm_pool.refresh_from_db()
    assert (slurm_pool.health, slurm_pool.health_reason) == ("up", "")
    assert services.job_launch(job_id=job.pk).status == JobStatus.RUNNING


@pytest.mark.django_db
def test_down_node_makes_the_pool_down_with_slurms_reason(slurm_pool, idle):
    idle.run("scontrol", "update", "NodeName=localhost", "State=DOWN", "Reason=disk failed")
    idle.wait(lambda: idle.node_state() == "down", "the node down")
    _outputs(idle, "down")
    pool_services.pool_reading_refresh(pool=slurm_pool)
    slurm_pool.refresh_from_db()
    assert slurm_pool.health == "down"
    assert "disk failed" in slurm_pool.health_reason
    assert slurm_pool.reading["total"]["cores"] == 2
    assert slurm_pool.reading["free"]["cores"] == 0
