"""Accounting of a finished job in four steps — usage, contribution, billing, credit (ADR 0015).

Each step is a Celery task (``accounting.tasks``) that calls :func:`job_step_run`; the four run
as one chain in that order (:func:`job_accounting_chain`). The state of each step is a
``JobAccountingStep`` row, written in the same transaction as the step's own records, so a step
is ``done`` exactly when what it wrote is committed. A second delivery of a step finds it done and
writes nothing; the services under it are idempotent too (their unique constraints), so two
chains for one job at once write everything once. A step runs under the job's row lock, then its
own row's (every writer of a job's accounting takes them in that order).

A FAILED job resumed from its round checkpoint (``federation.signals.job_resumed``) is reopened
by :func:`job_accounting_reopen` (ADR 0028): its failed run's usage is recorded before the resume
deletes the metering of the rounds after the checkpoint, and its steps go back to ``pending``;
they wait while the job runs again (a step of a job that has not ended stays pending) and run at
its next end, each adding only what is new: the new run's usage record, the billing lines of the
usage not billed yet (lines already issued are never changed), and — for a COMPLETED end — the
contribution scores and the credit statement.

What a step needs (the dependency graph):

* **usage** — nothing (the sites' metering, the posted evaluation work);
* **contribution** — nothing (the coalition utilities the ServerApp posted);
* **billing** — usage, always: compute lines are priced from usage records, so without them the
  step is ``blocked``. Contribution only for a COMPLETED job's data charges and credits (a failed
  or stopped job has none, ADR 0014): when the contribution step failed, billing still writes the
  compute charges and credits and ends ``partial``; the data lines follow when contribution is
  mended and retried;
* **credit** — a COMPLETED job only (others get no statement, ADR 0014); contribution for the
  institutions' shares: when it failed, the draft is stored without shares (``partial``) and
  refreshed once contribution is mended.

Errors: a *transient* one (:data:`TRANSIENT_ERRORS`: the database or the broker out of reach, a
lost connection, a deadlock) rolls the step back, counts an attempt and is re-raised for the task
to retry with backoff; when the retries are spent the step fails (:func:`job_step_give_up`). Any
other error is deterministic: the step is ``failed`` with its readable reason (and an audit
event), and the chain goes on with what does not need it. Failed, partial and blocked steps wait
for :func:`job_accounting_retry` (an admin, after mending the cause). :func:`job_accounting_sweep`
(periodic) queues finished jobs whose accounting was never started or was left pending.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import timedelta

from celery import chain, signature
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Count, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from accounting.models import AccountingStep, BillingEntry, JobAccountingStep, StepStatus
from accounting.services.billing import job_bill
from accounting.services.contribution import contribution_score_job
from accounting.services.credit import credit_statement_draft
from accounting.services.usage import run_ordinal, usage_record_job
from federation.models import FederatedJob, JobStatus
from federation.services import JobError
from portal.permissions import can
from portal.services import audit_record

log = logging.getLogger(__name__)

#: The steps in the order the chain runs them.
STEPS: tuple[str, ...] = tuple(AccountingStep.values)

#: The Celery task of each step (by name: the tasks import this module).
STEP_TASKS = {step: f"accounting.job_{step}" for step in STEPS}

#: Errors worth retrying: the database or the broker out of reach, a dropped connection, a
#: deadlock or serialization failure (PostgreSQL reports both as OperationalError).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, BrokerError)

#: Statuses that wait for an admin's retry.
WAITING = (StepStatus.FAILED, StepStatus.PARTIAL, StepStatus.BLOCKED)

#: Most jobs one sweep queues.
SWEEP_BATCH = 100
_SWEEP_LOCK_ID = 0x41434354  # "ACCT": one sweep at a time (PostgreSQL transaction advisory lock)
REASON_MAX = 2000


class AccountingError(Exception):
    """A retry that cannot be done: the job has not ended, or nothing is left to retry."""


def step_needs(step: str, job: FederatedJob) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(hard, soft)`` steps ``step`` needs for ``job`` (see the module's graph).

    A failed *hard* need blocks the step; a failed *soft* need lets it run without that input
    and end ``partial``."""
    completed = job.status == JobStatus.COMPLETED
    if step == AccountingStep.BILLING:
        return (AccountingStep.USAGE,), ((AccountingStep.CONTRIBUTION,) if completed else ())
    if step == AccountingStep.CREDIT:
        return (), ((AccountingStep.CONTRIBUTION,) if completed else ())
    return (), ()


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else (words or word + 's')}"


def _usage(job: FederatedJob, missing: list[str]) -> str:
    records = usage_record_job(job=job)
    run = run_ordinal(job)
    text = _plural(len(records), "usage record") if records else "no site metered any work"
    return text + (f" (run {run})" if run > 1 else "")


def _contribution(job: FederatedJob, missing: list[str]) -> str:
    scores = contribution_score_job(job=job)
    if not scores:
        return "no contribution was measured (the run posted no coalition utilities)"
    methods = ", ".join(sorted({str(s.method) for s in scores}))
    return f"{_plural(len(scores), 'score')} ({methods})"


def _billing(job: FederatedJob, missing: list[str]) -> str:
    job_bill(job=job)
    text = _plural(BillingEntry.objects.filter(job=job).count(), "billing entry", "billing entries")
    if missing:
        text += "; the data charges and credits wait for the contribution step"
    return text


def _credit(job: FederatedJob, missing: list[str]) -> str:
    if job.status != JobStatus.COMPLETED:
        return f"no credit statement: the job {job.get_status_display().lower()}"
    credit_statement_draft(job=job)
    if missing:
        return "drafted without contribution shares; they are added once contribution is mended"
    return "credit statement drafted"


#: What each step does: ``(job, names of the failed soft needs) -> detail``.
RUNNERS: dict[str, Callable[[FederatedJob, list[str]], str]] = {
    AccountingStep.USAGE: _usage,
    AccountingStep.CONTRIBUTION: _contribution,
    AccountingStep.BILLING: _billing,
    AccountingStep.CREDIT: _credit,
}


def failure_reason(exc: BaseException) -> str:
    """A readable one-paragraph reason for a step that failed with ``exc`` (non-empty)."""
    if isinstance(exc, SoftTimeLimitExceeded):
        text = "the step ran past its time limit"
    else:
        message = str(exc)
        if isinstance(exc, DatabaseError):  # the database's first line; its DETAIL is row dumps
            message = message.strip().splitlines()[0] if message.strip() else ""
        message = " ".join(message.split())
        known = type(exc).__module__.startswith("accounting.")
        text = message if known and message else f"{type(exc).__name__}: {message}".rstrip(": ")
    return text[:REASON_MAX]


def _open(job_ids: Iterable[int]) -> None:
    """Create the missing step rows (``pending``) of ``job_ids`` (idempotent)."""
    now = timezone.now()
    JobAccountingStep.objects.bulk_create(
        [JobAccountingStep(job_id=j, step=s, updated_at=now) for j in job_ids for s in STEPS],
        ignore_conflicts=True,
    )


def job_accounting_chain(job_id: int):
    """The Celery chain that accounts for one job: one task per step, in ``STEPS`` order."""
    return chain(*(signature(STEP_TASKS[s], args=(job_id,), immutable=True) for s in STEPS))


def job_accounting_queue_on_commit(job_ids: Iterable[int]) -> None:
    """Queue each job's chain once the caller's transaction commits. A broker that cannot be
    reached is logged and does not undo the commit (``robust``): the sweep queues the job later."""
    for job_id in job_ids:
        transaction.on_commit(job_accounting_chain(job_id).apply_async, robust=True)


def _save(row: JobAccountingStep, status: str, *, detail: str = "", error: str = "") -> None:
    row.status = status
    row.detail = detail[:300]
    row.error = error
    row.updated_at = timezone.now()
    row.save(update_fields=["status", "detail", "error", "attempts", "updated_at"])


def job_step_run(*, job_id: int, step: str) -> str:
    """Run one accounting step of a finished job once; return the step's status afterwards.

    Under a lock on the step's row: a step that is not ``pending`` is left as it is (a second
    delivery, or one waiting for a retry); a step whose needs are still pending stays pending
    (the chain running them comes back to it, else the sweep does); a failed hard need makes it
    ``blocked``; otherwise its service runs and the step ends ``done`` (or ``partial`` when a
    soft need failed), in one transaction with what it wrote. Returns ``""`` for a job that does
    not exist or has not ended (nothing is opened for it); a step of a job that has been
    reopened and is running again stays ``pending`` (its next end queues the chain again).

    A deterministic error rolls the step back and records it ``failed`` with its reason
    (``failure_reason``) and an audit event ``accounting.step_fail``; it is not raised.
    Raises a ``TRANSIENT_ERRORS`` error after counting the attempt (the caller retries).
    """
    try:
        if not JobAccountingStep.objects.filter(job_id=job_id, step=step).exists():
            job = FederatedJob.objects.filter(pk=job_id).only("status").first()
            if job is None or not job.is_terminal:
                return ""
            _open([job_id])  # the first step of a job's first chain (the hand-off, the sweep)
        with transaction.atomic():
            # The job's row first, then the step's: the order ``job_accounting_reopen`` takes
            # them in too (under ``job_resume``'s lock on the job), so no two wait on each other.
            job = (
                FederatedJob.objects.select_for_update(of=("self",))
                .select_related("project__institution")
                .get(pk=job_id)
            )
            row = JobAccountingStep.objects.select_for_update().get(job_id=job_id, step=step)
            if row.status != StepStatus.PENDING:
                return row.status
            if not job.is_terminal:  # resumed: it is accounted for when it ends again
                return StepStatus.PENDING
            states = dict(
                JobAccountingStep.objects.filter(job_id=job_id).values_list("step", "status")
            )
            hard, soft = step_needs(step, job)
            if any(
                states.get(need, StepStatus.PENDING) == StepStatus.PENDING for need in hard + soft
            ):
                return StepStatus.PENDING
            broken = [
                need for need in hard if states[need] in (StepStatus.FAILED, StepStatus.BLOCKED)
            ]
            if broken:
                _save(row, StepStatus.BLOCKED, detail=f"not run: it needs the {broken[0]} step")
                return StepStatus.BLOCKED
            missing = [
                need for need in soft if states[need] in (StepStatus.FAILED, StepStatus.BLOCKED)
            ]
            row.attempts += 1
            detail = RUNNERS[step](job, missing)
            status = StepStatus.PARTIAL if missing else StepStatus.DONE
            _save(row, status, detail=detail)
            return status
    except TRANSIENT_ERRORS as exc:
        _note_transient(job_id, step, exc)
        raise
    except Exception as exc:  # deterministic: record it, let the chain go on
        log.warning("accounting step %s of job %s failed: %s", step, job_id, exc, exc_info=True)
        _record_failure(job_id, step, failure_reason(exc))
        return StepStatus.FAILED


def _note_transient(job_id: int, step: str, exc: BaseException) -> None:
    """Count a transient failure on the step's row, best effort (the database may be away)."""
    log.warning("accounting step %s of job %s: transient error, retrying: %s", step, job_id, exc)
    try:
        with transaction.atomic():
            row = JobAccountingStep.objects.select_for_update().get(job_id=job_id, step=step)
            if row.status == StepStatus.PENDING:
                row.attempts += 1
                _save(row, StepStatus.PENDING, error=f"retrying after: {failure_reason(exc)}")
    except (JobAccountingStep.DoesNotExist, *TRANSIENT_ERRORS):  # the retry or sweep comes back
        log.info("could not note the transient error of step %s of job %s", step, job_id)


@transaction.atomic
def _record_failure(job_id: int, step: str, reason: str) -> None:
    row = JobAccountingStep.objects.select_for_update().get(job_id=job_id, step=step)
    if row.status != StepStatus.PENDING:
        return
    row.attempts += 1
    _save(row, StepStatus.FAILED, error=reason or "failed")
    job = FederatedJob.objects.select_related("project__institution").get(pk=job_id)
    audit_record(
        by=None,
        action="accounting.step_fail",
        target=job,
        institution=job.project.institution,
        step=step,
        reason=reason,
    )


def job_step_give_up(*, job_id: int, step: str, exc: BaseException) -> str:
    """Record a step whose transient errors outlasted its retries as ``failed`` ("gave up after
    N tries: …"); returns ``failed`` (or the status another run left it in). Raises a
    ``TRANSIENT_ERRORS`` error when even that cannot be written (the row stays pending and the
    sweep queues it again)."""
    row = JobAccountingStep.objects.filter(job_id=job_id, step=step).first()
    if row is None or row.status != StepStatus.PENDING:
        return row.status if row else ""
    _record_failure(job_id, step, f"gave up after {row.attempts} tries: {failure_reason(exc)}")
    return StepStatus.FAILED


def _locked_steps(job: FederatedJob) -> list[JobAccountingStep]:
    """``job``'s step rows (opened first where missing), locked for this transaction, in
    ``STEPS`` order."""
    _open([job.pk])
    return sorted(
        JobAccountingStep.objects.select_for_update().filter(job=job),
        key=lambda r: STEPS.index(r.step),
    )


def job_accounting_retry(*, by, job: FederatedJob) -> list[str]:
    """Queue the accounting of ``job`` again, for a user who mended what made a step fail.

    Every step that is not done (failed, partial, blocked, or still pending) goes back to
    ``pending`` and the job's chain is queued on commit; done steps stay done (a rerun of the
    chain skips them), so nothing is written twice. A job that was never opened for accounting
    (its hand-off was lost) is opened now. Writes the audit event ``accounting.retry`` with the
    steps and their previous reasons. Returns the steps queued again, in ``STEPS`` order.

    Raises ``PermissionDenied`` unless ``can(by, "job.retry_accounting", job)``, and
    ``AccountingError`` when the job has not ended or every step is done.
    """
    if not can(by, "job.retry_accounting", job):
        raise PermissionDenied("Only the admins of the institutions involved retry accounting.")
    with transaction.atomic():
        job = FederatedJob.objects.select_related("project__institution").get(pk=job.pk)
        if not job.is_terminal:
            raise AccountingError("The job has not ended yet: it is accounted for once it does.")
        rows = _locked_steps(job)
        again = [r for r in rows if r.status != StepStatus.DONE]
        if not again:
            raise AccountingError("Every accounting step of this job is done: nothing to retry.")
        before = {r.step: {"status": r.status, "reason": r.error} for r in again}
        for row in again:
            _save(row, StepStatus.PENDING, detail=f"queued again by {by}")
        audit_record(
            by=by,
            action="accounting.retry",
            target=job,
            institution=job.project.institution,
            steps=before,
        )
        job_accounting_queue_on_commit([job.pk])
    return [r.step for r in again]


def job_accounting_reopen(*, job: FederatedJob, from_round: int | None = None) -> list[str]:
    """Reopen the accounting of a FAILED ``job`` that is being resumed from its checkpoint (or a
    preempted one, whose run ended STOPPED, ADR 0035), so that its final end is accounted for
    too (ADR 0028); returns the steps reopened, in ``STEPS`` order.

    Called by the receiver of ``federation.signals.job_resumed`` inside ``job_resume``'s
    transaction, with the job's row locked and the job as its failed run ended — before the
    resume deletes the metering of the rounds after the checkpoint (``from_round``) and clears
    the run's end. In that transaction:

    1. the failed run's usage is recorded (``usage_record_job``: one record per site for the
       run, idempotent — a run its usage step already recorded is left as it is), so the work it
       did after the checkpoint stays metered, and billed, though the new run trains those rounds
       again;
    2. every step row (opened when missing) goes back to ``pending`` with the reason in its
       detail; attempts are kept. What the failed end wrote stays: its usage records, its billing
       lines (on their invoices, closed or not) and their ledger leaves. The steps wait while the
       job runs again and run when ``job_finished`` queues the chain at its next end;
    3. the audit event ``accounting.reopen`` (run, round, steps and their statuses before).

    Raises ``JobError`` (the resume is refused, nothing is written) when the failed run's usage
    cannot be recorded — a deterministic error: resuming would delete metering no record holds;
    an institution admin mends it and retries the job's accounting first. Transient database
    errors are raised as they are.
    """
    run = run_ordinal(job)
    try:
        records = usage_record_job(job=job)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:
        raise JobError(
            f"the usage of the failed run cannot be recorded ({failure_reason(exc)}); resuming "
            "would delete its metering: an admin must mend it and retry the job's accounting"
        ) from exc
    rows = _locked_steps(job)
    before = {r.step: r.status for r in rows}
    after = f"run {run} ended {job.status}" + (f" after round {from_round}" if from_round else "")
    for row in rows:
        _save(row, StepStatus.PENDING, detail=f"reopened: the job resumed ({after})")
    audit_record(
        by=None,
        action="accounting.reopen",
        target=job,
        institution=job.project.institution,
        run=run,
        from_round=from_round,
        usage_records=len(records),
        steps=before,
    )
    return [r.step for r in rows]


def _sweep_lock() -> bool:
    """Take the sweep's lock for this transaction (PostgreSQL); ``False`` when another sweep
    holds it. Other databases (the embedded SQLite) serialise writers themselves."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_SWEEP_LOCK_ID])
        return bool(cursor.fetchone()[0])


def jobs_to_sweep(*, cutoff, batch: int = SWEEP_BATCH) -> list[int]:
    """Ids of finished jobs (COMPLETED, FAILED, STOPPED) that ended before ``cutoff`` and either
    lack step rows (never opened, or a step added since) or have a step pending since before
    ``cutoff``; oldest first, at most ``batch``."""
    stale = Q(accounting_steps__status=StepStatus.PENDING, accounting_steps__updated_at__lt=cutoff)
    return list(
        FederatedJob.objects.filter(status__in=JobStatus.terminal())
        .filter(Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True))
        .annotate(steps=Count("accounting_steps"), stale=Count("accounting_steps", filter=stale))
        .filter(Q(steps__lt=len(STEPS)) | Q(stale__gt=0))
        .order_by("finished_at", "pk")
        .values_list("pk", flat=True)[:batch]
    )


def job_accounting_sweep(
    *, batch: int = SWEEP_BATCH, grace: timedelta | None = None, now=None
) -> list[int]:
    """Queue the accounting of finished jobs that were missed; return the ids queued.

    Picks ``jobs_to_sweep`` with ``cutoff = now − grace`` (default
    ``settings.FRP_ACCOUNTING_SWEEP_GRACE_SECONDS``, long enough for the normal hand-off and a
    step's retries to finish first), opens their missing steps, marks their pending steps as
    queued now (so the next sweep leaves them for another ``grace``), and queues each job's chain
    on commit. Steps a worker is running right now (row locked) are skipped, and so is a job
    with nothing else pending. One sweep at a time (``_sweep_lock``); a second returns ``[]``.
    """
    now = now or timezone.now()
    if grace is None:
        grace = timedelta(seconds=settings.FRP_ACCOUNTING_SWEEP_GRACE_SECONDS)
    with transaction.atomic():
        if not _sweep_lock():
            log.info("accounting sweep: another sweep is running")
            return []
        ids = jobs_to_sweep(cutoff=now - grace, batch=batch)
        if not ids:
            return []
        _open(ids)
        rows = list(
            JobAccountingStep.objects.select_for_update(skip_locked=True)
            .filter(job_id__in=ids, status=StepStatus.PENDING)
            .values_list("pk", "job_id")
        )
        JobAccountingStep.objects.filter(pk__in=[pk for pk, _ in rows]).update(updated_at=now)
        queued = sorted({job_id for _, job_id in rows})
        job_accounting_queue_on_commit(queued)
    if queued:
        log.info("accounting sweep: queued %d job(s): %s", len(queued), queued)
    return queued


__all__ = [
    "STEPS",
    "TRANSIENT_ERRORS",
    "AccountingError",
    "job_accounting_chain",
    "job_accounting_queue_on_commit",
    "job_accounting_reopen",
    "job_accounting_retry",
    "job_accounting_sweep",
    "job_step_give_up",
    "job_step_run",
    "step_needs",
]
