"""Unit tests of portal services: identity providers, member roles and deactivation, invitations."""

from __future__ import annotations

from datetime import timedelta

import pytest
from allauth.socialaccount.models import SocialApp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from portal import services
from portal.models import (
    AuditEvent,
    IdentityProvider,
    InvitationStatus,
    Membership,
    ProjectMember,
    ProjectRole,
    Role,
)
from portal.secretbox import unseal
from tests.factories import InstitutionFactory, ProjectFactory, ProjectMemberFactory, UserFactory

pytestmark = pytest.mark.django_db


def _self_signed_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idp.example")])
    now = timezone.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_idp_configure_oidc_creates_social_app_with_issuer():
    inst = InstitutionFactory(slug="uni")
    idp = services.identity_provider_configure(
        by=None,
        institution=inst,
        protocol="oidc",
        issuer="http://127.0.0.2:9000/",
        client_id="portal",
        client_secret="s",
    )
    app = SocialApp.objects.get(provider_id=idp.provider_id)
    assert app.provider == "openid_connect"
    assert app.settings["server_url"] == "http://127.0.0.2:9000"
    assert (app.client_id, app.secret) == ("portal", "")  # the secret is sealed on the IdP
    assert unseal(idp.client_secret) == "s"
    assert idp.provider_id.startswith("uni-oidc-")
    assert AuditEvent.objects.filter(action="idp.configure", institution=inst).exists()


def test_idp_configure_keeps_secret_when_left_empty():
    inst = InstitutionFactory()
    kwargs = dict(
        by=None, institution=inst, protocol="oidc", issuer="http://i.example", client_id="c"
    )
    services.identity_provider_configure(client_secret="first", **kwargs)
    idp = services.identity_provider_configure(client_secret="", **kwargs)
    assert unseal(idp.client_secret) == "first"
    assert SocialApp.objects.count() == 1


def test_idp_new_issuer_gets_new_provider_id():
    inst = InstitutionFactory()
    kwargs = dict(by=None, institution=inst, protocol="oidc", client_id="c", client_secret="s")
    a = services.identity_provider_configure(issuer="http://old.example", **kwargs).provider_id
    b = services.identity_provider_configure(issuer="http://new.example", **kwargs).provider_id
    assert a != b  # subjects of a new IdP never reach the old IdP's accounts


def test_idp_configure_saml_requires_signed_assertions():
    inst = InstitutionFactory()
    idp = services.identity_provider_configure(
        by=None,
        institution=inst,
        protocol="saml",
        entity_id="https://idp.example/saml",
        sso_url="https://idp.example/sso",
        x509cert=_self_signed_pem(),
    )
    settings = idp.social_app.settings
    assert idp.social_app.provider == "saml"
    assert idp.social_app.client_id == idp.provider_id
    assert settings["advanced"]["want_assertion_signed"] is True
    assert settings["advanced"]["reject_idp_initiated_sso"] is True
    assert "BEGIN" not in settings["idp"]["x509cert"]  # the base64 body python3-saml expects


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"protocol": "oidc", "client_id": "c", "client_secret": "s"}, "issuer"),
        ({"protocol": "saml", "entity_id": "e", "sso_url": "https://x"}, "x509cert"),
        (
            {"protocol": "saml", "entity_id": "e", "sso_url": "https://x", "x509cert": "junk"},
            "x509cert",
        ),
    ],
)
def test_idp_configure_incomplete_names_field(kwargs, field):
    with pytest.raises(services.IdentityProviderError) as err:
        services.identity_provider_configure(by=None, institution=InstitutionFactory(), **kwargs)
    assert field in err.value.field_errors
    assert not IdentityProvider.objects.exists() and not SocialApp.objects.exists()


def test_member_roles_set_grants_and_revokes_exactly():
    inst, user = InstitutionFactory(), UserFactory()
    services.member_roles_set(by=None, user=user, institution=inst, roles=[Role.RESEARCHER])
    services.member_roles_set(
        by=None, user=user, institution=inst, roles=[Role.DATA_STEWARD, Role.INSTITUTION_ADMIN]
    )
    assert set(Membership.objects.filter(user=user).values_list("role", flat=True)) == {
        Role.DATA_STEWARD,
        Role.INSTITUTION_ADMIN,
    }


def test_member_deactivate_ends_sessions():
    inst, user = InstitutionFactory(), UserFactory()
    Membership.objects.create(user=user, institution=inst, role=Role.RESEARCHER)
    client = Client()
    client.post("/accounts/login/", {"login": user.username, "password": "pw-for-tests-123"})
    assert client.get("/").status_code == 200
    assert Session.objects.count() == 1

    services.member_deactivate(by=None, user=user, institution=inst)

    assert Session.objects.count() == 0
    assert client.get("/").status_code == 302  # signed out


def _project_with_pi():
    project = ProjectFactory()
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    return project, pi


def test_invitation_accept_by_addressee_joins_project():
    project, pi = _project_with_pi()
    guest = UserFactory(email="Guest@Other.example")
    inv = services.project_invite(by=pi, project=project, email="guest@other.EXAMPLE")
    services.invitation_accept(by=guest, token=inv.token)
    inv.refresh_from_db()
    assert inv.status == InvitationStatus.ACCEPTED
    assert ProjectMember.objects.filter(
        project=project, user=guest, role=ProjectRole.MEMBER
    ).exists()


def test_invitation_by_non_pi_refused():
    project, _ = _project_with_pi()
    member = ProjectMemberFactory(project=project).user
    with pytest.raises(services.InvitationError):
        services.project_invite(by=member, project=project, email="x@y.example")


def test_invitation_without_its_token_cannot_be_accepted():
    project, pi = _project_with_pi()
    services.project_invite(by=pi, project=project, email="guest@other.example")
    with pytest.raises(services.InvitationError, match="no such invitation"):
        services.invitation_accept(by=UserFactory(email="intruder@x.example"), token="guessed")
    assert not ProjectMember.objects.filter(project=project, user__email="intruder@x.example")


def test_invitation_expired_refused():
    project, pi = _project_with_pi()
    guest = UserFactory(email="guest@other.example")
    inv = services.project_invite(by=pi, project=project, email=guest.email)
    type(inv).objects.filter(pk=inv.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(services.InvitationError, match="expired"):
        services.invitation_accept(by=guest, token=inv.token)
    assert not ProjectMember.objects.filter(project=project, user=guest).exists()


def test_invitation_declined_cannot_be_accepted_later():
    project, pi = _project_with_pi()
    guest = UserFactory(email="guest@other.example")
    inv = services.project_invite(by=pi, project=project, email=guest.email)
    services.invitation_decline(by=guest, token=inv.token)
    with pytest.raises(services.InvitationError, match="declined"):
        services.invitation_accept(by=guest, token=inv.token)


def test_invitation_duplicate_pending_refused():
    project, pi = _project_with_pi()
    services.project_invite(by=pi, project=project, email="a@b.example")
    with pytest.raises(services.InvitationError, match="pending"):
        services.project_invite(by=pi, project=project, email="A@B.example")


def test_last_pi_cannot_step_down():
    project, pi = _project_with_pi()
    with pytest.raises(services.InvitationError, match="principal investigator"):
        services.project_member_role_set(by=pi, project=project, user=pi, role=ProjectRole.MEMBER)
    other = ProjectMemberFactory(project=project).user
    services.project_member_role_set(
        by=pi, project=project, user=other, role=ProjectRole.PRINCIPAL_INVESTIGATOR
    )
    services.project_member_role_set(by=pi, project=project, user=pi, role=ProjectRole.MEMBER)
    assert ProjectMember.objects.get(project=project, user=pi).role == ProjectRole.MEMBER


def test_institution_admin_cannot_deactivate_member_of_another_institution():
    a, b, user = InstitutionFactory(), InstitutionFactory(), UserFactory()
    Membership.objects.create(user=user, institution=a, role=Role.RESEARCHER)
    Membership.objects.create(user=user, institution=b, role=Role.RESEARCHER)
    admin = UserFactory()
    with pytest.raises(services.MemberError):
        services.member_deactivate(by=admin, user=user, institution=a)
    user.refresh_from_db()
    assert user.is_active
    services.member_deactivate(by=UserFactory(is_staff=True), user=user, institution=a)
    user.refresh_from_db()
    assert not user.is_active


def test_dashboard_shows_pending_invitation(client):
    project, pi = _project_with_pi()
    guest = UserFactory(email="guest@other.example")
    inv = services.project_invite(by=pi, project=project, email=guest.email)
    client.force_login(guest)
    page = client.get("/").content.decode()
    assert project.title in page and f"/invitations/{inv.token}/" in page


def test_an_institution_admin_cannot_remove_their_own_admin_role(client):
    """Hostile re-test C: an admin who removed their own role locked the institution out of its
    own pages. Through the members page: the role stays, and the page says why."""
    inst, admin, other = InstitutionFactory(), UserFactory(), UserFactory()
    for user in (admin, other):
        Membership.objects.create(user=user, institution=inst, role=Role.INSTITUTION_ADMIN)
    client.force_login(admin)

    response = client.post(
        f"/institutions/{inst.slug}/members/{admin.pk}/roles/",
        {"roles": [Role.RESEARCHER]},
        follow=True,
    )

    assert "you cannot remove your own admin role" in response.content.decode()
    assert Membership.objects.filter(user=admin, role=Role.INSTITUTION_ADMIN).exists()
    assert not Membership.objects.filter(user=admin, role=Role.RESEARCHER).exists()
    # Another admin may.
    services.member_roles_set(by=other, user=admin, institution=inst, roles=[Role.RESEARCHER])
    assert not Membership.objects.filter(user=admin, role=Role.INSTITUTION_ADMIN).exists()


def test_the_last_admin_keeps_the_role_and_the_account_unless_a_platform_admin_acts():
    inst, admin, steward = InstitutionFactory(), UserFactory(), UserFactory()
    Membership.objects.create(user=admin, institution=inst, role=Role.INSTITUTION_ADMIN)
    Membership.objects.create(user=steward, institution=inst, role=Role.DATA_STEWARD)

    with pytest.raises(services.MemberError, match="no admin left"):
        services.member_roles_set(by=steward, user=admin, institution=inst, roles=[])
    with pytest.raises(services.MemberError, match="no admin left"):
        services.member_deactivate(by=steward, user=admin, institution=inst)
    admin.refresh_from_db()
    assert admin.is_active and Membership.objects.filter(user=admin).count() == 1

    services.member_roles_set(by=UserFactory(is_staff=True), user=admin, institution=inst, roles=[])
    assert not Membership.objects.filter(user=admin).exists()


@pytest.mark.django_db(transaction=True)
def test_two_admins_removing_each_other_at_once_leave_one(monkeypatch):
    """Hostile re-test: on PostgreSQL both removals passed the check (each saw the other admin)
    and the institution was left with none. The first removal is held after its check until the
    second has either finished or is waiting for the first's lock; then let go."""
    import threading

    from django.db import connection, connections

    inst, a, b = InstitutionFactory(), UserFactory(), UserFactory()
    for user in (a, b):
        Membership.objects.create(user=user, institution=inst, role=Role.INSTITUTION_ADMIN)
    checked, go = threading.Event(), threading.Event()
    revoke = services.membership_revoke

    def held_revoke(**kwargs):
        if kwargs["by"] == a:  # the first removal: a takes b's role
            checked.set()
            assert go.wait(timeout=120)
        revoke(**kwargs)

    monkeypatch.setattr(services, "membership_revoke", held_revoke)
    outcome = {}

    def remove(by, user, key):
        try:
            services.member_roles_set(by=by, user=user, institution=inst, roles=[])
            outcome[key] = "removed"
        except services.MemberError as exc:
            outcome[key] = str(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=remove, args=(a, b, "first"))
    first.start()
    assert checked.wait(timeout=120)
    second = threading.Thread(target=remove, args=(b, a, "second"))
    second.start()
    for _ in range(1200):  # until the second is done or waits for a lock (bounded, ≤ 120 s)
        if not second.is_alive():
            break
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                break
        second.join(timeout=0.1)
    go.set()
    first.join(timeout=120)
    second.join(timeout=120)

    assert outcome["first"] == "removed"
    assert "no admin left" in outcome["second"]
    assert Membership.objects.filter(institution=inst, role=Role.INSTITUTION_ADMIN).count() == 1
