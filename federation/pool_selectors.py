"""Reads of compute pools: the queue with reasons, the calendar's series and planned jobs,
recent carbon readings. Callers check ``pool.manage`` first."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from federation.models import CarbonReading, ComputePool, FederatedJob, JobStatus
from federation.scheduling import calendar

CALENDAR_DAYS = 7

#: Slurm-style reason codes and what they mean, for the queue pages.
REASONS = {
    "Resources": "The pools' cores, memory, GPUs or slots are taken until running jobs end.",
    "Priority": "Resources are held for jobs of higher priority (reserved or started first).",
    "Window": "A pool of the job is not lent at this time; it starts when the window opens.",
    "Budget": "The estimated cost exceeds the job's budget cap (the job is refused) or the "
    "project's remaining budget (it waits).",
    "NodeDown": "A pool of the job is down: its site's SuperNode is offline, or its batch "
    "system's nodes are down or drained (or could not be read).",
    "DeadlineUnreachable": "The earliest possible end is after the job's deadline.",
    "TimeShift": "Waiting for the cheapest or lowest-carbon start before the deadline.",
    "Quota": "The project's quota on a pool is in use by its other jobs.",
    "Preempted": "Stopped for a job of a higher quality of service; it resumes from its latest "
    "round checkpoint (from the start when it had none) when resources are free again.",
}


def pool_price_bands(pool: ComputePool) -> list[calendar.PriceBand]:
    """The pool's time-of-use bands as ``calendar.PriceBand`` (weekly spans in
    ``pool.time_zone``; ``price`` is the ``Decimal`` per service unit·hour), in the order the
    scheduler reads them (the first band covering an instant gives its price)."""
    return [
        calendar.PriceBand(calendar.WeeklySpan(b.weekday, b.start_minute, b.end_minute), b.price)
        for b in pool.price_bands.all()
    ]


def _jobs_at(pool: ComputePool):
    """Jobs on ``pool``: queued jobs at its site (their pool is chosen at launch among the
    site's pools) and launched jobs whose ``JobSite.pool`` is this pool (or, for a row without
    one, this pool when it is the site's first)."""
    first = ComputePool.objects.filter(site_id=pool.site_id).order_by("pk").first()
    on_pool = Q(sites__pool=pool)
    if first is not None and first.pk == pool.pk:
        on_pool |= Q(sites__site_id=pool.site_id, sites__pool__isnull=True)
    return (
        FederatedJob.objects.filter(
            Q(status=JobStatus.QUEUED, sites__site_id=pool.site_id)
            | (~Q(status=JobStatus.QUEUED) & on_pool)
        )
        .distinct()
        .select_related("project", "submitted_by")
    )


def pool_queue(*, pool: ComputePool) -> dict:
    """``running``: LAUNCHING/RUNNING jobs on the pool; ``queued``: QUEUED ones at its site (any
    of the site's pools may take them) by scheduler priority (highest first), each with
    ``reason_text``; ``reasons``: the legend."""
    running = list(
        _jobs_at(pool)
        .filter(status__in=[JobStatus.LAUNCHING, JobStatus.RUNNING])
        .order_by("started_at")
    )
    queued = list(
        _jobs_at(pool).filter(status=JobStatus.QUEUED).order_by("-sched_priority", "created_at")
    )
    for job in queued:
        job.reason_text = REASONS.get(job.sched_reason, "")
    for job in running:
        job.expected_end = (job.started_at or timezone.now()) + timedelta(
            seconds=job.estimated_seconds
        )
    return {"running": running, "queued": queued, "reasons": REASONS}


def pool_calendar(*, pool: ComputePool) -> dict:
    """Hourly series for the next ``CALENDAR_DAYS`` days and the planned jobs.

    ``{"hours": [ISO 8601 UTC, …], "available": [0|1], "foreign_only": [0|1], "price": [per
    service unit·hour], "carbon": [gCO2e/kWh], "currency": str, "jobs": [{"id", "title",
    "start", "end", "status"}]}``.
    """
    from federation.admission import pool_series

    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    steps = CALENDAR_DAYS * 24
    series = pool_series(pool, start=now, steps=steps, step_s=3600)
    foreign = series["foreign_available"] or [False] * steps
    horizon = now + timedelta(days=CALENDAR_DAYS)
    jobs = []
    for job in _jobs_at(pool).filter(
        Q(status=JobStatus.QUEUED, est_start__lt=horizon)
        | Q(status__in=[JobStatus.LAUNCHING, JobStatus.RUNNING])
    ):
        if job.status == JobStatus.QUEUED:
            start, end = job.est_start, job.est_end
        else:
            start = job.started_at or now
            end = start + timedelta(seconds=job.estimated_seconds)
        if start is None or end is None:
            continue
        jobs.append(
            {
                "id": job.pk,
                "title": job.title,
                "start": start.isoformat(),
                "end": end.isoformat(),
                "status": job.status,
            }
        )
    return {
        "hours": [(now + timedelta(hours=h)).isoformat() for h in range(steps)],
        "available": [int(a) for a in series["available"]],
        "foreign_only": [
            int(f and not a) for a, f in zip(series["available"], foreign, strict=True)
        ],
        "price": [round(p, 4) for p in series["price"]],
        "carbon": [round(c, 1) for c in series["carbon"]],
        "currency": pool.currency,
        "jobs": sorted(jobs, key=lambda j: j["start"]),
    }


def carbon_readings_recent(*, pool: ComputePool, limit: int = 48):
    """The pool's readings from an hour ago on, oldest first (at most ``limit``)."""
    since = timezone.now() - timedelta(hours=1)
    return list(CarbonReading.objects.filter(pool=pool, at__gte=since).order_by("at")[:limit])


def reading_stale(*, pool: ComputePool) -> bool:
    """Whether the pool's last adapter reading is too old to count (``admission.reading_max_age``;
    the scheduler then treats the pool as down). Static pools are never stale."""
    from federation.admission import reading_max_age

    if pool.adapter == "static" or pool.read_at is None:
        return False
    return timezone.now() - pool.read_at > reading_max_age()
