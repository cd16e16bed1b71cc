"""The world of the access-matrix test (``tests/portal/test_access_matrix.py``): who, and what.

Actors are named ``<role>@<institution>`` (``researcher@B``), plus ``platform-admin``
(``is_staff``, no membership) and ``anonymous``. The layout the access policy refers to:

- institutions A, B and C each have a researcher, a data steward and an institution admin
  (one ``Membership`` role each);
- project ``A`` (lead institution A): researcher@A is its principal investigator, researcher@B a
  member; it holds approved grants on a dataset at A's site and one at B's site; its jobs are
  ``A-job`` (submitted by researcher@A) and ``A-job-by-B`` (submitted by researcher@B);
- project ``B`` (lead institution B): researcher@B alone, as principal investigator; job ``B-job``;
- institution C has nothing but users, and a pending invitation to project A addressed to
  researcher@C's e-mail;
- project B has a pending access request for the dataset at A's site; A-job has a pending model
  release (airlock) awaiting the stewards of sites A and B.

Every job is queued and trains at one site per dataset (``JobSite``). ``build_world`` returns model
instances; tests re-read the database to observe effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from federation.models import FederatedJob, JobSite, ModelRelease
from portal.models import Institution, Project, ProjectInvitation, ProjectRole, Role
from sandbox.models import AccessRequest, AccessStatus
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    InstitutionFactory,
    MembershipFactory,
    ProjectFactory,
    ProjectMemberFactory,
    SiteFactory,
    UserFactory,
)

INSTITUTIONS = ("A", "B", "C")
ROLES = {
    "researcher": Role.RESEARCHER,
    "data-steward": Role.DATA_STEWARD,
    "institution-admin": Role.INSTITUTION_ADMIN,
}
PLATFORM_ADMIN = "platform-admin"
ANONYMOUS = "anonymous"
ACTORS: tuple[str, ...] = (
    *(f"{role}@{inst}" for inst in INSTITUTIONS for role in ROLES),
    PLATFORM_ADMIN,
    ANONYMOUS,
)


PROJECT_TITLES = {"A": "Project PA", "B": "Project PB"}
JOB_TITLES = {  # no title is a substring of another, so pages can be searched for them
    "A-job": "PA job by researcher-a",
    "A-job-by-B": "PA job by researcher-b",
    "B-job": "PB job by researcher-b",
}


def institution_of(actor: str) -> str | None:
    """``"B"`` for ``"data-steward@B"``; ``None`` for the platform admin and anonymous."""
    return actor.partition("@")[2] or None


@dataclass
class World:
    """The objects of one access-matrix world, by the names the policy uses."""

    users: dict  # actor name -> User (no entry for ANONYMOUS)
    institutions: dict[str, Institution]  # "A" | "B" | "C"
    projects: dict[str, Project]  # "A" | "B"
    jobs: dict[str, FederatedJob]  # "A-job" | "A-job-by-B" | "B-job"
    invitation: ProjectInvitation  # pending, to project A, for researcher@C
    dataset_versions: list  # the two DatasetVersions project A holds grants for (sites A and B)
    grant_a: AccessRequest = None  # project A's approved grant on the dataset at A's site
    pending_request: AccessRequest = None  # project B asks for the dataset at A's site (pending)
    release: ModelRelease = None  # a pending model release of A-job (sites A and B take part)
    sessions: dict[str, str] = field(default_factory=dict)  # actor -> session key, when signed in

    def user(self, actor: str):
        """The user behind ``actor``, or ``None`` for ``anonymous``."""
        return self.users.get(actor)


def _job(project: Project, by, name: str, versions: list) -> FederatedJob:
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=by,
        title=JOB_TITLES[name],
        target_column="label",
        num_rounds=3,
    )
    JobSite.objects.bulk_create(
        [JobSite(job=job, site=v.dataset.site, dataset_version=v) for v in versions]
    )
    return job


def build_world() -> World:
    """Create the world described in the module docstring; returns its objects."""
    institutions = {
        name: InstitutionFactory(slug=f"matrix-{name.lower()}", name=f"Institution {name}")
        for name in INSTITUTIONS
    }
    users = {}
    for inst in INSTITUTIONS:
        for role_name, role in ROLES.items():
            actor = f"{role_name}@{inst}"
            user = UserFactory(username=f"{role_name}-{inst.lower()}", first_name=role_name)
            MembershipFactory(user=user, institution=institutions[inst], role=role)
            users[actor] = user
    users[PLATFORM_ADMIN] = UserFactory(username=PLATFORM_ADMIN, is_staff=True)

    version_a = DatasetVersionFactory(dataset__site=SiteFactory(institution=institutions["A"]))
    version_b = DatasetVersionFactory(dataset__site=SiteFactory(institution=institutions["B"]))

    project_a = ProjectFactory(
        slug="project-a", title=PROJECT_TITLES["A"], institution=institutions["A"]
    )
    ProjectMemberFactory(
        project=project_a, user=users["researcher@A"], role=ProjectRole.PRINCIPAL_INVESTIGATOR
    )
    ProjectMemberFactory(project=project_a, user=users["researcher@B"], role=ProjectRole.MEMBER)
    for version in (version_a, version_b):
        GrantFactory(project=project_a, dataset=version.dataset)

    project_b = ProjectFactory(
        slug="project-b", title=PROJECT_TITLES["B"], institution=institutions["B"]
    )
    ProjectMemberFactory(
        project=project_b, user=users["researcher@B"], role=ProjectRole.PRINCIPAL_INVESTIGATOR
    )

    jobs = {
        "A-job": _job(project_a, users["researcher@A"], "A-job", [version_a, version_b]),
        "A-job-by-B": _job(project_a, users["researcher@B"], "A-job-by-B", [version_a, version_b]),
        "B-job": _job(project_b, users["researcher@B"], "B-job", [version_b]),
    }
    invitation = ProjectInvitation.objects.create(
        project=project_a,
        email=users["researcher@C"].email,
        invited_by=users["researcher@A"],
        expires_at=timezone.now() + timedelta(days=14),
    )
    grant_a = AccessRequest.objects.get(project=project_a, dataset=version_a.dataset)
    pending = AccessRequest.objects.create(
        project=project_b,
        dataset=version_a.dataset,
        requested_by=users["researcher@B"],
        purpose="matrix",
        status=AccessStatus.PENDING,
    )
    return World(
        users=users,
        institutions=institutions,
        projects={"A": project_a, "B": project_b},
        jobs=jobs,
        invitation=invitation,
        dataset_versions=[version_a, version_b],
        grant_a=grant_a,
        pending_request=pending,
        release=ModelRelease.objects.create(job=jobs["A-job"], requested_by=users["researcher@A"]),
    )
