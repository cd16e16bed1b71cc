"""Celery tasks of accounting, thin and idempotent: account for a finished job (usage →
contribution → bill → credit) and close last months' invoices.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import connection

from accounting.services import billing
from accounting.services.billing import job_bill
from accounting.services.contribution import contribution_score_job
from accounting.services.credit import credit_statement_draft
from accounting.services.usage import usage_record_job

log = logging.getLogger(__name__)
_CLOSE_LOCK_ID = 0x494E5643  # "INVC": one closing run at a time (PostgreSQL advisory lock)


@shared_task(
    name="accounting.job_account",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(Exception,),
    retry_backoff=5,
    max_retries=5,
    soft_time_limit=240,
    time_limit=300,
)
def job_account_task(job_id: int) -> dict:
    """After a job ends: its usage records, contribution scores, billing entries and credit draft.

    Each step is an idempotent service in its own transaction, so a redelivery or a retry after a
    crash part-way finishes the work without doubling anything. Billing and credit apply only to
    a completed job (the services check). Returns how many rows each step created.
    """
    from federation.models import FederatedJob, JobStatus

    job = FederatedJob.objects.filter(pk=job_id).first()
    if job is None or not job.is_terminal:
        return {}
    done = {
        "usage": len(usage_record_job(job=job)),
        "contribution": len(contribution_score_job(job=job)),
        "billing": len(job_bill(job=job)),
    }
    if job.status == JobStatus.COMPLETED:
        credit_statement_draft(job=job)
    log.info("accounted for job %s: %s", job_id, done)
    return done


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
