"""Admission of queued jobs onto the institutions' compute pools.

A job is admitted when every pool of its sites has a free slot: the number of jobs LAUNCHING or
RUNNING with a site in that pool is below the pool's ``slots``. Jobs are considered in submission
order (first come, first served), so an earlier job is never overtaken on a shared pool. (A site has
one pool today; while the scheduler does not choose among several, a job holds a slot on each.)
"""

from __future__ import annotations

from django.db.models import Count

from federation.models import ComputePool, FederatedJob, JobStatus


def busy_slots() -> dict[int, int]:
    """Pool id → number of distinct active jobs using it."""
    rows = (
        ComputePool.objects.filter(
            site__job_sites__job__status__in=[JobStatus.LAUNCHING, JobStatus.RUNNING]
        )
        .annotate(n=Count("site__job_sites__job", distinct=True))
        .values_list("pk", "n")
    )
    return dict(rows)


def admit(job: FederatedJob) -> tuple[bool, str]:
    """Return ``(True, "")`` when every pool of ``job`` has a free slot, else ``(False, reason)``."""
    busy = busy_slots()
    pools = ComputePool.objects.filter(site__job_sites__job=job).distinct()
    for pool in pools:
        if busy.get(pool.pk, 0) >= pool.slots:
            return False, f"waiting for a free slot on pool {pool} ({pool.slots} slot(s), all busy)"
    earlier = FederatedJob.objects.filter(
        status=JobStatus.QUEUED, created_at__lt=job.created_at, sites__site__pools__in=pools
    ).exists()
    if earlier:
        return False, "waiting behind an earlier job on the same pool"
    return True, ""
