"""A job for the credit tests: three hospitals' sites, a project with a PI and members, and the
people around it (an outsider, institution admins, a platform admin).

Contribution scores are created directly (``score``), as the contribution part writes them after a
job: one row per (site, method, round), ``share`` normalised per job and method.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accounting.models import ContributionScore
from federation.models import FederatedJob, JobSite, JobStatus
from portal.models import ProjectRole, Role
from tests.factories import (
    DatasetVersionFactory,
    InstitutionFactory,
    MembershipFactory,
    ProjectFactory,
    ProjectMemberFactory,
    SiteFactory,
    UserFactory,
)


@dataclass
class CreditWorld:
    job: FederatedJob
    project: object
    hospitals: dict  # "A" | "B" | "C" -> Institution
    sites: dict  # "A" | "B" | "C" -> Site
    users: dict = field(default_factory=dict)  # role name -> User


def person(username: str, first: str, last: str):
    return UserFactory(username=username, first_name=first, last_name=last)


def build_credit_world(**job_fields) -> CreditWorld:
    """Hospitals A, B, C each with one site in the job; project led by Northern University.

    ``job_fields`` set the job's other fields (e.g. ``strategy_spec``, ``privacy`` and
    ``epsilon``, ``secure_aggregation``); by default it trains the linear model with FedAvg,
    without differential privacy or secure aggregation.

    People: ``ada`` (Ada Lovelace, member, submitted the job), ``grace`` (Grace Hopper, PI),
    ``alan`` (Alan Turing, member), ``olga`` (member of another project), ``bea`` (institution
    admin of Hospital B), ``uma`` (institution admin of Northern University), ``ian`` (institution
    admin of an uninvolved institution), ``root`` (platform admin).
    """
    lead = InstitutionFactory(slug="northern", name="Northern University")
    hospitals = {
        k: InstitutionFactory(slug=f"hospital-{k.lower()}", name=f"Hospital {k}") for k in "ABC"
    }
    sites = {
        k: SiteFactory(institution=inst, slug=f"site-{k.lower()}") for k, inst in hospitals.items()
    }
    project = ProjectFactory(slug="cardio", title="Cardio risk", institution=lead)
    users = {
        "ada": person("ada", "Ada", "Lovelace"),
        "grace": person("grace", "Grace", "Hopper"),
        "alan": person("alan", "Alan", "Turing"),
        "olga": person("olga", "Olga", "Outside"),
        "bea": person("bea", "Bea", "Admin"),
        "uma": person("uma", "Uma", "Lead-Admin"),
        "ian": person("ian", "Ian", "Elsewhere"),
        "root": person("root", "Root", "Platform"),
    }
    ProjectMemberFactory(project=project, user=users["ada"], role=ProjectRole.MEMBER)
    ProjectMemberFactory(
        project=project, user=users["grace"], role=ProjectRole.PRINCIPAL_INVESTIGATOR
    )
    ProjectMemberFactory(project=project, user=users["alan"], role=ProjectRole.MEMBER)
    ProjectMemberFactory(user=users["olga"])  # another project
    MembershipFactory(user=users["bea"], institution=hospitals["B"], role=Role.INSTITUTION_ADMIN)
    MembershipFactory(user=users["uma"], institution=lead, role=Role.INSTITUTION_ADMIN)
    MembershipFactory(
        user=users["ian"], institution=InstitutionFactory(), role=Role.INSTITUTION_ADMIN
    )
    users["root"].is_staff = True
    users["root"].save()
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=users["ada"],
        title="Risk model v1",
        target_column="label",
        status=JobStatus.COMPLETED,
        **job_fields,
    )
    for site in sites.values():
        add_site(job, site)
    return CreditWorld(job=job, project=project, hospitals=hospitals, sites=sites, users=users)


def add_site(job, site) -> JobSite:
    version = DatasetVersionFactory(dataset__site=site)
    return JobSite.objects.create(job=job, site=site, dataset_version=version)


def score(job, site, share: float, *, method: str = "exact", round: int = 0) -> ContributionScore:
    return ContributionScore.objects.create(
        job=job, site=site, method=method, round=round, raw_value=share * 0.9, share=share
    )
