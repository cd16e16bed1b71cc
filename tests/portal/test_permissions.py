"""Tests of the one permission entry point, ``portal.permissions.can``."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from federation.models import FederatedJob
from portal.models import ProjectRole, Role
from portal.permissions import can
from tests.factories import (
    DatasetFactory,
    InstitutionFactory,
    MembershipFactory,
    ProjectFactory,
    ProjectMemberFactory,
    SiteFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def team():
    """A project with a PI, a member who submitted a job, another member, and an outsider."""
    project = ProjectFactory()
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    submitter = ProjectMemberFactory(project=project).user
    member = ProjectMemberFactory(project=project).user
    outsider = ProjectMemberFactory().user  # a member of another project
    job = FederatedJob.objects.create(
        project=project, submitted_by=submitter, title="t", target_column="label"
    )
    return {
        "project": project,
        "pi": pi,
        "submitter": submitter,
        "member": member,
        "outsider": outsider,
        "job": job,
    }


@pytest.fixture
def site_world():
    """A site and its dataset at one institution, with a steward, a researcher, a foreign steward."""
    site = SiteFactory()
    dataset = DatasetFactory(site=site)
    steward = MembershipFactory(institution=site.institution, role=Role.DATA_STEWARD).user
    researcher = MembershipFactory(institution=site.institution, role=Role.RESEARCHER).user
    admin = MembershipFactory(institution=site.institution, role=Role.INSTITUTION_ADMIN).user
    foreign = MembershipFactory(institution=InstitutionFactory(), role=Role.DATA_STEWARD).user
    return {
        "site": site,
        "dataset": dataset,
        "steward": steward,
        "researcher": researcher,
        "admin": admin,
        "foreign": foreign,
    }


# ---------------------------------------------------------------------------------------------
# Project actions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["project.view", "job.submit"])
@pytest.mark.parametrize(
    ("who", "allowed"),
    [("pi", True), ("submitter", True), ("member", True), ("outsider", False)],
)
def test_can_project_actions_members_only(team, action, who, allowed):
    assert can(team[who], action, team["project"]) is allowed


def test_can_job_view_members_only(team):
    job = team["job"]

    assert can(team["member"], "job.view", job) is True
    assert can(team["pi"], "job.view", job) is True
    assert can(team["outsider"], "job.view", job) is False


@pytest.mark.parametrize(
    ("who", "allowed"),
    [("submitter", True), ("pi", True), ("member", False), ("outsider", False)],
)
def test_can_job_stop_submitter_or_pi(team, who, allowed):
    assert can(team[who], "job.stop", team["job"]) is allowed


def test_can_job_stop_pi_of_other_project_refused(team):
    other_pi = ProjectMemberFactory(role=ProjectRole.PRINCIPAL_INVESTIGATOR).user

    assert can(other_pi, "job.stop", team["job"]) is False


@pytest.mark.parametrize(
    ("who", "allowed"),
    [("pi", True), ("submitter", False), ("member", False), ("outsider", False)],
)
def test_can_project_invite_pi_only(team, who, allowed):
    assert can(team[who], "project.invite", team["project"]) is allowed


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        (Role.RESEARCHER, True),
        (Role.DATA_STEWARD, False),
        (Role.INSTITUTION_ADMIN, False),
        (None, False),
    ],
)
def test_can_project_create_researchers_only(role, allowed):
    user = UserFactory()
    if role is not None:
        MembershipFactory(user=user, role=role)

    assert can(user, "project.create") is allowed


# ---------------------------------------------------------------------------------------------
# Institution actions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "allowed"),
    [("steward", True), ("researcher", False), ("admin", False), ("foreign", False)],
)
def test_can_dataset_register_steward_of_site_institution_only(site_world, who, allowed):
    assert can(site_world[who], "dataset.register", site_world["site"]) is allowed


@pytest.mark.parametrize(
    ("who", "allowed"),
    [("steward", True), ("researcher", False), ("admin", False), ("foreign", False)],
)
def test_can_access_decide_steward_of_dataset_institution_only(site_world, who, allowed):
    assert can(site_world[who], "access.decide", site_world["dataset"]) is allowed


@pytest.mark.parametrize(
    ("who", "allowed"),
    [("admin", True), ("steward", False), ("researcher", False), ("foreign", False)],
)
def test_can_institution_admin_own_institution_only(site_world, who, allowed):
    assert can(site_world[who], "institution.admin", site_world["site"].institution) is allowed


def test_can_institution_admin_platform_admin_allowed(site_world):
    staff = UserFactory(is_staff=True)

    assert can(staff, "institution.admin", site_world["site"].institution) is True


def test_can_institution_admin_of_other_institution_refused(site_world):
    other_admin = MembershipFactory(role=Role.INSTITUTION_ADMIN).user

    assert can(other_admin, "institution.admin", site_world["site"].institution) is False


def test_can_project_member_who_is_steward_elsewhere_cannot_decide(team, site_world):
    """Project membership gives no say over another institution's datasets."""
    assert can(team["pi"], "access.decide", site_world["dataset"]) is False


# ---------------------------------------------------------------------------------------------
# Users who may do nothing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "action", "obj"),
    [
        ("pi", "project.view", "project"),
        ("pi", "job.submit", "project"),
        ("pi", "job.view", "job"),
        ("submitter", "job.stop", "job"),
        ("steward", "dataset.register", "site"),
        ("steward", "access.decide", "dataset"),
        ("pi", "project.invite", "project"),
        ("researcher", "project.create", None),
        ("admin", "institution.admin", "institution"),
    ],
)
def test_can_inactive_user_refused_everything(team, site_world, who, action, obj):
    world = {**team, **site_world, "institution": site_world["site"].institution, None: None}
    user = world[who]
    assert can(user, action, world[obj]) is True  # allowed while active
    user.is_active = False
    user.save()

    assert can(user, action, world[obj]) is False


@pytest.mark.parametrize(
    ("action", "obj"),
    [
        ("project.view", "project"),
        ("job.submit", "project"),
        ("job.view", "job"),
        ("job.stop", "job"),
        ("dataset.register", "site"),
        ("access.decide", "dataset"),
        ("project.invite", "project"),
        ("project.create", None),
        ("institution.admin", "institution"),
    ],
)
@pytest.mark.parametrize("user", [AnonymousUser(), None], ids=["anonymous", "none"])
def test_can_anonymous_refused_everything(team, site_world, user, action, obj):
    world = {**team, **site_world, "institution": site_world["site"].institution, None: None}

    assert can(user, action, world[obj]) is False


def test_can_unknown_action_raises(team):
    with pytest.raises(ValueError, match="unknown action 'job.delete'"):
        can(team["pi"], "job.delete", team["job"])


def test_can_unknown_action_raises_for_user_without_memberships():
    with pytest.raises(ValueError, match="unknown action"):
        can(UserFactory(), "projet.view", ProjectFactory())


def test_can_unknown_action_raises_for_anonymous(team):
    with pytest.raises(ValueError, match="unknown action"):
        can(AnonymousUser(), "job.delete", team["job"])
