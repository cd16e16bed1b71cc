"""A world for the accounting-step tests: two sites of two institutions, each with a priced pool,
and finished jobs of a third institution's project whose metering and coalition utilities enter
through the real callback service and whose end goes through ``job_reconcile``.

Figures, by hand (rule at both pools: 1 SU per core-hour, 0.10 EUR per SU, data credit rate 0.5;
one core reserved; no start time, so the ClientApp's wall seconds are the hours held):

* s0: 3600 s → 1.0000 SU → compute 0.10; data charge 0.5 × 0.10 = 0.05;
* s1: 7200 s → 2.0000 SU → compute 0.20; data charge 0.5 × 0.20 = 0.10;
* utilities v(∅)=0.5, v({s0})=0.6, v({s1})=0.7, v({s0,s1})=0.8: exact Shapley
  φ0 = ½[(0.6−0.5) + (0.8−0.7)] = 0.1, φ1 = ½[(0.7−0.5) + (0.8−0.6)] = 0.2, shares 1/3 and 2/3;
  the data charges' 0.15 split by them: s0 0.05, s1 0.10.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from decimal import Decimal

from federation import services, superlink
from federation.models import FederatedJob, JobSite, JobStatus
from federation.signals import job_finished
from portal.models import Institution, ProjectRole, Role
from tests.accounting.job_world import utilities_event
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    MembershipFactory,
    PriceRuleFactory,
    ProjectFactory,
    ProjectMemberFactory,
)
from tests.federation.callback_support import record

FULL = {"": 0.5, "0": 0.6, "1": 0.7, "0,1": 0.8}
BROKEN = {"": 0.5, "0": 0.6, "0,1": 0.8}  # v({s1}) was never reported
WALL = {"s0": 3600.0, "s1": 7200.0}
D = Decimal

#: The job's billing entries by hand: (site, kind) -> amount.
HAND_COMPUTE = {
    ("s0", "compute_charge"): D("0.10"),
    ("s0", "compute_credit"): D("0.10"),
    ("s1", "compute_charge"): D("0.20"),
    ("s1", "compute_credit"): D("0.20"),
}
HAND_DATA = {
    ("s0", "data_charge"): D("0.05"),
    ("s1", "data_charge"): D("0.10"),
    ("s0", "data_credit"): D("0.05"),
    ("s1", "data_credit"): D("0.10"),
}


def _metering(wall: float) -> dict:
    return {
        "ok": True,
        "train_examples": 40,
        "eval_examples": 10,
        "cpu_seconds": wall / 2,
        "wall_seconds": wall,
        "bytes_received": 1700,
        "bytes_sent": 850,
        "error": "",
    }


@contextlib.contextmanager
def hand_off_lost():
    """Within: a finished job is not handed to accounting (as when the broker lost the message
    or the worker was down), so only the sweep or a retry can account for it."""
    from accounting.receivers import job_account_on_commit

    uid = "accounting.job_account_on_commit"
    job_finished.disconnect(dispatch_uid=uid)
    try:
        yield
    finally:
        job_finished.connect(job_account_on_commit, dispatch_uid=uid)


@dataclass
class StepsWorld:
    versions: list
    project: object
    pi: object
    admins: dict[str, object] = field(default_factory=dict)  # "project" | "s0" | "s1" | "other"

    def job(
        self, *, utilities: dict | None = None, status: str = "completed", rounds: int = 1
    ) -> FederatedJob:
        """A job at both sites that ran, posted its metering and utilities, and ended as the
        SuperLink reports ``status`` (completed, failed or stopped)."""
        job = FederatedJob.objects.create(
            project=self.project,
            submitted_by=self.pi,
            title="steps test",
            target_column="label",
            num_rounds=rounds,
            status=JobStatus.RUNNING,
            flower_run_id="7",
        )
        for dv in self.versions:
            JobSite.objects.create(job=job, site=dv.dataset.site, dataset_version=dv)
        post = lambda event, **p: record(job, {"event": event, **p})  # noqa: E731
        post("round", round=1, sites={s: _metering(w) for s, w in WALL.items()})
        post("contribution", **utilities_event(["s0", "s1"], {"0": dict(utilities or FULL)}))
        if status == JobStatus.COMPLETED:
            post("finished", rounds=rounds, eval_accuracy=0.9, eval_loss=0.3, sites={})
        run = superlink.RunStatus("7", "finished", str(status), "", {})
        return services.job_reconcile(job_id=job.pk, run=run)


def build_steps_world() -> StepsWorld:
    """The sites, their institutions' admins, the priced pools, the project and its PI."""
    versions = [
        DatasetVersionFactory(dataset__site__slug=slug, dataset__site__name=f"Site {slug}")
        for slug in ("s0", "s1")
    ]
    for dv in versions:
        PriceRuleFactory(
            pool=dv.dataset.site.pools.get(),
            cpu_weight=1,
            price_per_unit="0.10",
            data_credit_rate="0.5",
        )
    project = ProjectFactory()
    for dv in versions:  # the sites' stewards granted the project their data
        GrantFactory(dataset=dv.dataset, project=project)
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    world = StepsWorld(versions=versions, project=project, pi=pi)
    institutions = {
        "project": project.institution,
        "s0": versions[0].dataset.site.institution,
        "s1": versions[1].dataset.site.institution,
        "other": Institution.objects.create(slug="elsewhere", name="Elsewhere"),
    }
    for key, inst in institutions.items():
        world.admins[key] = MembershipFactory(institution=inst, role=Role.INSTITUTION_ADMIN).user
    return world
