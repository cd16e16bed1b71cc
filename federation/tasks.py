"""Celery tasks of the federation: thin, idempotent, taking primary keys (services check state)."""

from __future__ import annotations

import logging

from celery import shared_task

from federation import services, superlink
from federation.models import FederatedJob, JobStatus

RECONCILE_BATCH = 50
log = logging.getLogger(__name__)


@shared_task(name=services.JOB_LAUNCH_TASK, acks_late=True)
def job_launch_task(job_id: int) -> None:
    """Admit and submit one queued job (no-op unless it is QUEUED)."""
    services.job_launch(job_id=job_id)


@shared_task(name="federation.job_reconcile_all", acks_late=True, ignore_result=True)
def job_reconcile_all_task() -> None:
    """Periodic: reconcile up to ``RECONCILE_BATCH`` active jobs, oldest first, reading every
    running job's status from the SuperLink with one ``flwr ls``."""
    jobs = list(
        FederatedJob.objects.filter(status__in=JobStatus.active())
        .order_by("created_at")
        .values_list("pk", "flower_run_id")[:RECONCILE_BATCH]
    )
    run_ids = [run_id for _, run_id in jobs if run_id]
    statuses = {}
    if run_ids:
        try:
            statuses = superlink.runs_status(services.superlink_connection(), run_ids)
        except superlink.SuperLinkError as exc:
            log.warning("reconcile: the SuperLink did not answer: %s", exc)
            return
    for job_id, run_id in jobs:
        services.job_reconcile(job_id=job_id, run=statuses.get(run_id))


@shared_task(
    name="federation.site_node_unregister",
    acks_late=True,
    bind=True,
    max_retries=10,
    default_retry_delay=30,
)
def site_node_unregister_task(self, site_id: int) -> None:
    """Unregister a revoked site's SuperNode keys; retried while the SuperLink does not answer
    (a no-op once none is registered)."""
    from federation import onboarding
    from portal.models import Site

    site = Site.objects.filter(pk=site_id).first()
    if site is None:
        return
    try:
        onboarding.site_node_unregister(site=site)
    except onboarding.OnboardingError as exc:
        log.warning("unregistering site %s's SuperNode failed: %s", site.slug, exc)
        raise self.retry(exc=exc) from exc
