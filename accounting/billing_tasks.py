"""Celery tasks of billing: close last months' invoices (periodic) and bill one job.

Thin and idempotent (the services check state first, so a second delivery changes nothing).
Autodiscovery only imports ``<app>.tasks``, so ``AccountingConfig.ready`` imports this module.
Schedule wanted (``CELERY_BEAT_SCHEDULE``, the lead's ``portal/settings.py``)::

    "accounting-invoice-close": {
        "task": "accounting.invoice_close",
        "schedule": crontab(minute=17),  # hourly: a missed run is caught up within the hour
        "options": {"expires": 3000},
    },
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import connection

from accounting.services import billing

log = logging.getLogger(__name__)
_CLOSE_LOCK_ID = 0x494E5643  # "INVC": one closing run at a time (PostgreSQL advisory lock)


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


@shared_task(name="accounting.job_bill", acks_late=True, ignore_result=True)
def job_bill_task(job_id: int) -> int:
    """Bill one job after its usage records are written; returns the entries created (0 on a
    second delivery)."""
    from federation.models import FederatedJob

    job = FederatedJob.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return len(billing.job_bill(job=job))
