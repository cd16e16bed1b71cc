"""Accounting of a finished job in steps (``accounting.services.steps``, ``accounting.tasks``).

The jobs come from ``steps_world`` (real callbacks, real reconcile); expected amounts are its
hand computations. Deterministic failures are real bad figures a ServerApp could have posted
(a coalition utility missing, a negative byte count); transient ones are real: the step's
database session is ended by the server (``pg_terminate_backend``) while the step waits for a lock.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.utils import timezone

from accounting.models import (
    BillingEntry,
    ContributionScore,
    CreditStatement,
    JobAccountingStep,
    StepStatus,
    UsageRecord,
)
from accounting.services import steps
from accounting.tasks import job_accounting_sweep_task, job_usage_task
from federation.models import FederatedJob, JobStatus
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent
from tests.accounting.steps_world import (
    BROKEN,
    FULL,
    HAND_COMPUTE,
    HAND_DATA,
    build_steps_world,
    hand_off_lost,
)

DONE, FAILED, PARTIAL, BLOCKED, PENDING = (
    StepStatus.DONE,
    StepStatus.FAILED,
    StepStatus.PARTIAL,
    StepStatus.BLOCKED,
    StepStatus.PENDING,
)


def _states(job) -> dict[str, str]:
    return dict(JobAccountingStep.objects.filter(job=job).values_list("step", "status"))


def _step(job, step) -> JobAccountingStep:
    return JobAccountingStep.objects.get(job=job, step=step)


def _entries(job) -> dict[tuple[str, str], object]:
    return {(e.site.slug, e.kind): e.amount for e in BillingEntry.objects.filter(job=job)}


def _ledger(job) -> Counter:
    kinds = Counter()
    for entry in LedgerEntry.objects.all():
        if json.loads(entry.data).get("job") == job.pk:
            kinds[entry.kind] += 1
    return kinds


def _institution_shares(job) -> dict[str, float | None]:
    statement = CreditStatement.objects.get(job=job)
    return {c.name: c.share for c in statement.contributors.filter(kind="institution")}


def _account(job) -> None:
    """Run the job's chain in-process (eager): what the worker does after the hand-off."""
    steps.job_accounting_chain(job.pk).apply()


@pytest.fixture
def world(db):
    return build_steps_world()


# ---------------------------------------------------------------------------------------------
# The graph
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "billing", "credit"),
    [
        (JobStatus.COMPLETED, (("usage",), ("contribution",)), ((), ("contribution",))),
        (JobStatus.FAILED, (("usage",), ()), ((), ())),
        (JobStatus.STOPPED, (("usage",), ()), ((), ())),
    ],
)
def test_step_needs_billing_needs_usage_and_data_credit_needs_contribution(status, billing, credit):
    job = FederatedJob(status=status)
    assert steps.step_needs("usage", job) == ((), ())
    assert steps.step_needs("contribution", job) == ((), ())
    assert steps.step_needs("billing", job) == billing
    assert steps.step_needs("credit", job) == credit


# ---------------------------------------------------------------------------------------------
# The whole chain
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_chain_accounts_a_completed_job_in_four_steps(world, eager_celery):
    job = world.job()

    _account(job)

    assert _states(job) == dict.fromkeys(("usage", "contribution", "billing", "credit"), DONE)
    assert {u.site.slug: u.wall_seconds for u in UsageRecord.objects.filter(job=job)} == {
        "s0": 3600.0,
        "s1": 7200.0,
    }
    assert _entries(job) == HAND_COMPUTE | HAND_DATA
    shares = _institution_shares(job)
    assert sorted(shares.values()) == pytest.approx([1 / 3, 2 / 3])
    assert _step(job, "billing").detail == "8 billing entries"
    assert all(s.attempts == 1 and s.error == "" for s in JobAccountingStep.objects.filter(job=job))


@pytest.mark.django_db
def test_second_delivery_of_every_step_writes_nothing(world, eager_celery):
    job = world.job()
    _account(job)
    before = (_ledger(job), AuditEvent.objects.count(), list(_states(job).items()))

    _account(job)
    for task in ("usage", "contribution", "billing", "credit"):
        steps.job_step_run(job_id=job.pk, step=task)

    assert (_ledger(job), AuditEvent.objects.count(), list(_states(job).items())) == before
    assert all(s.attempts == 1 for s in JobAccountingStep.objects.filter(job=job))


@pytest.mark.django_db
def test_finished_job_is_handed_to_the_chain_on_commit(
    world, eager_celery, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = world.job()
    assert _states(job) == {}  # nothing is written in the federation's transaction

    for callback in callbacks:
        callback()

    assert _states(job) == dict.fromkeys(("usage", "contribution", "billing", "credit"), DONE)


# ---------------------------------------------------------------------------------------------
# Deterministic failures: recorded, the rest goes on, the retry completes it
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_contribution_failure_keeps_usage_bills_compute_and_drafts_credit(world, eager_celery):
    job = world.job(utilities=BROKEN)

    _account(job)

    assert _states(job) == {
        "usage": DONE,
        "contribution": FAILED,
        "billing": PARTIAL,
        "credit": PARTIAL,
    }
    failed = _step(job, "contribution")
    assert failed.error == "no utility for coalition {1} was reported"
    assert failed.attempts == 1
    assert UsageRecord.objects.filter(job=job).count() == 2
    assert not ContributionScore.objects.filter(job=job).exists()
    assert _entries(job) == HAND_COMPUTE  # compute charges and credits; no data lines
    assert "data charges and credits wait for the contribution step" in _step(job, "billing").detail
    assert set(_institution_shares(job).values()) == {None}  # drafted, shares not measured
    event = AuditEvent.objects.get(action="accounting.step_fail")
    assert event.target_id == str(job.pk)
    assert event.data == {"step": "contribution", "reason": failed.error}


@pytest.mark.django_db
def test_retry_after_mending_completes_the_job_without_doubling(
    world, eager_celery, django_capture_on_commit_callbacks
):
    job = world.job(utilities=BROKEN)
    _account(job)
    usage_leaves = _ledger(job)["usage"]
    # The operator mends the cause: the missing utility is restored from the ServerApp's log.
    FederatedJob.objects.filter(pk=job.pk).update(
        final_metrics={
            **job.final_metrics,
            "contribution": {**job.final_metrics["contribution"], "utilities": {"0": FULL}},
        }
    )

    with django_capture_on_commit_callbacks(execute=True):
        queued = steps.job_accounting_retry(by=world.admins["s1"], job=job)

    assert queued == ["contribution", "billing", "credit"]
    assert _states(job) == dict.fromkeys(("usage", "contribution", "billing", "credit"), DONE)
    assert _entries(job) == HAND_COMPUTE | HAND_DATA
    assert sorted(_institution_shares(job).values()) == pytest.approx([1 / 3, 2 / 3])
    ledger = _ledger(job)
    assert ledger["usage"] == usage_leaves == 2
    assert ledger["charge"] + ledger["credit"] == 8  # each entry once
    attempts = {s.step: s.attempts for s in JobAccountingStep.objects.filter(job=job)}
    assert attempts == {"usage": 1, "contribution": 2, "billing": 2, "credit": 2}
    retry = AuditEvent.objects.get(action="accounting.retry")
    assert retry.actor == world.admins["s1"]
    assert retry.data["steps"]["contribution"] == {
        "status": "failed",
        "reason": "no utility for coalition {1} was reported",
    }


@pytest.mark.django_db
def test_usage_failure_blocks_billing_and_lets_contribution_and_credit_go_on(
    world, eager_celery, django_capture_on_commit_callbacks
):
    job = world.job()
    metrics = job.final_metrics
    metrics["contribution"]["sites"] = {"s0": {"bytes_received": -(10**6)}}  # corrupt
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics=metrics)

    _account(job)

    assert _states(job) == {
        "usage": FAILED,
        "contribution": DONE,
        "billing": BLOCKED,
        "credit": DONE,
    }
    assert _step(job, "usage").error == (
        'IntegrityError: new row for relation "accounting_usagerecord" violates check constraint '
        '"accounting_usagerecord_bytes_received_check"'
    )
    assert _step(job, "billing").detail == "not run: it needs the usage step"
    assert _step(job, "billing").attempts == 0
    assert not BillingEntry.objects.filter(job=job).exists()
    assert not UsageRecord.objects.filter(job=job).exists()  # rolled back whole

    metrics["contribution"]["sites"] = {}
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics=metrics)
    with django_capture_on_commit_callbacks(execute=True):
        assert steps.job_accounting_retry(by=world.admins["project"], job=job) == [
            "usage",
            "billing",
        ]
    assert _states(job) == dict.fromkeys(("usage", "contribution", "billing", "credit"), DONE)
    assert _entries(job) == HAND_COMPUTE | HAND_DATA


@pytest.mark.django_db
@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.STOPPED])
def test_failed_job_billing_does_not_wait_for_contribution(world, eager_celery, status):
    job = world.job(utilities=BROKEN, status=status)
    assert job.status == status

    _account(job)

    states = _states(job)
    assert states["contribution"] == FAILED
    assert states["billing"] == DONE  # no data lines for a failed job (ADR 0014): nothing waits
    assert states["credit"] == DONE
    assert _step(job, "credit").detail == f"no credit statement: the job {status}"
    assert not CreditStatement.objects.filter(job=job).exists()
    assert not any(kind.startswith("data") for _, kind in _entries(job))


@pytest.mark.django_db
def test_retry_refused_to_others_and_when_nothing_is_left(
    world, eager_celery, django_capture_on_commit_callbacks
):
    job = world.job(utilities=BROKEN)
    _account(job)

    for user in (world.pi, world.admins["other"]):
        with pytest.raises(PermissionDenied):
            steps.job_accounting_retry(by=user, job=job)
    assert _step(job, "contribution").status == FAILED

    good = world.job()
    _account(good)
    with pytest.raises(steps.AccountingError, match="nothing to retry"):
        steps.job_accounting_retry(by=world.admins["s0"], job=good)


@pytest.mark.django_db
def test_retry_of_a_running_job_refused(world):
    job = world.job()
    FederatedJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    job.refresh_from_db()

    with pytest.raises(steps.AccountingError, match="has not ended"):
        steps.job_accounting_retry(by=world.admins["s0"], job=job)
    assert _states(job) == {}


def test_failure_reason_is_readable():
    from celery.exceptions import SoftTimeLimitExceeded

    from accounting.services.contribution import ContributionError

    assert steps.failure_reason(ContributionError("no  utility\nfor x")) == "no utility for x"
    assert steps.failure_reason(KeyError("players")) == "KeyError: 'players'"
    assert steps.failure_reason(RuntimeError()) == "RuntimeError"
    assert steps.failure_reason(SoftTimeLimitExceeded()) == "the step ran past its time limit"
    assert len(steps.failure_reason(ValueError("x" * 5000))) == steps.REASON_MAX


# ---------------------------------------------------------------------------------------------
# Transient failures: retried (with a cap)
# ---------------------------------------------------------------------------------------------


def _in_thread(target, *args):
    errors: list[BaseException] = []

    def run():
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 — reported to the test below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _end_the_session_waiting_for(job_pk: int, holding: threading.Event, release: threading.Event):
    """Hold the job's row lock; once another session waits for it, end that session on the
    server (as a database restart or a network cut does), then let go."""

    def hold():
        with transaction.atomic():
            FederatedJob.objects.select_for_update().get(pk=job_pk)
            holding.set()
            with connection.cursor() as cursor:
                for _ in range(600):  # a generous bound: 60 s
                    cursor.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                    row = cursor.fetchone()
                    if row:
                        cursor.execute("SELECT pg_terminate_backend(%s)", [row[0]])
                        break
                    release.wait(0.1)
                else:
                    raise AssertionError("no session waited for the job's lock")

    return _in_thread(hold)


@pytest.mark.django_db(transaction=True)
def test_transient_database_error_is_retried_and_succeeds(eager_celery, settings):
    settings.FRP_ACCOUNTING_RETRY_BACKOFF = 0  # no wait (eager retries run at once anyway)
    with hand_off_lost():
        job = build_steps_world().job()
    steps._open([job.pk])  # the steps exist (the hand-off's first step or the sweep opened them)
    holding, release = threading.Event(), threading.Event()
    thread, errors = _end_the_session_waiting_for(job.pk, holding, release)
    assert holding.wait(30)

    status = job_usage_task.apply(args=(job.pk,), throw=False).get()  # retried in place

    thread.join(30)
    assert errors == []
    assert status == DONE
    row = _step(job, "usage")
    assert (row.status, row.attempts) == (DONE, 2)  # the lost session, then the retry
    assert row.error == ""
    assert UsageRecord.objects.filter(job=job).count() == 2
    assert _ledger(job)["usage"] == 2


@pytest.mark.django_db(transaction=True)
def test_transient_errors_past_the_cap_fail_the_step_and_the_chain_goes_on(eager_celery, settings):
    settings.FRP_ACCOUNTING_RETRIES = 0
    with hand_off_lost():
        job = build_steps_world().job()
    steps._open([job.pk])  # the steps exist (the hand-off's first step or the sweep opened them)
    holding, release = threading.Event(), threading.Event()
    thread, errors = _end_the_session_waiting_for(job.pk, holding, release)
    assert holding.wait(30)

    _account(job)

    thread.join(30)
    assert errors == []
    assert _states(job) == {
        "usage": FAILED,
        "contribution": DONE,
        "billing": BLOCKED,
        "credit": DONE,
    }
    reason = _step(job, "usage").error
    assert reason.startswith("gave up after 1 tries: OperationalError: terminating connection")


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------


def _ended(job, *, ago: timedelta) -> None:
    FederatedJob.objects.filter(pk=job.pk).update(finished_at=timezone.now() - ago)


@pytest.mark.django_db
def test_sweep_picks_jobs_never_accounted_or_left_pending_only(world, eager_celery):
    hour = timedelta(hours=1)
    with hand_off_lost():
        lost = world.job()  # never accounted
        recent = world.job()  # ended within the grace period: its hand-off may be on its way
        accounted = world.job()
        failed = world.job(utilities=BROKEN)
        stalled = world.job()
        running = world.job()
    _account(accounted)
    _account(failed)
    _account(stalled)
    JobAccountingStep.objects.filter(job=stalled, step="credit").update(
        status=PENDING, updated_at=timezone.now() - 2 * hour
    )
    FederatedJob.objects.filter(pk=running.pk).update(status=JobStatus.RUNNING)
    for job in (lost, accounted, failed, stalled, running):
        _ended(job, ago=2 * hour)
    cutoff = timezone.now() - hour

    assert steps.jobs_to_sweep(cutoff=cutoff) == [lost.pk, stalled.pk]
    assert steps.jobs_to_sweep(cutoff=cutoff, batch=1) == [lost.pk]  # oldest first
    assert recent.pk not in steps.jobs_to_sweep(cutoff=timezone.now() - timedelta(minutes=5))


@pytest.mark.django_db
def test_sweep_opens_queues_on_commit_and_leaves_them_for_the_grace_period(
    world, django_capture_on_commit_callbacks, settings
):
    settings.FRP_ACCOUNTING_SWEEP_GRACE_SECONDS = 600
    with hand_off_lost():
        lost = world.job()
    _ended(lost, ago=timedelta(hours=1))

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert steps.job_accounting_sweep() == [lost.pk]
    assert len(callbacks) == 1  # the job's chain, sent once the sweep commits
    assert _states(lost) == dict.fromkeys(("usage", "contribution", "billing", "credit"), PENDING)
    # The chain is on its way: the next sweeps leave the job alone for the grace period.
    assert steps.job_accounting_sweep() == []
    later = timezone.now() + timedelta(seconds=601)
    with django_capture_on_commit_callbacks(execute=False):
        assert steps.job_accounting_sweep(now=later) == [lost.pk]


@pytest.mark.django_db(transaction=True)
def test_sweep_waits_while_another_sweep_holds_the_lock(settings):
    settings.FRP_ACCOUNTING_SWEEP_GRACE_SECONDS = 0
    with hand_off_lost():
        lost = build_steps_world().job()
    holding, release = threading.Event(), threading.Event()

    def other_sweep():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [steps._SWEEP_LOCK_ID])
            holding.set()
            release.wait(30)

    thread, errors = _in_thread(other_sweep)
    assert holding.wait(30)
    try:
        assert steps.job_accounting_sweep() == []
        assert _states(lost) == {}
    finally:
        release.set()
        thread.join(30)
    assert errors == []


def _together(count: int, target) -> list[BaseException]:
    """Run ``target`` in ``count`` threads released at the same moment; return their errors."""
    barrier = threading.Barrier(count)

    def run():
        barrier.wait(30)
        target()

    threads = [_in_thread(run) for _ in range(count)]
    errors: list[BaseException] = []
    for thread, errs in threads:
        thread.join(120)
        assert not thread.is_alive()
        errors += errs
    return errors


def _accounted_once(job) -> None:
    assert _states(job) == dict.fromkeys(("usage", "contribution", "billing", "credit"), DONE)
    assert all(s.attempts == 1 for s in JobAccountingStep.objects.filter(job=job))
    assert UsageRecord.objects.filter(job=job).count() == 2
    assert ContributionScore.objects.filter(job=job).count() == 4  # exact + loo, two sites
    assert _entries(job) == HAND_COMPUTE | HAND_DATA
    assert _ledger(job) == Counter({"usage": 2, "contribution": 4, "charge": 4, "credit": 4})
    assert CreditStatement.objects.filter(job=job).count() == 1
    actions = Counter(
        AuditEvent.objects.filter(target_id=str(job.pk)).values_list("action", flat=True)
    )
    assert actions["job.bill"] == 1 and actions["contribution.score"] == 1


@pytest.mark.django_db(transaction=True)
def test_sweep_run_twice_concurrently_accounts_a_lost_job_once(eager_celery, settings):
    settings.FRP_ACCOUNTING_SWEEP_GRACE_SECONDS = 0
    with hand_off_lost():
        lost = build_steps_world().job()
    assert _states(lost) == {}

    errors = _together(2, lambda: job_accounting_sweep_task.apply().get())

    assert errors == []
    _accounted_once(lost)
    assert job_accounting_sweep_task.apply().get() == 0  # nothing left


@pytest.mark.django_db(transaction=True)
def test_two_chains_for_one_job_at_once_write_everything_once(eager_celery):
    with hand_off_lost():
        job = build_steps_world().job()

    errors = _together(3, lambda: _account(job))

    assert errors == []
    _accounted_once(job)


def test_step_tasks_have_stable_names():
    from accounting import tasks

    assert tasks.job_usage_task.name == "accounting.job_usage"
    assert tasks.job_contribution_task.name == "accounting.job_contribution"
    assert tasks.job_billing_task.name == "accounting.job_billing"
    assert tasks.job_credit_task.name == "accounting.job_credit"
    assert tasks.job_accounting_sweep_task.name == "accounting.job_accounting_sweep"
    from django.conf import settings

    entry = settings.CELERY_BEAT_SCHEDULE["accounting-sweep"]
    assert entry["task"] == "accounting.job_accounting_sweep"
