"""Preemption on a real federation (issue 15 point 3, ADR 0035): a preemptible low-QoS job is
stopped mid-run for a high-QoS job, queued again, and resumes from its round checkpoint.

Two sites, one pool of one slot each, so the two jobs cannot run together. The SuperLink,
SuperNodes and Celery worker (with beat: the reconcile every second) are real; the test only
submits the jobs and waits on conditions. The sites are frozen (SIGSTOP) from the moment the
first checkpoint is seen until the preempted job is queued again, so that however loaded the
machine, the job cannot finish before the preemption lands (at most the round in flight ends).
"""

from __future__ import annotations

import pytest

from accounting.models import UsageRecord
from federation import artifacts, superlink
from federation.models import JobStatus, RoundMetric
from portal.models import AuditEvent
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 2  # one checkpoint, after round 1 (none after the last)


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("preemption"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        env={"FRP_ROUND_TIMEOUT": "600"},  # a loaded machine: a slow reply is not this test's fault
    ) as w:
        yield w


def test_preempted_job_resumes_from_its_checkpoint_after_the_high_qos_job_and_completes(
    world, django_db_blocker
):
    with django_db_blocker.unblock():
        wait_for(
            lambda: sum(n.status == "online" for n in superlink.nodes_list(fs.connection())) >= 2,
            timeout=300,
            what="both SuperNodes online",
        )
        low = fs.submit(
            world,
            title="preemptible",
            num_rounds=ROUNDS,
            schedule={"qos": "low", "preemptible": True},
        )
        pk = low.pk
        assert artifacts.checkpoint_round(low) == 0  # the store holds no other job's under pk
        wait_for(
            lambda: artifacts.checkpoint_round(fs.job(pk)) >= 1,
            timeout=600,
            interval=0.2,
            what="the round 1 checkpoint",
        )
        first_run = fs.job(pk).flower_run_id
        frozen = fs.freeze_sites(world)
        try:
            high = fs.submit(world, title="urgent", num_rounds=1, schedule={"qos": "high"})
            requeued = wait_for(
                lambda: (j := fs.job(pk)).status == JobStatus.QUEUED and j,
                timeout=300,
                interval=0.2,
                what="the preempted job queued again",
            )
        finally:
            fs.thaw(frozen)

        # stopped on the SuperLink, queued again from its checkpoint, its run accounted
        saved = requeued.resume_round
        assert saved == 1, requeued.status_detail
        assert requeued.earlier_runs == [first_run] and requeued.sched_reason == "Preempted"
        assert superlink.run_status(fs.connection(), first_run).sub_status == "stopped"
        (preempt,) = AuditEvent.objects.filter(action="job.preempt", target_id=str(pk))
        assert preempt.data["preempted_for"] == high.pk and preempt.data["run_id"] == first_run
        resume = AuditEvent.objects.get(action="job.resume", target_id=str(pk))
        assert UsageRecord.objects.filter(job_id=pk, run=1, flower_run_id=first_run).count() == 2

        # the high-QoS job starts once the run is stopped, and completes
        high = fs.wait_terminal(high.pk, timeout=600, world=world)
        assert high.status == JobStatus.COMPLETED, high.status_detail
        assert high.started_at > resume.created_at  # never alongside the preempted run

        # the preempted job runs again from its checkpoint and completes, same id
        done = fs.wait_terminal(pk, timeout=600, world=world)
        assert done.status == JobStatus.COMPLETED, done.status_detail
        assert done.earlier_runs == [first_run] and done.flower_run_id != first_run
        assert done.resume_round == saved and done.started_at > high.started_at
        rounds = dict(RoundMetric.objects.filter(job_id=pk).values_list("round", "created_at"))
        assert sorted(rounds) == list(range(1, ROUNDS + 1))  # every round, once each
        assert all(rounds[r] < resume.created_at for r in range(1, saved + 1))
        assert all(rounds[r] > resume.created_at for r in range(saved + 1, ROUNDS + 1))
        assert AuditEvent.objects.filter(action="job.preempt").count() == 1  # once in all
        wait_for(
            lambda: UsageRecord.objects.filter(job_id=pk, run=2).count() == 2,
            timeout=120,
            what="the resumed run's usage records",
        )
