"""Reads of the accounting steps of finished jobs (ADR 0015): one job's steps for its page, and
the jobs whose accounting failed that an admin may see and retry.

Permission scoping happens here: platform admins see every job, an institution admin the jobs
of their institutions' projects and the jobs that ran at their institutions' sites
(``can(user, "job.view_accounting", job)`` agrees, job by job).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Prefetch, Q

from accounting.models import JobAccountingStep, StepStatus
from accounting.services.steps import STEPS
from federation.models import FederatedJob, JobSite
from portal import selectors as portal_selectors
from portal.models import Institution


@dataclass
class JobAccounting:
    """A job's accounting for its page: ``steps`` in ``STEPS`` order (missing ones not listed),
    ``started`` (any row), and whether anything waits for a retry or for the sweep."""

    steps: list[JobAccountingStep] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return bool(self.steps)

    @property
    def done(self) -> bool:
        return len(self.steps) == len(STEPS) and all(
            s.status == StepStatus.DONE for s in self.steps
        )

    @property
    def failed(self) -> list[JobAccountingStep]:
        return [s for s in self.steps if s.status == StepStatus.FAILED]


def _ordered(rows) -> list[JobAccountingStep]:
    return sorted(rows, key=lambda r: STEPS.index(r.step) if r.step in STEPS else len(STEPS))


def job_accounting(*, job) -> JobAccounting:
    """The accounting steps of ``job`` (one query)."""
    return JobAccounting(_ordered(JobAccountingStep.objects.filter(job=job)))


def _involving(institutions) -> Q:
    """Jobs of the institutions' projects, or that ran at one of their sites."""
    at_sites = JobSite.objects.filter(site__institution__in=institutions).values("job_id")
    return Q(project__institution__in=institutions) | Q(pk__in=at_sites)


def jobs_with_failed_accounting(*, user, institution: Institution | None = None):
    """Finished jobs with a ``failed`` accounting step that ``user`` may see (all for platform
    admins, else those involving an institution they administer), narrowed to ``institution``
    when given; newest end first, project and institution joined, ``accounting_steps``
    prefetched. Empty for users who administer nothing."""
    jobs = FederatedJob.objects.filter(
        pk__in=JobAccountingStep.objects.filter(status=StepStatus.FAILED).values("job_id")
    )
    if not user.is_staff:
        jobs = jobs.filter(_involving(portal_selectors.administered_institutions(user=user)))
    if institution is not None:
        jobs = jobs.filter(_involving([institution]))
    return (
        jobs.select_related("project__institution")
        .prefetch_related(
            Prefetch("accounting_steps", queryset=JobAccountingStep.objects.order_by("id"))
        )
        .order_by("-finished_at", "-pk")
    )


def ordered_steps(job) -> list[JobAccountingStep]:
    """A listed job's prefetched steps in ``STEPS`` order."""
    return _ordered(job.accounting_steps.all())
