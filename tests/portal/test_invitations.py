"""Issue 9, finding 2: an invitation is claimed by its own single-use link or a verified address.

Reproduced on main: a data steward of another institution added the invited address to their
account on ``/accounts/email/`` (unverified), made it their e-mail and accepted the invitation.
Here every step goes through the real pages (allauth's e-mail page, the project pages) with the
test client; mail is Django's locmem outbox.
"""

from __future__ import annotations

import re

import pytest
from allauth.account.models import EmailAddress
from django.core import mail
from django.test import Client

from portal.models import InvitationStatus, ProjectInvitation, ProjectMember, ProjectRole, Role
from tests.factories import MembershipFactory, ProjectFactory, ProjectMemberFactory, UserFactory

pytestmark = pytest.mark.django_db

INVITED = "guest@partner.example"


@pytest.fixture
def invitation(client, django_capture_on_commit_callbacks) -> ProjectInvitation:
    """The PI invites INVITED through the project page; the invitation e-mail is sent on commit."""
    project = ProjectFactory(title="Cohort study")
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    client.force_login(pi)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/projects/{project.slug}/invite/", {"email": INVITED, "role": ProjectRole.MEMBER}
        )
    assert response.status_code == 302
    client.logout()
    return ProjectInvitation.objects.get(project=project, email=INVITED)


def _link(message) -> str:
    (path,) = re.findall(r"https?://[^/\s]+(/invitations/[^/\s]+/)", message.body)
    return path


def test_an_unverified_address_added_to_an_account_claims_nothing(invitation):
    """The takeover as reproduced: add the invited address, make it the account's e-mail."""
    steward = UserFactory(email="steward@other-hospital.example")
    MembershipFactory(user=steward, role=Role.DATA_STEWARD)
    attacker = Client()
    attacker.force_login(steward)

    added = attacker.post("/accounts/email/", {"action_add": "", "email": INVITED})
    attacker.post("/accounts/email/", {"action_primary": "", "email": INVITED})
    type(steward).objects.filter(pk=steward.pk).update(
        email=INVITED
    )  # even as the account's e-mail

    assert added.status_code in (200, 302)
    assert EmailAddress.objects.get(user=steward, email=INVITED).verified is False
    for page in ("/", "/projects/"):
        html = attacker.get(page).content.decode()
        assert invitation.token not in html and "Cohort study" not in html, page
    refused = attacker.post("/invitations/not-the-token/", {"answer": "accept"})
    assert refused.status_code == 404
    assert not ProjectMember.objects.filter(project=invitation.project, user=steward).exists()
    assert ProjectInvitation.objects.get(pk=invitation.pk).status == InvitationStatus.PENDING


def test_the_invitation_email_carries_a_link_that_works_once(client, invitation):
    (message,) = mail.outbox
    assert message.to == [INVITED] and "Cohort study" in message.subject
    link = _link(message)
    assert link == f"/invitations/{invitation.token}/"
    invitee = UserFactory(email="g.smith@partner.example")  # signs in with another address
    client.force_login(invitee)

    accepted = client.post(link, {"answer": "accept"})
    other = Client()
    other.force_login(UserFactory())
    again = other.post(link, {"answer": "accept"}, follow=True)

    assert accepted.status_code == 302
    assert ProjectMember.objects.filter(project=invitation.project, user=invitee).exists()
    assert "already accepted" in again.content.decode()
    assert ProjectMember.objects.filter(project=invitation.project).count() == 2  # PI + invitee


def test_an_account_holding_the_address_verified_sees_the_invitation(client, invitation):
    invitee = UserFactory(email=INVITED)  # an onboarded account: its address is verified

    client.force_login(invitee)
    page = client.get("/projects/").content.decode()

    assert f"/invitations/{invitation.token}/" in page


def test_a_local_sign_up_must_confirm_its_address_before_signing_in(settings):
    """allauth's mandatory verification: no session until the confirmation link is followed."""
    settings.FRP_OPEN_SIGNUP = True
    browser = Client()
    password = "a-long-enough-passphrase-42"

    signed_up = browser.post(
        "/accounts/signup/",
        {
            "email": "newcomer@partner.example",
            "username": "newcomer",
            "password1": password,
            "password2": password,
        },
    )
    before = browser.get("/")
    login = Client().post("/accounts/login/", {"login": "newcomer", "password": password})

    assert signed_up.status_code == 302 and "confirm-email" in signed_up["Location"]
    assert before.status_code == 302  # not signed in
    assert "confirm-email" in login.get("Location", "") or login.status_code == 200
    address = EmailAddress.objects.get(email="newcomer@partner.example")
    assert address.verified is False
    message = mail.outbox[-1]  # signing in unverified sends the link again (allauth 65.x)
    assert {m.to[0] for m in mail.outbox} == {"newcomer@partner.example"}
    (confirm,) = re.findall(r"https?://[^/\s]+(/accounts/confirm-email/[^/\s]+/)", message.body)

    browser.post(confirm)
    address.refresh_from_db()
    signed_in = Client()
    response = signed_in.post("/accounts/login/", {"login": "newcomer", "password": password})

    assert address.verified is True
    assert response.status_code == 302 and signed_in.get("/").status_code == 200


@pytest.mark.parametrize(
    ("domain", "protocol", "email", "claimed", "trusted"),
    [
        ("inst-a.example", "oidc", "alice@inst-a.example", True, True),
        ("inst-a.example", "oidc", "alice@INST-A.example", True, True),
        ("inst-a.example", "oidc", "alice@med.inst-a.example", True, True),  # a subdomain
        ("inst-a.example", "oidc", "alice@inst-a.example", False, False),  # the IdP says no
        ("inst-a.example", "oidc", "alice@other.example", True, False),  # not its domain
        ("inst-a.example", "oidc", "alice@evilinst-a.example", True, False),  # suffix ≠ subdomain
        ("", "oidc", "alice@inst-a.example", True, False),  # no trusted domain set
        ("inst-c.example", "saml", "dave@inst-c.example", False, True),  # signed assertion
        ("inst-c.example", "saml", "dave@inst-a.example", False, False),
    ],
)
def test_sso_email_trusted_only_in_the_institutions_domain(
    domain, protocol, email, claimed, trusted
):
    from portal.adapters import sso_email_trusted
    from portal.models import IdentityProvider, Institution

    idp = IdentityProvider(
        institution=Institution(slug="i", name="I", email_domain=domain), protocol=protocol
    )

    assert sso_email_trusted(idp, email, idp_says_verified=claimed) is trusted
