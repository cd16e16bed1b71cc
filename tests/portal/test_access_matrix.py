"""The access matrix: every object URL of the portal × every actor, with the exact allowed set.

The world (``tests/portal/matrix_world.py``) is three institutions A, B, C, each with a
researcher, a data steward and an institution admin, plus a platform admin (``is_staff``, no
membership) and the anonymous visitor. ``ENDPOINTS`` below is the access policy, one entry per
(method, URL):

- ``allowed`` actors get ``allowed`` (200, or a 302 whose ``effect`` happened);
- ``refused`` actors (other members of the project) get ``refused``: a 302 back with no effect
  (the job form instead answers 200, the form again, to users outside project A);
- every other signed-in actor gets ``denied`` — 404 for private objects, so another institution's
  objects do not reveal that they exist — and anonymous visitors go to the sign-in page.

For POSTs the test snapshots ``effect(world)`` before and after the request and asserts it changed
exactly when the actor is allowed. A second test posts without a CSRF token
(``Client(enforce_csrf_checks=True)``) as an allowed actor and expects 403; the ServerApp callback,
authenticated by its HMAC signature instead, gets its own tests.

Known permission bugs are listed in ``KNOWN_BUGS`` (strict xfail: the case fails the suite once
fixed, so the entry must go). The world is built once for the module inside a transaction that is
rolled back at the end; every test runs in a savepoint inside it (pytest-django's ``django_db``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.utils import timezone

from accounting.models import AccountingStep, JobAccountingStep
from federation import callbacks
from federation.models import FederatedJob, JobStatus, ModelRelease, ReleaseStatus
from frp_flwr.signing import sign
from portal.models import (
    IdentityProvider,
    Membership,
    Project,
    ProjectInvitation,
    ProjectMember,
    ProjectRole,
    Role,
)
from sandbox.models import AccessRequest, AccessStatus
from tests.portal.matrix_world import (
    ACTORS,
    ANONYMOUS,
    JOB_TITLES,
    PLATFORM_ADMIN,
    PROJECT_TITLES,
    World,
    build_world,
    institution_of,
)

pytestmark = pytest.mark.django_db

SIGNED_IN = frozenset(a for a in ACTORS if a != ANONYMOUS)
RESEARCHERS = frozenset({"researcher@A", "researcher@B", "researcher@C"})
PROJECT_MEMBERS = {
    "A": frozenset({"researcher@A", "researcher@B"}),
    "B": frozenset({"researcher@B"}),
}
PROJECT_PI = {"A": "researcher@A", "B": "researcher@B"}
JOB_PROJECT = {"A-job": "A", "A-job-by-B": "A", "B-job": "B"}
JOB_SITE_INSTITUTIONS = {"A-job": {"A", "B"}, "A-job-by-B": {"A", "B"}, "B-job": {"B"}}
PROJECT_INSTITUTION = {"A": "A", "B": "B"}


def job_viewers(j: str) -> frozenset[str]:
    """``job.view``: the project's members, the platform admin, the data stewards and admins of
    the institutions whose sites take part, and the admins of the project's institution."""
    p = JOB_PROJECT[j]
    return (
        PROJECT_MEMBERS[p]
        | {PLATFORM_ADMIN, f"institution-admin@{PROJECT_INSTITUTION[p]}"}
        | {f"data-steward@{i}" for i in JOB_SITE_INSTITUTIONS[j]}
        | {f"institution-admin@{i}" for i in JOB_SITE_INSTITUTIONS[j]}
    )


JOB_STOPPERS = {  # the submitter and the project's PI
    "A-job": frozenset({"researcher@A"}),
    "A-job-by-B": frozenset({"researcher@A", "researcher@B"}),
    "B-job": frozenset({"researcher@B"}),
}
INVITEE = "researcher@C"
NEW_PROJECT_TITLE = "Matrix new project"
NEW_JOB_TITLE = "Matrix new job"
NEW_INVITEE_EMAIL = "newcomer@elsewhere.example.org"


def institution_admins(inst: str) -> frozenset[str]:
    return frozenset({f"institution-admin@{inst}", PLATFORM_ADMIN})


def projects_of(actor: str) -> set[str]:
    return {p for p, members in PROJECT_MEMBERS.items() if actor in members}


ALL_PROJECT_TITLES = frozenset(PROJECT_TITLES.values())
ALL_JOB_TITLES = frozenset(JOB_TITLES.values())


def project_titles(actor: str, *, invited: bool = False) -> frozenset[str]:
    """Titles of the actor's projects (and, with ``invited``, of projects inviting them)."""
    projects = projects_of(actor) | ({"A"} if invited and actor == INVITEE else set())
    return frozenset(PROJECT_TITLES[p] for p in projects)


def job_project_titles(actor: str) -> frozenset[str]:
    return frozenset(PROJECT_TITLES[JOB_PROJECT[j]] for j in JOB_TITLES if actor in job_viewers(j))


def job_titles(actor: str) -> frozenset[str]:
    return frozenset(t for j, t in JOB_TITLES.items() if actor in job_viewers(j))


# ---------------------------------------------------------------------------------------------
# Outcomes and endpoints
# ---------------------------------------------------------------------------------------------

Location = Callable[[World, str], str]  # (world, requested path) -> expected Location header


@dataclass(frozen=True)
class Outcome:
    """What a request must get: a status, where a redirect goes, whether the effect happens."""

    status: int
    location: Location | None = None
    changes: bool = False


def _login(world: World, path: str) -> str:
    return f"/accounts/login/?next={quote(path)}"


OK = Outcome(200)
NOT_FOUND = Outcome(404)
FORBIDDEN = Outcome(403)
TO_LOGIN = Outcome(302, _login)
TO_ADMIN_LOGIN = Outcome(302, lambda w, p: "/admin/login/?next=/admin/")


def redirect(location: Location, *, changes: bool) -> Outcome:
    return Outcome(302, location, changes)


@dataclass(frozen=True)
class Endpoint:
    """One (method, URL) of the portal and the policy on it."""

    method: str
    label: str  # the URL with named placeholders, for test ids: /jobs/<A-job>/
    url: Callable[[World], str]
    allowed_actors: frozenset[str]
    allowed: Outcome = OK
    refused_actors: frozenset[str] = frozenset()
    refused: Outcome = NOT_FOUND
    denied: Outcome = NOT_FOUND
    anonymous: Outcome = TO_LOGIN
    data: Callable[[World, str], dict] | None = None  # (world, actor) -> form data
    json_body: Callable[[World], dict] | None = None  # sent as application/json instead
    effect: Callable[[World], object] | None = None  # snapshot of the state a POST changes
    result: object = None  # what ``effect`` reads after an allowed POST
    prepare: Callable[[World], None] | None = None  # runs in the test's savepoint
    csrf_protected: bool = True
    # List pages: which of ``listed`` titles the actor's page shows (the others must not appear).
    listed: frozenset[str] = frozenset()
    shows: Callable[[str], frozenset[str]] | None = None

    def __str__(self) -> str:
        return f"{self.method} {self.label}"

    def expected(self, actor: str) -> Outcome:
        if actor == ANONYMOUS:
            return self.anonymous
        if actor in self.allowed_actors:
            return self.allowed
        if actor in self.refused_actors:
            return self.refused
        return self.denied


def _get(label: str, url: Callable[[World], str], allowed_actors, **kw) -> Endpoint:
    return Endpoint("GET", label, url, frozenset(allowed_actors), **kw)


def _post(label: str, url: Callable[[World], str], allowed_actors, **kw) -> Endpoint:
    return Endpoint("POST", label, url, frozenset(allowed_actors), **kw)


# --- URL builders and effects (effects re-read the database) ------------------------------------


def _project_url(p: str, suffix: str = "") -> Callable[[World], str]:
    return lambda w: f"/projects/{w.projects[p].slug}/{suffix}"


def _job_url(j: str, suffix: str = "") -> Callable[[World], str]:
    return lambda w: f"/jobs/{w.jobs[j].pk}/{suffix}"


def _inst_url(i: str, suffix: str) -> Callable[[World], str]:
    return lambda w: f"/institutions/{w.institutions[i].slug}/{suffix}"


def _member_url(i: str, action: str) -> Callable[[World], str]:
    """A member-management URL of institution ``i`` aimed at its researcher."""
    return lambda w: (
        f"/institutions/{w.institutions[i].slug}/members/{w.user(f'researcher@{i}').pk}/{action}/"
    )


def _invitations(p: str) -> Callable[[World], object]:
    return lambda w: ProjectInvitation.objects.filter(
        project=w.projects[p], email=NEW_INVITEE_EMAIL
    ).count()


def _project_role(p: str, actor: str) -> Callable[[World], object]:
    return lambda w: ProjectMember.objects.get(project=w.projects[p], user=w.user(actor)).role


def _job_status(j: str) -> Callable[[World], object]:
    return lambda w: FederatedJob.objects.get(pk=w.jobs[j].pk).status


def _roles_at(i: str) -> Callable[[World], object]:
    return lambda w: sorted(
        Membership.objects.filter(
            institution=w.institutions[i], user=w.user(f"researcher@{i}")
        ).values_list("role", flat=True)
    )


def _is_active(i: str) -> Callable[[World], object]:
    return lambda w: get_user_model().objects.get(pk=w.user(f"researcher@{i}").pk).is_active


def _idp_issuer(i: str) -> Callable[[World], object]:
    return lambda w: list(
        IdentityProvider.objects.filter(institution=w.institutions[i]).values_list(
            "issuer", flat=True
        )
    )


def _invitation_answer(w: World) -> object:
    """The invitation's status and who answered it (its link is the credential: issue 9)."""
    invitation = ProjectInvitation.objects.get(pk=w.invitation.pk)
    answered_by_member = ProjectMember.objects.filter(
        project=w.projects["A"], user=invitation.responded_by_id
    ).exists()
    return (invitation.status, answered_by_member)


def _new_project_data(w: World, actor: str) -> dict:
    inst = institution_of(actor) or "A"
    return {"title": NEW_PROJECT_TITLE, "institution": w.institutions[inst].pk, "description": ""}


def _new_job_data(w: World, actor: str) -> dict:
    return {
        "title": NEW_JOB_TITLE,
        "project": w.projects["A"].pk,
        "datasets": [v.pk for v in w.dataset_versions],
        "target_column": "label",
        "feature_columns": "",
        "num_rounds": 2,
        "local_epochs": 1,
        "learning_rate": 0.1,
    }


def _idp_data(i: str) -> Callable[[World, str], dict]:
    return lambda w, actor: {
        "protocol": "oidc",
        "enabled": "on",
        "display_name": "",
        "issuer": f"https://idp.{i.lower()}.example.org",
        "client_id": "portal",
        "client_secret": "matrix-secret",
    }


def _running(j: str) -> Callable[[World], None]:
    def run(w: World) -> None:
        FederatedJob.objects.filter(pk=w.jobs[j].pk).update(
            status=JobStatus.RUNNING, flower_run_id="7"
        )
        w.jobs[j].refresh_from_db()

    return run


def _failure_reason(j: str) -> Callable[[World], object]:
    return lambda w: FederatedJob.objects.get(pk=w.jobs[j].pk).failure_reason


FORGED_EVENT = {"event": "failed", "reason": "the ServerApp crashed"}


def _to(url: Callable[[World], str]) -> Location:
    return lambda w, path: url(w)


# --- The policy ---------------------------------------------------------------------------------


STEWARDS = frozenset(f"data-steward@{i}" for i in ("A", "B", "C"))


def _access_status(pick: Callable[[World], AccessRequest]) -> Callable[[World], object]:
    return lambda w: AccessRequest.objects.get(pk=pick(w).pk).status


ADMINS = frozenset({f"institution-admin@{i}" for i in ("A", "B", "C")} | {PLATFORM_ADMIN})


def job_accounting_admins(j: str) -> frozenset[str]:
    """``job.view_accounting`` / ``job.retry_accounting``: the platform admin and the admins of
    the project's and the job's sites' institutions."""
    institutions = {PROJECT_INSTITUTION[JOB_PROJECT[j]], *JOB_SITE_INSTITUTIONS[j]}
    return frozenset({PLATFORM_ADMIN} | {f"institution-admin@{i}" for i in institutions})


def _accounting_failed(j: str) -> Callable[[World], None]:
    """The job ended and its contribution step failed (the others done)."""

    def prepare(w: World) -> None:
        job = w.jobs[j]
        FederatedJob.objects.filter(pk=job.pk).update(
            status=JobStatus.COMPLETED, finished_at=timezone.now()
        )
        for step in AccountingStep.values:
            failed = step == AccountingStep.CONTRIBUTION
            JobAccountingStep.objects.create(
                job=job,
                step=step,
                status="failed" if failed else "done",
                error="no utility for coalition {1} was reported" if failed else "",
            )

    return prepare


def _accounting_states(j: str) -> Callable[[World], object]:
    return lambda w: sorted(
        JobAccountingStep.objects.filter(job=w.jobs[j]).values_list("step", "status")
    )


def _accounting_endpoints() -> list[Endpoint]:
    """The jobs whose accounting failed (admins, scoped) and the retry (the job's admins)."""
    retry = lambda w: f"/accounting/jobs/{w.jobs['A-job'].pk}/retry/"  # noqa: E731
    return [
        _get(
            "/accounting/jobs/",
            lambda w: "/accounting/jobs/",
            ADMINS,
            prepare=_accounting_failed("A-job"),
            listed=ALL_JOB_TITLES,
            shows=lambda actor: frozenset(
                {JOB_TITLES["A-job"]} if actor in job_accounting_admins("A-job") else set()
            ),
        ),
        *(
            _get(
                f"/accounting/institutions/<{i}>/jobs/",
                lambda w, i=i: f"/accounting/institutions/{w.institutions[i].slug}/jobs/",
                institution_admins(i),
                prepare=_accounting_failed("A-job"),
                listed=ALL_JOB_TITLES,
                shows=lambda actor, i=i: frozenset(
                    {JOB_TITLES["A-job"]} if i in JOB_SITE_INSTITUTIONS["A-job"] else set()
                ),
            )
            for i in ("A", "B", "C")
        ),
        _post(
            "/accounting/jobs/<A-job>/retry/",
            retry,
            job_accounting_admins("A-job"),
            allowed=redirect(_to(_job_url("A-job")), changes=True),
            data=lambda w, a: {},
            prepare=_accounting_failed("A-job"),
            effect=_accounting_states("A-job"),
            result=[
                ("billing", "done"),
                ("contribution", "pending"),  # queued again (the chain runs on commit)
                ("credit", "done"),
                ("usage", "done"),
            ],
        ),
    ]


def _sandbox_endpoints() -> list[Endpoint]:
    """Dataset catalogue (any signed-in user), access requests (project members ask, the owning
    institution's stewards decide and revoke), airlock decisions (participating sites' stewards)."""
    dataset_a = lambda w: f"/datasets/{w.dataset_versions[0].dataset.pk}/"  # noqa: E731
    queue = lambda w, p: "/access-requests/"  # noqa: E731
    return [
        _get("/datasets/", lambda w: "/datasets/", SIGNED_IN),
        _get("/datasets/<A-dataset>/", dataset_a, SIGNED_IN),
        _post(
            "/datasets/<A-dataset>/ (request for <A-project>)",
            dataset_a,
            PROJECT_MEMBERS["A"],
            allowed=redirect(_to(dataset_a), changes=True),
            refused_actors=SIGNED_IN - PROJECT_MEMBERS["A"],
            refused=OK,  # the form again: project A is not among their choices
            data=lambda w, a: {"project": w.projects["A"].pk, "purpose": "matrix request"},
            effect=lambda w: AccessRequest.objects.filter(
                project=w.projects["A"], purpose="matrix request"
            ).count(),
            result=1,
        ),
        _get("/access-requests/", lambda w: "/access-requests/", STEWARDS),
        _post(
            "/access-requests/<B-project-pending-on-A-dataset>/decide/",
            lambda w: f"/access-requests/{w.pending_request.pk}/decide/",
            {"data-steward@A"},
            allowed=redirect(queue, changes=True),
            data=lambda w, a: {"decision": "refuse", "reason": "matrix refusal"},
            effect=_access_status(lambda w: w.pending_request),
            result=AccessStatus.REFUSED,
        ),
        _post(
            "/access-requests/<A-project-grant-on-A-dataset>/revoke/",
            lambda w: f"/access-requests/{w.grant_a.pk}/revoke/",
            {"data-steward@A"},
            allowed=redirect(lambda w, p: "/access-requests/?status=approved", changes=True),
            data=lambda w, a: {"reason": "matrix revocation"},
            effect=_access_status(lambda w: w.grant_a),
            result=AccessStatus.REVOKED,
        ),
        _post(
            "/jobs/releases/<A-job-release>/decide/ (site A)",
            lambda w: f"/jobs/releases/{w.release.pk}/decide/",
            {"data-steward@A"},
            allowed=redirect(queue, changes=True),
            data=lambda w, a: {
                "site": w.dataset_versions[0].dataset.site.pk,
                "decision": "refuse",
                "reason": "matrix",
            },
            effect=lambda w: ModelRelease.objects.get(pk=w.release.pk).status,
            result=ReleaseStatus.REFUSED,
        ),
        # A-job is queued: those who see it may ask, and are told it is not finished (or, outside
        # the project, that only its members may ask); nobody downloads.
        _post(
            "/jobs/<A-job>/release/",
            _job_url("A-job", "release/"),
            frozenset(),
            refused_actors=job_viewers("A-job"),
            refused=redirect(_to(_job_url("A-job")), changes=False),
            effect=lambda w: ModelRelease.objects.filter(job=w.jobs["A-job"]).count(),
        ),
        _get(
            "/jobs/<A-job>/model.json",
            lambda w: f"/jobs/{w.jobs['A-job'].pk}/model.json",
            frozenset(),
        ),
    ]


def _project_endpoints(p: str) -> list[Endpoint]:
    members, pi = PROJECT_MEMBERS[p], PROJECT_PI[p]
    others = members - {pi}
    detail = _project_url(p)
    # PI of A promotes B's researcher. B's researcher, B's only PI, tries to step down to member:
    # refused for everyone, since a project must keep a principal investigator.
    target, role = (
        ("researcher@B", ProjectRole.PRINCIPAL_INVESTIGATOR) if p == "A" else (pi, "member")
    )
    role_setters = {pi} if p == "A" else set()
    return [
        _get(f"/projects/<{p}-project>/", detail, members),
        _post(
            f"/projects/<{p}-project>/invite/",
            _project_url(p, "invite/"),
            {pi},
            allowed=redirect(_to(detail), changes=True),
            refused_actors=others,
            refused=redirect(_to(detail), changes=False),
            data=lambda w, a: {"email": NEW_INVITEE_EMAIL, "role": "member"},
            effect=_invitations(p),
            result=1,
        ),
        _post(
            f"/projects/<{p}-project>/members/<{target}>/role/",
            lambda w: f"/projects/{w.projects[p].slug}/members/{w.user(target).pk}/role/",
            role_setters,
            allowed=redirect(_to(detail), changes=True),
            refused_actors=members - role_setters,
            refused=redirect(_to(detail), changes=False),
            data=lambda w, a: {"role": role},
            effect=_project_role(p, target),
            result=role,
        ),
    ]


def _job_endpoints(j: str) -> list[Endpoint]:
    viewers, stoppers = job_viewers(j), JOB_STOPPERS[j]
    detail = _job_url(j)
    return [
        _get(f"/jobs/<{j}>/", detail, viewers),
        _get(f"/jobs/<{j}>/progress/", _job_url(j, "progress/"), viewers),
        _get(
            f"/jobs/<{j}>/progress.json",
            lambda w: f"/jobs/{w.jobs[j].pk}/progress.json",
            viewers,
        ),
        _post(
            f"/jobs/<{j}>/stop/",
            _job_url(j, "stop/"),
            stoppers,
            allowed=redirect(_to(detail), changes=True),
            refused_actors=viewers - stoppers,
            refused=redirect(_to(detail), changes=False),
            data=lambda w, a: {},
            effect=_job_status(j),
            result=JobStatus.STOPPED,
        ),
    ]


def _institution_endpoints(i: str) -> list[Endpoint]:
    admins = institution_admins(i)
    members_page = _inst_url(i, "members/")
    idp_page = _inst_url(i, "identity-provider/")
    return [
        _get(f"/institutions/<{i}>/members/", members_page, admins),
        _get(f"/institutions/<{i}>/identity-provider/", idp_page, admins),
        _post(
            f"/institutions/<{i}>/identity-provider/",
            idp_page,
            admins,
            allowed=redirect(_to(idp_page), changes=True),
            data=_idp_data(i),
            effect=_idp_issuer(i),
            result=[f"https://idp.{i.lower()}.example.org"],
        ),
        _get(f"/institutions/<{i}>/sites/", _inst_url(i, "sites/"), admins),
        _get(f"/institutions/<{i}>/audit/", _inst_url(i, "audit/"), admins),
        _post(
            f"/institutions/<{i}>/members/<researcher@{i}>/roles/",
            _member_url(i, "roles"),
            admins,
            allowed=redirect(_to(members_page), changes=True),
            data=lambda w, a: {"roles": [Role.RESEARCHER, Role.DATA_STEWARD]},
            effect=_roles_at(i),
            result=[Role.DATA_STEWARD, Role.RESEARCHER],
        ),
        _post(
            f"/institutions/<{i}>/members/<researcher@{i}>/deactivate/",
            _member_url(i, "deactivate"),
            admins,
            allowed=redirect(_to(members_page), changes=True),
            data=lambda w, a: {},
            effect=_is_active(i),
            result=False,
        ),
    ]


def _new_job_location(w: World, path: str) -> str:
    return f"/jobs/{FederatedJob.objects.get(title=NEW_JOB_TITLE).pk}/"


ENDPOINTS: list[Endpoint] = [
    _get(
        "/",
        lambda w: "/",
        SIGNED_IN,
        listed=ALL_PROJECT_TITLES | ALL_JOB_TITLES,
        # A job row names its project, so a steward or admin who sees a job sees its project's title.
        shows=lambda a: project_titles(a, invited=True) | job_titles(a) | job_project_titles(a),
    ),
    _get(
        "/projects/",
        lambda w: "/projects/",
        SIGNED_IN,
        listed=ALL_PROJECT_TITLES,
        shows=lambda a: project_titles(a, invited=True),
    ),
    _get("/jobs/", lambda w: "/jobs/", SIGNED_IN, listed=ALL_JOB_TITLES, shows=job_titles),
    _get(
        "/jobs/new/",
        lambda w: "/jobs/new/",
        SIGNED_IN,
        listed=ALL_PROJECT_TITLES,
        shows=project_titles,
    ),
    # Inferred from can("job.submit"): only project A's members submit into it; anybody else gets
    # the form back (project A is not among their choices) and no job is created.
    _post(
        "/jobs/new/ (project <A-project>)",
        lambda w: "/jobs/new/",
        PROJECT_MEMBERS["A"],
        allowed=redirect(_new_job_location, changes=True),
        refused_actors=SIGNED_IN - PROJECT_MEMBERS["A"],
        refused=OK,
        data=_new_job_data,
        effect=lambda w: FederatedJob.objects.filter(title=NEW_JOB_TITLE).count(),
        result=1,
    ),
    _get("/projects/new/", lambda w: "/projects/new/", RESEARCHERS),
    _post(
        "/projects/new/",
        lambda w: "/projects/new/",
        RESEARCHERS,
        allowed=redirect(lambda w, p: "/projects/matrix-new-project/", changes=True),
        data=_new_project_data,
        effect=lambda w: Project.objects.filter(title=NEW_PROJECT_TITLE).count(),
        result=1,
    ),
    *_project_endpoints("A"),
    *_project_endpoints("B"),
    # The single-use link is the credential: whoever holds it, signed in, may answer (once).
    _get(
        "/invitations/<A-project-invitation-to-C>/",
        lambda w: f"/invitations/{w.invitation.token}/",
        SIGNED_IN,
    ),
    _post(
        "/invitations/<A-project-invitation-to-C>/",
        lambda w: f"/invitations/{w.invitation.token}/",
        SIGNED_IN,
        allowed=redirect(_to(_project_url("A")), changes=True),
        data=lambda w, a: {"answer": "accept"},
        effect=_invitation_answer,
        result=("accepted", True),
    ),
    *(e for j in JOB_PROJECT for e in _job_endpoints(j)),
    *(e for i in ("A", "B", "C") for e in _institution_endpoints(i)),
    *(
        _get(
            f"/accounting/institutions/<{i}>/{page}/",
            lambda w, i=i, page=page: f"/accounting/institutions/{w.institutions[i].slug}/{page}/",
            institution_admins(i),
        )
        for i in ("A", "B", "C")
        for page in ("prices", "billing")
    ),
    *_sandbox_endpoints(),
    *_accounting_endpoints(),
    _get("/ledger/", lambda w: "/ledger/", SIGNED_IN),  # ids/figures only
    _get(
        "/admin/",
        lambda w: "/admin/",
        {PLATFORM_ADMIN},
        denied=TO_ADMIN_LOGIN,
        anonymous=TO_ADMIN_LOGIN,
    ),
    # Not session-authenticated: only the job's HMAC signature counts (tested separately below).
    _post(
        "/jobs/callback/<A-job>/ (unsigned)",
        lambda w: f"/jobs/callback/{w.jobs['A-job'].pk}/",
        frozenset(),
        denied=FORBIDDEN,
        anonymous=FORBIDDEN,
        json_body=lambda w: FORGED_EVENT,
        prepare=_running("A-job"),
        effect=_failure_reason("A-job"),
        csrf_protected=False,
    ),
]

# Permission bugs the matrix found: test id -> reason. Each is a strict xfail, so a fix turns the
# case red until its entry is removed here.
KNOWN_BUGS: dict[str, str] = {}


def _case_id(endpoint: Endpoint, actor: str) -> str:
    return f"{endpoint} as {actor}"


def _param(endpoint: Endpoint, actor: str):
    case_id = _case_id(endpoint, actor)
    marks = []
    if case_id in KNOWN_BUGS:
        marks.append(pytest.mark.xfail(strict=True, reason=f"BUG: {KNOWN_BUGS[case_id]}"))
    return pytest.param(endpoint, actor, id=case_id, marks=marks)


CASES = [_param(e, a) for e in ENDPOINTS for a in ACTORS]
CSRF_CASES = [
    # an actor who reaches the view (allowed, or refused by the view itself rather than a 404)
    _param(e, sorted(e.allowed_actors or e.refused_actors)[0])
    for e in ENDPOINTS
    if e.method == "POST" and e.csrf_protected
]


# ---------------------------------------------------------------------------------------------
# The world, once per module
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """The matrix world, built once inside a transaction rolled back after the module's tests.

    Each test's ``django_db`` transaction nests in it as a savepoint, so what a test changes is
    undone before the next one. Every actor is signed in once here (``world.sessions``); a test's
    client presents that session cookie instead of signing in again.
    """
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            built = build_world()
            for actor, user in built.users.items():
                client = Client()
                client.force_login(user)
                built.sessions[actor] = client.cookies[settings.SESSION_COOKIE_NAME].value
            yield built
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def _client(world: World, actor: str, **kwargs) -> Client:
    """A test client signed in as ``actor`` (anonymous: no session)."""
    client = Client(**kwargs)
    if actor != ANONYMOUS:
        client.cookies[settings.SESSION_COOKIE_NAME] = world.sessions[actor]
    return client


def _send(client: Client, endpoint: Endpoint, world: World, actor: str):
    path = endpoint.url(world)
    if endpoint.method == "GET":
        return path, client.get(path)
    if endpoint.json_body is not None:
        body = json.dumps(endpoint.json_body(world))
        return path, client.post(path, body, content_type="application/json")
    return path, client.post(path, endpoint.data(world, actor) if endpoint.data else {})


# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("endpoint", "actor"), CASES)
def test_access(world, endpoint: Endpoint, actor: str):
    client = _client(world, actor)
    if endpoint.prepare:
        endpoint.prepare(world)
    expected = endpoint.expected(actor)
    before = endpoint.effect(world) if endpoint.effect else None

    path, response = _send(client, endpoint, world, actor)

    assert response.status_code == expected.status, (
        f"{endpoint.method} {path} as {actor}: expected {expected.status}, "
        f"got {response.status_code} {response.get('Location', '')}"
    )
    if expected.location is not None:
        assert response["Location"] == expected.location(world, path)
    if endpoint.shows is not None and expected.status == 200:
        page = response.content.decode()
        assert {t for t in endpoint.listed if t in page} == endpoint.shows(actor)
    if endpoint.effect is not None:
        after = endpoint.effect(world)
        assert (after != before) == expected.changes, f"effect {before!r} -> {after!r}"
        if expected.changes:
            assert after == endpoint.result


@pytest.mark.parametrize(("endpoint", "actor"), CSRF_CASES)
def test_post_without_csrf_token_forbidden(world, endpoint: Endpoint, actor: str):
    client = _client(world, actor, enforce_csrf_checks=True)
    before = endpoint.effect(world)

    _, response = _send(client, endpoint, world, actor)

    assert response.status_code == 403
    assert b"CSRF verification failed" in response.content
    assert endpoint.effect(world) == before


def test_matrix_covers_every_actor_and_post_endpoint():
    assert len(CASES) == len(ENDPOINTS) * len(ACTORS)
    assert len({c.id for c in CASES}) == len(CASES)
    posts = [e for e in ENDPOINTS if e.method == "POST"]
    assert all(e.effect is not None for e in posts)
    assert all(e.result is not None for e in posts if e.allowed.changes)
    assert len(CSRF_CASES) == len(posts) - 1  # all but the signed callback


# ---------------------------------------------------------------------------------------------
# The ServerApp callback: HMAC-signed, CSRF-exempt
# ---------------------------------------------------------------------------------------------


def _signed_callback(client: Client, world: World, job: str, **sign_kw):
    body = json.dumps({**FORGED_EVENT, "seq": 1}).encode()
    key = callbacks.run_key(job_id=world.jobs[job].pk, run_id="7")  # A-job runs as run 7
    headers = sign(key, body, **sign_kw)
    return client.post(
        f"/jobs/callback/{world.jobs['A-job'].pk}/",
        body,
        content_type="application/json",
        headers=headers,
    )


def test_callback_validly_signed_needs_no_csrf_token(world):
    _running("A-job")(world)

    response = _signed_callback(Client(enforce_csrf_checks=True), world, "A-job")

    assert response.status_code == 200
    assert _failure_reason("A-job")(world) == FORGED_EVENT["reason"]


def test_callback_signed_with_another_jobs_token_forbidden(world):
    _running("A-job")(world)

    response = _signed_callback(Client(), world, "B-job")

    assert response.status_code == 403
    assert _failure_reason("A-job")(world) == ""


def test_callback_with_stale_signature_forbidden(world):
    _running("A-job")(world)

    response = _signed_callback(Client(), world, "A-job", timestamp=int(time.time()) - 3600)

    assert response.status_code == 403
    assert _failure_reason("A-job")(world) == ""
