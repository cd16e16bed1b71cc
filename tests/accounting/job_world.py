"""Helpers for usage and contribution tests: a running job at N sites, fed through the real services.

Events go through ``federation.services.job_callback_record`` (as the ServerApp's callbacks do) and
the job ends through ``job_reconcile`` with a SuperLink status, so the accounting services read
exactly what a real run leaves behind.
"""

from __future__ import annotations

from federation import services, superlink
from federation.models import FederatedJob, JobSite, JobStatus
from portal.models import ProjectRole
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
)
from tests.federation.callback_support import record


def running_job(num_sites: int, *, rounds: int = 2) -> FederatedJob:
    """A RUNNING job of a fresh project at ``num_sites`` sites (slugs ``s0 … s{n-1}``)."""
    project = ProjectFactory()
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=pi,
        title="accounting test",
        target_column="label",
        num_rounds=rounds,
        status=JobStatus.RUNNING,
        flower_run_id="7",
    )
    for i in range(num_sites):
        dv = DatasetVersionFactory(dataset__site__slug=f"s{i}", dataset__site__name=f"Site {i}")
        GrantFactory(project=project, dataset=dv.dataset)  # as a submitted job has
        JobSite.objects.create(job=job, site=dv.dataset.site, dataset_version=dv)
    return job


def post(job: FederatedJob, event: str, **payload) -> dict:
    """``event`` through the contract's parser into ``job_callback_record`` (its next number)."""
    return record(job, {"event": event, **payload})


def finish(job: FederatedJob, *, raw: dict | None = None) -> FederatedJob:
    """Post ``finished`` (if not yet) and end the job as the SuperLink reports ``raw``."""
    job.refresh_from_db()
    if "eval_accuracy" not in job.final_metrics:
        post(job, "finished", rounds=job.num_rounds, eval_accuracy=0.9, eval_loss=0.3, sites={})
    run = superlink.RunStatus("7", "finished", "completed", "", raw or {})
    return services.job_reconcile(job_id=job.pk, run=run)


def utilities_event(players: list[str], tables: dict[str, dict[str, float]], **extra) -> dict:
    """A ``contribution`` event payload as the ServerApp posts it."""
    return {
        "players": players,
        "method": "exact" if len(players) <= 8 else "gtg",
        "permutations": 0,
        "seed": 0,
        "utility": "example-weighted held-out accuracy",
        "utilities": tables,
        # Held-out rows so many that releasing the utilities over them (a grid of 1/999,999,998:
        # federation.disclosure.site_fraction, issue 9) moves them by at most 5e-10: the tests
        # of the Shapley arithmetic compare with hand computations within 1e-9.
        "examples": {p: 10**9 for p in players},
        "models": sum(len(t) for t in tables.values()),
        "sites": {},
        "errors": {},
        "wall_seconds": 1.5,
        **extra,
    }
