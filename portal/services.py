"""Writes of the portal core: audit events, memberships, projects, identity providers, sessions."""

from __future__ import annotations

import hashlib

from django.db import transaction

from portal.models import (
    AuditEvent,
    IdentityProvider,
    IdPProtocol,
    Institution,
    Membership,
    Project,
    ProjectMember,
    ProjectRole,
    Role,
)
from portal.secretbox import seal


def audit_record(
    *, by, action: str, target, institution: Institution | None = None, **data
) -> AuditEvent:
    """Append an audit event for ``target`` (any model instance). Call inside the writer's atomic."""
    return AuditEvent.objects.create(
        actor=by if getattr(by, "is_authenticated", False) else None,
        institution=institution,
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        data=data,
    )


@transaction.atomic
def membership_grant(*, by, user, institution: Institution, role: str) -> Membership:
    """Give ``user`` the ``role`` at ``institution`` (idempotent)."""
    membership, created = Membership.objects.get_or_create(
        user=user, institution=institution, role=role
    )
    if created:
        audit_record(
            by=by, action="membership.grant", target=membership, institution=institution, role=role
        )
    return membership


@transaction.atomic
def project_create(
    *, by, slug: str, title: str, institution: Institution, description: str = ""
) -> Project:
    """Create a project led by ``institution`` with ``by`` as principal investigator."""
    project = Project.objects.create(
        slug=slug, title=title, institution=institution, description=description
    )
    ProjectMember.objects.create(project=project, user=by, role=ProjectRole.PRINCIPAL_INVESTIGATOR)
    audit_record(by=by, action="project.create", target=project, institution=institution)
    return project


@transaction.atomic
def project_member_add(*, by, project: Project, user, role: str = ProjectRole.MEMBER):
    """Add ``user`` to ``project`` (idempotent). Invitations with accept/decline come with SSO."""
    member, created = ProjectMember.objects.get_or_create(
        project=project, user=user, defaults={"role": role}
    )
    if created:
        audit_record(
            by=by,
            action="project.member_add",
            target=project,
            institution=project.institution,
            user=user.username,
        )
    return member


# ---------------------------------------------------------------------------------------------
# Identity providers (single sign-on)
# ---------------------------------------------------------------------------------------------


class IdentityProviderError(Exception):
    """An IdP configuration is incomplete or invalid; ``field_errors`` maps fields to messages."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.field_errors = field_errors or {}


def _provider_id(institution: Institution, protocol: str, key: str) -> str:
    digest = hashlib.sha256(f"{protocol}\n{key}".encode()).hexdigest()[:8]
    return f"{institution.slug}-{protocol}-{digest}"


def _check_certificate(pem: str) -> str:
    """Return the certificate body (base64 DER, one line) of a PEM; raise ``ValueError`` if invalid."""
    from cryptography import x509

    text = pem.strip()
    if "BEGIN CERTIFICATE" not in text:
        text = f"-----BEGIN CERTIFICATE-----\n{text}\n-----END CERTIFICATE-----"
    x509.load_pem_x509_certificate(text.encode())
    body = text.split("-----BEGIN CERTIFICATE-----")[1].split("-----END CERTIFICATE-----")[0]
    return "".join(body.split())


def _oidc_check(
    *, issuer: str, client_id: str, client_secret: str, existing: IdentityProvider | None
) -> tuple[dict[str, list[str]], str]:
    """OpenID Connect settings: ``(per-field errors, the client secret to store)``.

    A given secret is sealed (``portal.secretbox``, a key from the environment); an empty one keeps
    the stored one. The issuer must pass the SSRF guard (the portal fetches from it on every
    sign-in: no internal addresses).
    """
    sealed = seal(client_secret) if client_secret else ""
    sealed = sealed or (existing.client_secret if existing else "")
    errors: dict[str, list[str]] = {}
    for name, value in (("issuer", issuer), ("client_id", client_id), ("client_secret", sealed)):
        if not value:
            errors.setdefault(name, []).append("Required for OpenID Connect.")
    if issuer:
        from portal.oidc_guard import IssuerError, check_url

        try:
            check_url(issuer, must_resolve=False)
        except IssuerError as exc:
            errors.setdefault("issuer", []).append(f"Not allowed: {exc}.")
    return errors, sealed


def _saml_check(*, entity_id: str, sso_url: str, x509cert: str) -> tuple[dict[str, list[str]], str]:
    """SAML 2.0 settings: ``(per-field errors, the certificate body: base64 DER, one line)``."""
    errors: dict[str, list[str]] = {}
    for name, value in (("entity_id", entity_id), ("sso_url", sso_url), ("x509cert", x509cert)):
        if not value:
            errors.setdefault(name, []).append("Required for SAML 2.0.")
    cert_body = ""
    if x509cert:
        try:
            cert_body = _check_certificate(x509cert)
        except ValueError:
            errors.setdefault("x509cert", []).append("Not a valid PEM X.509 certificate.")
    return errors, cert_body


def _social_app_fields(
    *,
    protocol: str,
    name: str,
    provider_id: str,
    issuer: str,
    client_id: str,
    entity_id: str,
    sso_url: str,
    cert_body: str,
    uid_attribute: str,
    email_attribute: str,
) -> dict:
    """The fields of allauth's ``SocialApp`` for a checked IdP (no secret: the sealed one lives
    on the ``IdentityProvider``, ``adapters.list_apps`` hands it over). SAML assertions must be
    signed; IdP-initiated (unsolicited) responses are refused."""
    if protocol == IdPProtocol.OIDC:
        return {
            "provider": "openid_connect",
            "name": name,
            "client_id": client_id,
            "secret": "",
            "settings": {"server_url": issuer.rstrip("/"), "oauth_pkce_enabled": True},
        }
    mapping = {}
    if uid_attribute:
        mapping["uid"] = uid_attribute
    if email_attribute:
        mapping["email"] = email_attribute
    return {
        "provider": "saml",
        "name": name,
        "client_id": provider_id,  # the organisation slug in allauth's SAML URLs
        "secret": "",
        "settings": {
            "idp": {"entity_id": entity_id, "sso_url": sso_url, "x509cert": cert_body},
            "attribute_mapping": mapping,
            "advanced": {
                "want_assertion_signed": True,
                "reject_idp_initiated_sso": True,
                "strict": True,
            },
        },
    }


def _social_app_save(existing: IdentityProvider | None, provider_id: str, fields: dict):
    """Create allauth's ``SocialApp``, or update the one ``existing`` points at; return it."""
    from allauth.socialaccount.models import SocialApp

    app = existing.social_app if existing and existing.social_app_id else None
    if app is None:
        app = SocialApp(provider_id=provider_id, **fields)
    else:
        app.provider_id = provider_id
        for k, v in fields.items():
            setattr(app, k, v)
    app.save()
    return app


@transaction.atomic
def identity_provider_configure(
    *,
    by,
    institution: Institution,
    protocol: str,
    enabled: bool = True,
    display_name: str = "",
    issuer: str = "",
    client_id: str = "",
    client_secret: str = "",
    entity_id: str = "",
    sso_url: str = "",
    x509cert: str = "",
    uid_attribute: str = "",
    email_attribute: str = "",
) -> IdentityProvider:
    """Create or replace the institution's IdP and keep allauth's ``SocialApp`` in step.

    OpenID Connect needs ``issuer``, ``client_id`` and ``client_secret`` (an empty secret on update
    keeps the stored one); SAML needs ``entity_id``, ``sso_url`` and the IdP's signing ``x509cert``
    (PEM). SAML assertions must be signed; IdP-initiated (unsolicited) responses are refused.
    Raises ``IdentityProviderError`` with per-field messages (nothing written then).

    Steps: check the protocol's settings (:func:`_oidc_check` / :func:`_saml_check`), write the
    ``SocialApp`` (:func:`_social_app_fields`, :func:`_social_app_save`), then the
    ``IdentityProvider`` and its audit event.
    """
    existing = IdentityProvider.objects.filter(institution=institution).first()
    cert_body = ""
    if protocol == IdPProtocol.OIDC:
        errors, client_secret = _oidc_check(
            issuer=issuer, client_id=client_id, client_secret=client_secret, existing=existing
        )
        key = issuer.rstrip("/")
    elif protocol == IdPProtocol.SAML:
        errors, cert_body = _saml_check(entity_id=entity_id, sso_url=sso_url, x509cert=x509cert)
        key = entity_id
    else:
        raise IdentityProviderError("unknown protocol", {"protocol": [f"Unknown: {protocol!r}"]})
    if errors:
        raise IdentityProviderError("the identity provider settings are incomplete", errors)

    provider_id = _provider_id(institution, protocol, key)
    app = _social_app_save(
        existing,
        provider_id,
        _social_app_fields(
            protocol=protocol,
            name=display_name or institution.name,
            provider_id=provider_id,
            issuer=issuer,
            client_id=client_id,
            entity_id=entity_id,
            sso_url=sso_url,
            cert_body=cert_body,
            uid_attribute=uid_attribute,
            email_attribute=email_attribute,
        ),
    )

    idp = existing or IdentityProvider(institution=institution)
    idp.protocol = protocol
    idp.enabled = enabled
    idp.provider_id = provider_id
    idp.display_name = display_name
    idp.issuer, idp.client_id, idp.client_secret = issuer, client_id, client_secret
    idp.entity_id, idp.sso_url, idp.x509cert = entity_id, sso_url, x509cert
    idp.uid_attribute, idp.email_attribute = uid_attribute, email_attribute
    idp.social_app = app
    idp.save()
    audit_record(
        by=by,
        action="idp.configure",
        target=idp,
        institution=institution,
        protocol=protocol,
        provider_id=provider_id,
        enabled=enabled,
    )
    return idp


# ---------------------------------------------------------------------------------------------
# Members
# ---------------------------------------------------------------------------------------------


@transaction.atomic
def membership_revoke(*, by, user, institution: Institution, role: str) -> None:
    """Take ``role`` at ``institution`` away from ``user`` (idempotent)."""
    deleted, _ = Membership.objects.filter(user=user, institution=institution, role=role).delete()
    if deleted:
        audit_record(
            by=by, action="membership.revoke", target=user, institution=institution, role=role
        )


def user_sessions_end(*, user) -> int:
    """End every session of ``user`` (allauth user sessions); returns how many were ended."""
    from allauth.usersessions.models import UserSession

    sessions = list(UserSession.objects.filter(user=user))
    for session in sessions:
        session.end()
    return len(sessions)


class MemberError(Exception):
    """A member change is not allowed; the message says why."""


@transaction.atomic
def member_deactivate(*, by, user, institution: Institution):
    """Deactivate ``user`` (a member of ``institution``) and end all of their sessions.

    A user who also holds roles at another institution can only be deactivated by a platform
    admin; an institution admin removes their roles here instead; the institution's last admin
    is not deactivated (:func:`_admin_kept`). Raises ``MemberError``.
    """
    if Membership.objects.filter(
        user=user, institution=institution, role=Role.INSTITUTION_ADMIN
    ).exists():
        _admin_kept(by=by, user=user, institution=institution)
    elsewhere = Membership.objects.filter(user=user).exclude(institution=institution).exists()
    if elsewhere and not getattr(by, "is_staff", False):
        raise MemberError(
            "this person also belongs to another institution; remove their roles here instead, "
            "or ask a platform admin"
        )
    user.is_active = False
    user.save(update_fields=["is_active"])
    ended = user_sessions_end(user=user)
    audit_record(
        by=by,
        action="member.deactivate",
        target=user,
        institution=institution,
        sessions_ended=ended,
    )
    return user


def _admin_kept(*, by, user, institution: Institution) -> None:
    """Raises ``MemberError`` when taking the admin role (or the account) from ``user`` would
    leave ``institution`` without an admin, or when an institution admin would take it from
    themselves: another admin, or a platform admin, does that (hostile re-test C: an admin who
    removed their own role locked the institution out of its own pages)."""
    if getattr(by, "is_staff", False):
        return
    if by == user:
        raise MemberError(
            "you cannot remove your own admin role; another admin of the institution (or a "
            "platform admin) can"
        )
    # Every admin row of the institution is locked before the count: two admins removing each
    # other at once would each see the other and leave none (hostile re-test); the second now
    # waits for the first and then sees no other admin.
    # The rows are taken in one order (by key) and before any other lock of the change, so two
    # such changes queue instead of deadlocking.
    admins = list(
        Membership.objects.select_for_update(of=("self",))
        .filter(institution=institution, role=Role.INSTITUTION_ADMIN, user__is_active=True)
        .order_by("pk")
        .values_list("user_id", flat=True)
    )
    if not [pk for pk in admins if pk != user.pk]:
        raise MemberError("the institution would have no admin left; make someone else admin first")


@transaction.atomic
def member_roles_set(*, by, user, institution: Institution, roles: list[str]) -> set[str]:
    """Make ``user``'s roles at ``institution`` exactly ``roles``; returns the roles now held.

    Raises ``MemberError`` (nothing changes) when it would take the admin role from ``by``
    themselves or from the institution's last admin (:func:`_admin_kept`)."""
    current = set(
        Membership.objects.filter(user=user, institution=institution).values_list("role", flat=True)
    )
    if Role.INSTITUTION_ADMIN in current and Role.INSTITUTION_ADMIN not in set(roles):
        _admin_kept(by=by, user=user, institution=institution)
    for role in set(roles) - current:
        membership_grant(by=by, user=user, institution=institution, role=role)
    for role in current - set(roles):
        membership_revoke(by=by, user=user, institution=institution, role=role)
    return set(roles)


@transaction.atomic
def institution_security_set(*, by, institution: Institution, require_mfa_for_staff: bool) -> None:
    """Require (or not) TOTP for the institution's admins and data stewards."""
    if institution.require_mfa_for_staff != require_mfa_for_staff:
        institution.require_mfa_for_staff = require_mfa_for_staff
        institution.save(update_fields=["require_mfa_for_staff"])
        audit_record(
            by=by,
            action="institution.security",
            target=institution,
            institution=institution,
            require_mfa_for_staff=require_mfa_for_staff,
        )


# ---------------------------------------------------------------------------------------------
# Project invitations
# ---------------------------------------------------------------------------------------------

INVITATION_DAYS = 14


class InvitationError(Exception):
    """An invitation cannot be sent, accepted or declined; the message says why."""


@transaction.atomic
def project_invite(
    *, by, project: Project, email: str, role: str = ProjectRole.MEMBER, base_url: str = ""
):
    """The project's PI invites ``email`` (any institution); valid for ``INVITATION_DAYS`` days.

    The invitation's link (``<base_url>/invitations/<token>/``, a single-use token) is e-mailed to
    the address after the transaction commits: whoever follows it, signed in, may answer once.
    The invitation also shows to an account that holds ``email`` *verified* (``selectors``).
    """
    from datetime import timedelta
    from functools import partial

    from django.core.mail import send_mail
    from django.urls import reverse
    from django.utils import timezone

    from portal.models import InvitationStatus, ProjectInvitation
    from portal.permissions import can

    if not can(by, "project.invite", project):
        raise InvitationError("only the project's principal investigator may invite")
    email = email.strip().lower()
    if project.members.filter(email__iexact=email).exists():
        raise InvitationError(f"{email} is already a member of this project")
    if project.invitations.filter(email__iexact=email, status=InvitationStatus.PENDING).exists():
        raise InvitationError(f"{email} already has a pending invitation")
    invitation = ProjectInvitation.objects.create(
        project=project,
        email=email,
        role=role,
        invited_by=by,
        expires_at=timezone.now() + timedelta(days=INVITATION_DAYS),
    )
    audit_record(
        by=by,
        action="project.invite",
        target=project,
        institution=project.institution,
        email=email,
        role=role,
    )
    link = base_url.rstrip("/") + reverse("portal:invitation_respond", args=[invitation.token])
    inviter = by.get_full_name() or by.username
    transaction.on_commit(
        partial(
            send_mail,
            subject=f"Invitation to {project.title}",
            message=(
                f"{inviter} invites you to the project {project.title!r} "
                f"(led by {project.institution.name}) as {invitation.get_role_display().lower()}.\n\n"
                f"Sign in and answer here (the link works once, until "
                f"{invitation.expires_at:%Y-%m-%d}):\n{link}\n"
            ),
            from_email=None,
            recipient_list=[email],
        ),
        robust=True,  # a mail server hiccup is logged; the invitation shows on the list anyway
    )
    return invitation


def _open_invitation(token: str, user):
    """The pending invitation whose link is ``token``, locked. The token is the credential (it
    was e-mailed to the invited address, or shown to an account holding that address verified);
    it works once: an answered invitation is closed. Raises ``InvitationError``."""
    from portal.models import InvitationStatus, ProjectInvitation

    invitation = ProjectInvitation.objects.select_for_update().filter(token=token).first()
    if invitation is None or not getattr(user, "is_authenticated", False):
        raise InvitationError("no such invitation")
    if invitation.status != InvitationStatus.PENDING:
        raise InvitationError(
            f"this invitation was already {invitation.get_status_display().lower()}"
        )
    if invitation.is_expired():
        raise InvitationError("this invitation has expired; ask the project's PI for a new one")
    return invitation


def _invitation_answer(invitation, *, by, status: str) -> None:
    from django.utils import timezone

    invitation.status = status
    invitation.responded_by = by
    invitation.responded_at = timezone.now()
    invitation.save(update_fields=["status", "responded_by", "responded_at"])
    audit_record(
        by=by,
        action=f"project.invitation_{status}",
        target=invitation.project,
        institution=invitation.project.institution,
    )


@transaction.atomic
def invitation_accept(*, by, token: str) -> ProjectMember:
    """The holder of the invitation's link accepts: they join the project with the invited role.

    Raises ``InvitationError`` for an unknown, answered or expired invitation.
    """
    from portal.models import InvitationStatus

    invitation = _open_invitation(token, by)
    member = project_member_add(by=by, project=invitation.project, user=by, role=invitation.role)
    _invitation_answer(invitation, by=by, status=InvitationStatus.ACCEPTED)
    return member


@transaction.atomic
def invitation_decline(*, by, token: str) -> None:
    """The holder of the invitation's link declines (the link is then used up)."""
    from portal.models import InvitationStatus

    _invitation_answer(_open_invitation(token, by), by=by, status=InvitationStatus.DECLINED)


@transaction.atomic
def project_member_role_set(*, by, project: Project, user, role: str) -> ProjectMember:
    """The PI assigns a project role (``ProjectRole``) to a member."""
    from portal.permissions import can

    if not can(by, "project.invite", project):
        raise InvitationError("only the project's principal investigator may assign roles")
    member = ProjectMember.objects.select_for_update().get(project=project, user=user)
    if (
        member.role == ProjectRole.PRINCIPAL_INVESTIGATOR
        and role != ProjectRole.PRINCIPAL_INVESTIGATOR
        and not project.memberships.filter(role=ProjectRole.PRINCIPAL_INVESTIGATOR)
        .exclude(pk=member.pk)
        .exists()
    ):
        raise InvitationError("a project needs a principal investigator; appoint another one first")
    if member.role != role:
        member.role = role
        member.save(update_fields=["role"])
        audit_record(
            by=by,
            action="project.role_set",
            target=project,
            institution=project.institution,
            user=user.username,
            role=role,
        )
    return member
