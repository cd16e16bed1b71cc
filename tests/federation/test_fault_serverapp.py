"""Fault: the job's ServerApp process (``flwr-serverapp``) killed with SIGKILL mid-job, then the
job resumed from its round checkpoint by a new Flower run (issue 14, point 5).

The killed run ends FAILED on the SuperLink; the job's submitter resumes it (the service the
page's button calls); the new run trains the remaining rounds from the checkpoint in the model
store. The job keeps its id and its rounds — each once — and ends COMPLETED with the final
accuracy of an uninterrupted job on the same data (same seeds).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from federation import artifacts, services, superlink
from federation.models import JobStatus, RoundMetric
from portal.models import AuditEvent
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The kill comes after the round-1 checkpoint; at most the round in flight ends after it, so a
#: third round is always left to resume (each round costs every site a ClientApp process).
ROUNDS = 3


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("fault-serverapp"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        env={"FRP_ROUND_TIMEOUT": "600"},  # a loaded machine: a slow reply is not this test's fault
    ) as w:
        yield w


def _serverapps(world) -> list[int]:
    """The ``flwr-serverapp`` processes under this world's SuperLink (never another test's)."""
    found = []
    for pid in fs.descendants(world.federation.superlink_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"flwr-serverapp" in cmdline and fs.alive(pid):
            found.append(pid)
    return found


def test_serverapp_killed_mid_job_is_resumed_and_completes_as_an_uninterrupted_job(
    world, django_db_blocker
):
    with django_db_blocker.unblock():
        wait_for(  # a loaded machine: both SuperNodes online before the job's discovery starts
            lambda: sum(n.status == "online" for n in superlink.nodes_list(fs.connection())) >= 2,
            timeout=300,
            what="both SuperNodes online",
        )
        whole = fs.submit(world, title="uninterrupted", num_rounds=ROUNDS)
        whole = fs.wait_terminal(whole.pk, timeout=900, world=world)
        assert whole.status == JobStatus.COMPLETED, whole.status_detail

        job = fs.submit(world, title="killed and resumed", num_rounds=ROUNDS)
        pk = job.pk
        assert artifacts.checkpoint_round(job) == 0  # the store holds no other job's under pk
        wait_for(
            lambda: artifacts.checkpoint_round(fs.job(pk)) >= 1,
            timeout=600,
            interval=0.2,
            what="the round 1 checkpoint",
        )
        # The sites are frozen first, so no further round can end between the checkpoint seen
        # and the kill however loaded the machine (at most the round in flight ends: saved ≤ 2).
        # The ServerApp's pid is read only then: read earlier, it can be the previous job's
        # ServerApp still exiting after its run completed.
        frozen = fs.freeze_sites(world)
        try:
            pids = wait_for(lambda: _serverapps(world), timeout=60, what="the ServerApp process")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_for(
                lambda: not any(fs.alive(pid) for pid in pids),
                timeout=60,
                what="the killed ServerApp gone",
            )
        finally:
            fs.thaw(frozen)
        first_run = fs.job(pk).flower_run_id
        failed = fs.wait_terminal(pk, timeout=600, world=world)
        saved = artifacts.checkpoint_round(failed)
        assert failed.status == JobStatus.FAILED, (failed.status_detail, saved, pids)
        assert 1 <= saved < ROUNDS

        services.job_resume(by=world.researcher, job_id=pk)
        done = fs.wait_terminal(pk, timeout=900, world=world)

        assert done.pk == pk and done.status == JobStatus.COMPLETED, done.status_detail
        assert done.earlier_runs == [first_run] and done.flower_run_id != first_run
        assert done.resume_round == saved
        rounds = list(RoundMetric.objects.filter(job_id=pk).values_list("round", flat=True))
        assert sorted(rounds) == list(range(1, ROUNDS + 1))  # every round, once each
        assert done.final_metrics["eval_accuracy"] == pytest.approx(
            whole.final_metrics["eval_accuracy"], abs=1e-9
        )
        assert "model" not in done.final_metrics and done.model_key
        assert AuditEvent.objects.filter(action="job.resume", target_id=str(pk)).exists()
