"""Celery tasks of accounting, thin and idempotent: one task per accounting step of a finished
job (usage → contribution → billing → credit, chained by ``steps.job_accounting_chain``; ADR
0015), the periodic sweep for jobs whose accounting was missed, and the closing of last months'
invoices.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import connection

from accounting.models import AccountingStep
from accounting.services import billing, steps

log = logging.getLogger(__name__)
_CLOSE_LOCK_ID = 0x494E5643  # "INVC": one closing run at a time (PostgreSQL advisory lock)
RETRY_MAX_SECONDS = 600  # the longest wait between two tries of a step


def _run_step(task, job_id: int, step: str) -> str:
    """Run ``step`` of ``job_id``; on a transient error retry with exponential backoff and full
    jitter (``FRP_ACCOUNTING_RETRY_BACKOFF`` seconds doubled per try, at most
    ``RETRY_MAX_SECONDS``), at most ``FRP_ACCOUNTING_RETRIES`` times, then record it failed."""
    try:
        return steps.job_step_run(job_id=job_id, step=step)
    except steps.TRANSIENT_ERRORS as exc:
        limit = settings.FRP_ACCOUNTING_RETRIES
        if task.request.retries >= limit:
            return steps.job_step_give_up(job_id=job_id, step=step, exc=exc)
        countdown = get_exponential_backoff_interval(
            factor=settings.FRP_ACCOUNTING_RETRY_BACKOFF,
            retries=task.request.retries,
            maximum=RETRY_MAX_SECONDS,
            full_jitter=True,
        )
        raise task.retry(exc=exc, countdown=countdown, max_retries=limit) from exc


_STEP_TASK = {
    "bind": True,
    "acks_late": True,
    "ignore_result": True,
    "soft_time_limit": 240,
    "time_limit": 300,
}


@shared_task(name=steps.STEP_TASKS[AccountingStep.USAGE], **_STEP_TASK)
def job_usage_task(self, job_id: int) -> str:
    """Step 1: the job's usage records (``usage_record_job``). Returns the step's status."""
    return _run_step(self, job_id, AccountingStep.USAGE)


@shared_task(name=steps.STEP_TASKS[AccountingStep.CONTRIBUTION], **_STEP_TASK)
def job_contribution_task(self, job_id: int) -> str:
    """Step 2: the job's contribution scores (``contribution_score_job``)."""
    return _run_step(self, job_id, AccountingStep.CONTRIBUTION)


@shared_task(name=steps.STEP_TASKS[AccountingStep.BILLING], **_STEP_TASK)
def job_billing_task(self, job_id: int) -> str:
    """Step 3: the job's billing entries (``job_bill``)."""
    return _run_step(self, job_id, AccountingStep.BILLING)


@shared_task(name=steps.STEP_TASKS[AccountingStep.CREDIT], **_STEP_TASK)
def job_credit_task(self, job_id: int) -> str:
    """Step 4: the job's credit statement draft (``credit_statement_draft``)."""
    return _run_step(self, job_id, AccountingStep.CREDIT)


@shared_task(name="accounting.job_accounting_sweep", acks_late=True, ignore_result=True)
def job_accounting_sweep_task() -> int:
    """Periodic: queue the accounting of finished jobs that were missed (never started, or a
    step left pending), one bounded batch under a lock; returns how many jobs were queued."""
    return len(steps.job_accounting_sweep())


@shared_task(name="accounting.invoice_close", acks_late=True, ignore_result=True)
def invoice_close_task() -> int:
    """Periodic: close every open invoice of a month before the current one; returns how many
    were closed (0 when another run holds the lock, or nothing is left to close)."""
    locked = connection.vendor == "postgresql"
    if locked:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [_CLOSE_LOCK_ID])
            if not cursor.fetchone()[0]:
                log.info("invoice_close: another run is closing invoices")
                return 0
    try:
        closed = billing.invoice_close()  # one transaction per invoice
    finally:
        if locked:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_CLOSE_LOCK_ID])
    if closed:
        log.info("invoice_close: closed %d invoice(s)", len(closed))
    return len(closed)
