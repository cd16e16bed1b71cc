"""Tests of the portal core pages: the researcher dashboard and the allauth sign-in page."""

from __future__ import annotations

import pytest

from federation.models import FederatedJob
from portal.models import Role
from tests.factories import (
    InstitutionFactory,
    MembershipFactory,
    ProjectFactory,
    ProjectMemberFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
PASSWORD = "pw-for-tests-123"  # tests.factories.UserFactory's password


def test_dashboard_anonymous_redirects_to_login(client):
    response = client.get("/")

    assert response.status_code == 302
    assert response.url == f"{LOGIN}?next=/"


def test_dashboard_shows_own_projects_and_not_others(client):
    mine = ProjectMemberFactory(project__title="Lung Nodules Consortium")
    ProjectMemberFactory(project__title="Hidden Cardiology Study")
    ProjectFactory(title="Project Nobody Joined")
    client.force_login(mine.user)

    response = client.get("/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "Lung Nodules Consortium" in page
    assert "Hidden Cardiology Study" not in page
    assert "Project Nobody Joined" not in page


def test_dashboard_shows_own_jobs_and_not_others(client):
    mine = ProjectMemberFactory()
    theirs = ProjectMemberFactory()
    FederatedJob.objects.create(
        project=mine.project, submitted_by=mine.user, title="Our sepsis model", target_column="y"
    )
    FederatedJob.objects.create(
        project=theirs.project,
        submitted_by=theirs.user,
        title="Their secret job",
        target_column="y",
    )
    client.force_login(mine.user)

    page = client.get("/").content.decode()

    assert "Our sepsis model" in page
    assert "Their secret job" not in page


def test_dashboard_shows_institution_memberships(client):
    user = UserFactory()
    MembershipFactory(
        user=user, institution=InstitutionFactory(name="St Elsewhere"), role=Role.DATA_STEWARD
    )
    client.force_login(user)

    page = client.get("/").content.decode()

    assert "St Elsewhere" in page and "Data steward" in page


def test_login_page_renders_form(client):
    response = client.get(LOGIN)

    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="login"' in page
    assert 'name="password"' in page
    assert 'name="csrfmiddlewaretoken"' in page


@pytest.mark.parametrize("identifier", ["username", "email"])
def test_login_post_with_valid_credentials_signs_in(client, identifier):
    user = UserFactory(username="ada", email="ada@example.org")

    response = client.post(LOGIN, {"login": getattr(user, identifier), "password": PASSWORD})

    assert response.status_code == 302
    assert response.url == "/"
    assert client.session["_auth_user_id"] == str(user.pk)
    assert client.get("/").status_code == 200


def test_login_post_with_wrong_password_stays_signed_out(client):
    UserFactory(username="grace")

    response = client.post(LOGIN, {"login": "grace", "password": "not-the-password"})

    assert response.status_code == 200
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302


def test_login_post_inactive_user_not_signed_in(client):
    UserFactory(username="ghost", is_active=False)

    client.post(LOGIN, {"login": "ghost", "password": PASSWORD})

    assert "_auth_user_id" not in client.session
