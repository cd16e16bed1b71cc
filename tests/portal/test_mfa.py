"""An institution can require an authenticator app (TOTP, allauth MFA) for its admins and stewards."""

from __future__ import annotations

import pytest
from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret
from django.urls import reverse

from portal.models import Membership, Role
from tests.factories import InstitutionFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def strict_institution():
    return InstitutionFactory(require_mfa_for_staff=True)


@pytest.mark.parametrize("role", [Role.DATA_STEWARD, Role.INSTITUTION_ADMIN])
def test_staff_without_totp_are_sent_to_set_it_up(client, strict_institution, role):
    user = UserFactory()
    Membership.objects.create(user=user, institution=strict_institution, role=role)
    client.force_login(user)
    response = client.get(reverse("portal:dashboard"))
    assert response.status_code == 302
    assert response["Location"] == reverse("mfa_activate_totp")


def test_staff_with_totp_get_through(client, strict_institution):
    user = UserFactory()
    Membership.objects.create(user=user, institution=strict_institution, role=Role.DATA_STEWARD)
    TOTP.activate(user, generate_totp_secret())
    client.force_login(user)
    assert client.get(reverse("portal:dashboard")).status_code == 200


def test_researchers_are_not_required(client, strict_institution):
    user = UserFactory()
    Membership.objects.create(user=user, institution=strict_institution, role=Role.RESEARCHER)
    client.force_login(user)
    assert client.get(reverse("portal:dashboard")).status_code == 200


def test_institution_not_requiring_mfa_lets_staff_through(client):
    user = UserFactory()
    Membership.objects.create(user=user, institution=InstitutionFactory(), role=Role.DATA_STEWARD)
    client.force_login(user)
    assert client.get(reverse("portal:dashboard")).status_code == 200
