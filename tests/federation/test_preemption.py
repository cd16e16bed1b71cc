"""Preemption of running preemptible jobs for higher-QoS jobs, through their round checkpoints
(issue 15 point 3, ADR 0035), with the faked SuperLink of the service tests.

Each site of ``world`` has one pool of one slot, so a running job holds both pools whole. The
fake gives every run its own id and stops a run as flwr 1.42 does (``finished:stopped`` at once).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.urls import reverse
from django.utils import timezone

from accounting.models import UsageRecord
from federation import admission, services, superlink
from federation.models import (
    ComputePool,
    FederatedJob,
    JobSite,
    JobSiteStatus,
    JobStatus,
    RoundMetric,
)
from federation.scheduling.priority import fairshare_factors
from frp_flwr import checkpoints
from portal.models import AuditEvent, ProjectRole, Role
from sandbox.storage import store_from_url
from tests.factories import (
    BillingJobFactory,
    GrantFactory,
    MembershipFactory,
    ProjectFactory,
    ProjectMemberFactory,
)
from tests.federation import test_services as svc
from tests.federation.callback_support import record

world, launch = svc.world, svc.launch

pytestmark = pytest.mark.django_db

LOW = {"qos": "low", "preemptible": True}
HIGH = {"qos": "high"}


class Runs(svc.FakeSuperLink):
    """The service tests' fake with one status per run: ``run_submit`` numbers runs from 101,
    ``run_stop`` ends a running run ``stopped`` (and refuses a finished one, as flwr does);
    ``stop_fails`` makes the next stops fail as an unreachable SuperLink."""

    def __init__(self):
        super().__init__()
        self.by_id: dict[str, superlink.RunStatus] = {}
        self.stop_fails = 0

    def run_submit(self, conn, run_config):
        self.submitted.append(run_config)
        run_id = str(101 + len(self.by_id))
        self.by_id[run_id] = superlink.RunStatus(run_id, "running", "", "", {})
        return run_id

    def run_status(self, conn, run_id):
        return self.by_id[run_id]

    def run_stop(self, conn, run_id):
        if self.stop_fails:
            self.stop_fails -= 1
            raise superlink.SuperLinkUnreachable("connection refused")
        if self.by_id[run_id].is_finished:
            raise superlink.SuperLinkError(f"run {run_id} is already finished")
        self.stopped.append(run_id)
        self.by_id[run_id] = superlink.RunStatus(run_id, "finished", "stopped", "", {})

    def end(self, run_id: str, sub_status: str) -> None:
        self.by_id[run_id] = superlink.RunStatus(run_id, "finished", sub_status, "", {})


@pytest.fixture
def fake(monkeypatch, settings, tmp_path):
    settings.FRP_MODEL_STORE_URL = (tmp_path / "model-store").as_uri()
    runs = Runs()
    for name in ("run_submit", "run_status", "run_stop", "runs_list", "runs_status"):
        monkeypatch.setattr(services.superlink, name, getattr(runs, name))
    return runs


@pytest.fixture
def reconcile(django_capture_on_commit_callbacks):
    """``job_reconcile`` with its on-commit work run (the launches it queues: eager Celery)."""

    def _reconcile(job) -> FederatedJob:
        with django_capture_on_commit_callbacks(execute=True):
            services.job_reconcile(job_id=job.pk)
        return FederatedJob.objects.get(pk=job.pk)

    return _reconcile


def _rounds(world, job, rounds) -> None:
    for rnd in rounds:
        record(job, svc._round_payload(world, rnd))


def _checkpoint(job, rnd: int) -> None:
    """The round-``rnd`` checkpoint the ServerApp would have written (``frp_flwr.checkpoints``)."""
    zeros = [np.zeros((2, 2)), np.zeros(2)]
    sites = sorted(js.site.slug for js in job.sites.select_related("site"))
    checkpoints.save(
        store_from_url(django_settings.FRP_MODEL_STORE_URL),
        checkpoints.Checkpoint(
            job_id=job.pk,
            round=rnd,
            weights=zeros,
            initial=zeros,
            history=[],
            players=sites,
            active=sites,
            fitted="{}",
            preparation={},
        ),
    )


def _audits(action: str, job) -> list[dict]:
    return [e.data for e in AuditEvent.objects.filter(action=action, target_id=str(job.pk))]


def _complete(job, fake, reconcile) -> FederatedJob:
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics={"eval_accuracy": 0.9})
    fake.end(job.flower_run_id, "completed")
    return reconcile(job)


def test_preemptible_job_is_stopped_for_a_high_qos_job_and_resumes_from_its_checkpoint(
    world, fake, launch, reconcile
):
    low = launch(world, schedule=LOW, num_rounds=4)
    assert (low.status, low.flower_run_id) == (JobStatus.RUNNING, "101")
    _rounds(world, low, (1, 2, 3))
    _checkpoint(low, 2)  # round 3 was posted, its checkpoint not written yet

    high = launch(world, schedule=HIGH)

    # the low job's run is stopped; the high job waits until the SuperLink reports it ended
    assert fake.stopped == ["101"]
    low.refresh_from_db()
    assert low.status == JobStatus.RUNNING and low.preempt_requested_at is not None
    assert (low.preempted_by_id, low.sched_reason) == (high.pk, "Preempted")
    assert _audits("job.preempt", low) == [
        {"run_id": "101", "preempted_for": high.pk, "reason": "Preempted"}
    ]
    assert AuditEvent.objects.get(action="job.preempt").actor is None  # by the system
    assert (high.status, high.sched_reason) == (JobStatus.QUEUED, "Resources")
    assert f"the run of preempted job #{low.pk} is being stopped" in high.status_detail
    assert len(fake.submitted) == 1

    # the reconcile sees the run stopped: the low job is queued again, the high job starts
    low = reconcile(low)
    high.refresh_from_db()
    assert (low.status, low.resume_round, low.earlier_runs) == (JobStatus.QUEUED, 2, ["101"])
    assert (low.flower_run_id, low.preempt_requested_at, low.finished_at) == ("", None, None)
    assert sorted(RoundMetric.objects.filter(job=low).values_list("round", flat=True)) == [1, 2]
    assert (high.status, high.flower_run_id) == (JobStatus.RUNNING, "102")
    assert low.sched_reason == "Preempted" and f"#{high.pk}" in low.status_detail
    resumed = _audits("job.resume", low)
    assert resumed == [{"from_round": 2, "earlier_run": "101", "preempted_for": high.pk}]

    # accounting recorded the stopped run's usage (rounds 1–3) as run 1 before round 3 went
    usage = UsageRecord.objects.filter(job=low)
    assert {(u.run, u.flower_run_id, u.rounds) for u in usage} == {(1, "101", 3)}
    assert usage.count() == 2 and all(u.ended_at is not None for u in usage)

    # while the high job runs, the low job waits, still shown as preempted
    low = reconcile(low)
    assert (low.status, low.sched_reason) == (JobStatus.QUEUED, "Preempted")
    assert "resumes from its round-2 checkpoint" in low.status_detail

    # the high job ends: the low job starts again from its checkpoint, with the same id
    assert _complete(high, fake, reconcile).status == JobStatus.COMPLETED
    low = reconcile(low)
    assert (low.status, low.flower_run_id) == (JobStatus.RUNNING, "103")
    assert fake.submitted[-1]["job-id"] == low.pk
    assert fake.submitted[-1]["resume-round"] == 2
    assert (low.preempted_by_id, low.sched_reason) == (None, "")
    assert fake.stopped == ["101"]  # nothing else was stopped


def test_preempted_job_waits_for_its_preemptor_even_when_it_ranks_higher(
    world, fake, launch, reconcile
):
    """The preemptor's project used 64 core-hours an hour ago, so fair share (weight 10000)
    ranks the preempted job above it despite QoS (weight 2000): without the hold, the freed
    slots would go back to the preempted job and the high-QoS job would preempt it again."""
    busy = ProjectFactory()
    pi = ProjectMemberFactory(project=busy, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    for v in world["versions"]:
        GrantFactory(project=busy, dataset=v.dataset)
    past = BillingJobFactory(
        project=busy,
        started_at=timezone.now() - timedelta(hours=2),
        finished_at=timezone.now() - timedelta(hours=1),
    )
    JobSite.objects.create(
        job=past,
        site=world["versions"][0].dataset.site,
        dataset_version=world["versions"][0],
        cores=64,
    )
    low = launch(world, schedule=LOW)
    high = launch({**world, "project": busy, "pi": pi}, schedule=HIGH)
    assert fake.stopped == ["101"]
    fair = fairshare_factors(admission.snapshot_build().accounts, {})
    assert 10000 * (fair[world["project"].slug] - fair[busy.slug]) > 2000  # it ranks higher

    low = reconcile(low)  # the run stopped: the pass of its own launch task leaves it out
    high.refresh_from_db()
    assert (low.status, high.status) == (JobStatus.QUEUED, JobStatus.RUNNING)
    low = reconcile(low)  # the preemptor runs: the preempted job is in the passes again
    assert (low.status, low.sched_reason) == (JobStatus.QUEUED, "Preempted")
    assert fake.stopped == ["101"] and len(fake.submitted) == 2
    # waiting is not usage: five hours on, its project's fair-share usage has not grown
    later = admission.snapshot_build(now=timezone.now() + timedelta(hours=5))
    assert later.accounts[world["project"].slug].usage == pytest.approx(0.0, abs=0.01)


def test_non_preemptible_job_is_never_stopped(world, fake, launch, reconcile):
    low = launch(world, schedule={"qos": "low", "preemptible": False})
    high = launch(world, schedule=HIGH)
    high = reconcile(high)
    low.refresh_from_db()
    assert fake.stopped == []
    assert not AuditEvent.objects.filter(action="job.preempt").exists()
    assert low.status == JobStatus.RUNNING and low.preempt_requested_at is None
    assert (high.status, high.sched_reason) == (JobStatus.QUEUED, "Resources")


def test_preempted_job_without_a_checkpoint_resumes_from_round_zero(world, fake, launch, reconcile):
    low = launch(world, schedule=LOW, num_rounds=4)
    _rounds(world, low, (1,))  # no checkpoint written yet
    launch(world, schedule=HIGH)

    low = reconcile(low)

    assert (low.status, low.resume_round, low.earlier_runs) == (JobStatus.QUEUED, 0, ["101"])
    assert not RoundMetric.objects.filter(job=low).exists()
    assert {js.status for js in low.sites.all()} == {JobSiteStatus.PENDING}
    assert "resume from round 0" in low.status_detail
    assert UsageRecord.objects.filter(job=low, run=1, rounds=1).count() == 2


def test_one_blocked_job_preempts_once_across_passes_and_task_retries(
    world, fake, launch, reconcile
):
    ComputePool.objects.filter(site__in=[v.dataset.site for v in world["versions"]]).update(slots=2)
    first = launch(world, schedule=LOW)
    second = launch(world, schedule=LOW)
    assert {first.flower_run_id, second.flower_run_id} == {"101", "102"}

    high = launch(world, schedule=HIGH)  # needs one slot of the two: one job is enough
    services.job_launch(job_id=high.pk)  # a second delivery of the task
    high = reconcile(high)  # the periodic pass (the stopped run not seen yet: same job)

    assert len(fake.stopped) == 1
    assert AuditEvent.objects.filter(action="job.preempt").count() == 1
    preempted = FederatedJob.objects.get(preempted_by=high)
    spared = first if preempted.pk == second.pk else second
    spared.refresh_from_db()
    assert spared.status == JobStatus.RUNNING and spared.preempt_requested_at is None

    preempted = reconcile(preempted)
    high.refresh_from_db()
    assert preempted.status == JobStatus.QUEUED
    assert high.status == JobStatus.RUNNING
    assert len(fake.stopped) == 1


def test_a_stop_that_never_reached_the_superlink_is_sent_by_the_reconcile(
    world, fake, launch, reconcile
):
    """The worker recorded the preemption, then the stop failed (the SuperLink away, or the
    worker killed before sending it): the run still runs, and the next reconcile stops it."""
    low = launch(world, schedule=LOW)
    fake.stop_fails = 1
    high = launch(world, schedule=HIGH)
    low.refresh_from_db()
    assert low.preempt_requested_at is not None and fake.stopped == []
    assert fake.by_id["101"].status == "running"

    low = reconcile(low)  # sees the run still running: stops it
    assert fake.stopped == ["101"] and low.status == JobStatus.RUNNING
    low = reconcile(low)  # sees it stopped: queued again
    assert low.status == JobStatus.QUEUED
    high.refresh_from_db()
    assert high.status == JobStatus.RUNNING


def test_a_run_that_completed_on_its_own_meanwhile_ends_the_job_completed(
    world, fake, launch, reconcile
):
    low = launch(world, schedule=LOW)
    fake.stop_fails = 1  # the stop did not land before the run completed
    high = launch(world, schedule=HIGH)

    low = _complete(low, fake, reconcile)

    assert low.status == JobStatus.COMPLETED and low.preempt_requested_at is None
    assert not _audits("job.resume", low)
    high = reconcile(high)
    assert high.status == JobStatus.RUNNING


def test_the_stopped_run_is_requeued_once(world, fake, launch, reconcile):
    low = launch(world, schedule=LOW, num_rounds=4)
    _rounds(world, low, (1, 2))
    _checkpoint(low, 2)
    launch(world, schedule=HIGH)
    stopped = superlink.RunStatus("101", "finished", "stopped", "", {})

    services.job_reconcile(job_id=low.pk, run=stopped)
    services.job_reconcile(job_id=low.pk, run=stopped)  # a second delivery of the same end

    low.refresh_from_db()
    assert (low.status, low.earlier_runs) == (JobStatus.QUEUED, ["101"])
    assert len(_audits("job.resume", low)) == 1
    assert len(_audits("accounting.reopen", low)) == 1
    assert UsageRecord.objects.filter(job=low).count() == 2  # one per site, run 1


def test_users_stop_of_a_job_being_preempted_ends_it_stopped(world, fake, launch, reconcile):
    low = launch(world, schedule=LOW)
    fake.stop_fails = 1
    launch(world, schedule=HIGH)

    services.job_stop(by=world["pi"], job_id=low.pk)
    low = reconcile(low)

    assert low.status == JobStatus.STOPPED and not _audits("job.resume", low)


def test_resume_refused_ends_the_preempted_job_failed_with_the_reason(
    world, fake, launch, reconcile, monkeypatch
):
    low = launch(world, schedule=LOW)
    launch(world, schedule=HIGH)

    def refuse(job, rnd):
        raise services.JobError("resuming trains 1 round(s) again, a further release")

    monkeypatch.setattr(services, "_resume_privacy_charge", refuse)
    low = reconcile(low)

    assert low.status == JobStatus.FAILED and low.flower_run_id == "101"
    assert "could not be queued again: resuming trains 1 round(s)" in low.status_detail
    assert low.preempt_requested_at is None and not _audits("job.resume", low)


def test_preempted_job_shows_its_reason_on_its_page_and_the_queue_page(
    world, fake, launch, reconcile, client
):
    low = launch(world, schedule=LOW, num_rounds=4)
    _rounds(world, low, (1,))
    _checkpoint(low, 1)
    high = launch(world, schedule=HIGH)
    client.force_login(world["pi"])
    page = client.get(reverse("federation:job_detail", args=[low.pk])).content.decode()
    assert "Preempted" in page and f"job #{high.pk}</a>: its run is being stopped" in page

    low = reconcile(low)
    page = client.get(reverse("federation:job_detail", args=[low.pk])).content.decode()
    assert "resumes from its round-1 checkpoint" in page
    assert '<span class="badge text-bg-warning">Preempted</span>' in page
    pool = low.sites.first().site.pools.get()
    admin = MembershipFactory(institution=pool.site.institution, role=Role.INSTITUTION_ADMIN).user
    client.force_login(admin)
    queue = client.get(reverse("federation:pool_queue", args=[pool.pk])).content.decode()
    assert "Preempted" in queue and f"preempted for job #{high.pk}" in queue.lower()


DP = {"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1e-5}


def test_preempted_dp_job_is_charged_once_for_the_rounds_it_trains_again(
    world, fake, launch, reconcile
):
    """As a resumed job (``job_resume``): round 3, released by the stopped run, is trained again
    after the round-2 checkpoint — one more round of ε, once, however often the end is seen."""
    import json

    from federation import privacy, privacy_budget
    from portal.ledger.models import LedgerEntry

    low = launch(world, schedule=LOW, num_rounds=4)
    before = privacy_budget.job_epsilon(DP, num_rounds=4, sites=2)
    FederatedJob.objects.filter(pk=low.pk).update(privacy=DP, epsilon=before)
    _rounds(world, low, (1, 2, 3))
    _checkpoint(low, 2)
    launch(world, schedule=HIGH)

    low = reconcile(low)
    stopped = superlink.RunStatus("101", "finished", "stopped", "", {})
    services.job_reconcile(job_id=low.pk, run=stopped)  # the same end seen again

    low.refresh_from_db()
    again = privacy.epsilon(noise_multiplier=1.0, rounds=1, delta=1e-5)
    assert low.status == JobStatus.QUEUED
    assert low.epsilon == pytest.approx(before + again)
    leaves = [json.loads(e.data) for e in LedgerEntry.objects.filter(kind="privacy")]
    assert [(x["job"], x["rounds"], x["resumed_from_round"]) for x in leaves] == [(low.pk, 1, 2)]
