"""Celery tasks of the federation: thin, idempotent, taking primary keys (services check state)."""

from __future__ import annotations

from celery import shared_task

from federation import services
from federation.models import FederatedJob, JobStatus

RECONCILE_BATCH = 50


@shared_task(name="federation.job_launch", acks_late=True)
def job_launch_task(job_id: int) -> None:
    """Admit and submit one queued job (no-op unless it is QUEUED)."""
    services.job_launch(job_id=job_id)


@shared_task(name="federation.job_reconcile_all", acks_late=True, ignore_result=True)
def job_reconcile_all_task() -> None:
    """Periodic: reconcile up to ``RECONCILE_BATCH`` active jobs, oldest first."""
    ids = list(
        FederatedJob.objects.filter(status__in=JobStatus.active())
        .order_by("created_at")
        .values_list("pk", flat=True)[:RECONCILE_BATCH]
    )
    for job_id in ids:
        services.job_reconcile(job_id=job_id)
