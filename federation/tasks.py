"""Celery tasks of the federation: thin, idempotent, taking primary keys (services check state)."""

from __future__ import annotations

from celery import shared_task

from federation import services

RECONCILE_BATCH = 50


@shared_task(name=services.JOB_LAUNCH_TASK, acks_late=True)
def job_launch_task(job_id: int) -> None:
    """Admit and submit one queued job (no-op unless it is QUEUED)."""
    services.job_launch(job_id=job_id)


@shared_task(name="federation.job_reconcile_all", acks_late=True, ignore_result=True)
def job_reconcile_all_task() -> None:
    """Periodic: reconcile up to ``RECONCILE_BATCH`` active jobs, oldest first, with one Control
    API listing of the SuperLink's newest runs (``services.jobs_reconcile``)."""
    services.jobs_reconcile(batch=RECONCILE_BATCH)
