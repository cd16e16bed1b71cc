"""The Django admin as the platform admin uses it: bad input is a form error, never a 500."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.factories import InstitutionFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def platform_admin(client):
    admin = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(admin)
    return admin


def _change_form(user) -> dict:
    return {
        "username": user.username,
        "email": user.email,
        "first_name": "",
        "last_name": "",
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }


def test_saving_an_email_another_account_holds_in_another_case_is_a_form_error(
    client, platform_admin
):
    """Issue 9, finding 7: the case-insensitive unique index raised IntegrityError (a 500)."""
    UserFactory(email="ada@st-aurelia.example")
    other = UserFactory(email="other@example.org")

    response = client.post(
        f"/admin/auth/user/{other.pk}/change/",
        {**_change_form(other), "email": "ADA@St-Aurelia.example"},
    )

    assert response.status_code == 200
    assert "Another account already uses this e-mail address" in response.content.decode()
    assert get_user_model().objects.get(pk=other.pk).email == "other@example.org"


def test_saving_ones_own_email_in_another_case_is_allowed(client, platform_admin):
    user = UserFactory(email="ben@northfield.example")

    response = client.post(
        f"/admin/auth/user/{user.pk}/change/",
        {**_change_form(user), "email": "Ben@Northfield.example"},
    )

    assert response.status_code == 302
    assert (
        get_user_model().objects.get(pk=user.pk).email == "Ben@northfield.example"
    )  # domain normalised


def test_membership_form_with_a_junk_user_id_is_a_form_error(client, platform_admin):
    """Django's autocomplete widget queried the related table with the junk id (ValueError)."""
    institution = InstitutionFactory()
    membership = MembershipFactory(institution=institution)

    response = client.post(
        f"/admin/portal/membership/{membership.pk}/change/",
        {"user": "not-a-number", "institution": str(institution.pk), "role": "researcher"},
    )

    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
