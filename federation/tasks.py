"""Celery tasks of the federation: thin, idempotent, taking primary keys (services check state)."""

from __future__ import annotations

import logging

from celery import shared_task

from federation import services, superlink

RECONCILE_BATCH = 50
log = logging.getLogger(__name__)


@shared_task(name=services.JOB_LAUNCH_TASK, acks_late=True)
def job_launch_task(job_id: int) -> None:
    """Admit and submit one queued job (no-op unless it is QUEUED)."""
    services.job_launch(job_id=job_id)


@shared_task(name="federation.job_reconcile_all", acks_late=True, ignore_result=True)
def job_reconcile_all_task() -> None:
    """Periodic: reconcile up to ``RECONCILE_BATCH`` active jobs, oldest first, with one Control
    API listing of the SuperLink's newest runs (``services.jobs_reconcile``)."""
    services.jobs_reconcile(batch=RECONCILE_BATCH)


@shared_task(name="federation.pools_refresh", acks_late=True, ignore_result=True)
def pools_refresh_task() -> None:
    """Periodic: each pool's SuperNode health from the SuperLink, capacity and health of pools
    read from a batch system (Slurm; a failed read marks the pool down with its reason), and the
    carbon forecast of pools whose source is a provider (a failing source is logged and
    skipped)."""
    from federation import carbon, pool_services
    from federation.models import ComputePool

    pool_services.pool_readings_refresh()
    try:
        pool_services.pool_health_refresh(conn=services.superlink_connection())
    except superlink.SuperLinkError as exc:
        log.warning("pools refresh: the SuperLink did not answer: %s", exc)
    for pool in ComputePool.objects.filter(carbon_source="provider").exclude(carbon_provider=""):
        try:
            pool_services.carbon_forecast_fetch(pool=pool)
        except carbon.CarbonError as exc:
            log.warning("pools refresh: carbon forecast of pool %s: %s", pool.pk, exc)


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
