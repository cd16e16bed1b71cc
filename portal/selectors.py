"""Reads for the portal core, scoped by permission."""

from __future__ import annotations

from django.db.models import Q

from portal.models import AuditEvent, IdentityProvider, Institution, Membership, Project


def user_roles(*, user) -> set[str]:
    """Return the set of role values (``Role``) the user holds at any institution."""
    roles = set(Membership.objects.filter(user=user).values_list("role", flat=True))
    if user.is_staff:
        roles.add("platform_admin")
    return roles


def administered_institutions(*, user):
    """Institutions whose admin pages the user may open."""
    from portal.models import Role

    if user.is_staff:
        return Institution.objects.all()
    return Institution.objects.filter(
        memberships__user=user, memberships__role=Role.INSTITUTION_ADMIN
    ).distinct()


def projects_for_user(*, user):
    """Projects the user is a member of, lead institution joined."""
    return Project.objects.filter(memberships__user=user).select_related("institution").distinct()


def sso_choices(*, q: str = ""):
    """Enabled identity providers with their institutions, filtered by name or e-mail domain."""
    idps = IdentityProvider.objects.filter(enabled=True).select_related("institution")
    if q:
        idps = idps.filter(
            Q(institution__name__icontains=q) | Q(institution__email_domain__icontains=q)
        )
    return idps.order_by("institution__name")


def idp_for_email(email: str) -> IdentityProvider | None:
    """The enabled IdP of the institution whose e-mail domain matches ``email`` (or a parent of it)."""
    domain = email.rpartition("@")[2].strip().lower()
    if not domain:
        return None
    candidates = {domain}
    parts = domain.split(".")
    candidates.update(".".join(parts[i:]) for i in range(1, len(parts) - 1))
    return (
        IdentityProvider.objects.filter(enabled=True, institution__email_domain__in=candidates)
        .select_related("institution")
        .first()
    )


def institution_members(*, institution):
    """Users with a role at ``institution``: list of ``(user, [role values])``, by name."""
    rows: dict[int, tuple] = {}
    for m in (
        Membership.objects.filter(institution=institution)
        .select_related("user")
        .prefetch_related("user__socialaccount_set")
        .order_by("user__last_name", "user__username")
    ):
        rows.setdefault(m.user_id, (m.user, []))[1].append(m.role)
    return list(rows.values())


def institution_audit(*, institution):
    """The institution's audit events, newest first, actor joined."""
    return AuditEvent.objects.filter(institution=institution).select_related("actor")


def verified_emails(*, user) -> list[str]:
    """The user's e-mail addresses that are verified (lower-cased): a confirmation link followed,
    or asserted by an IdP trusted for the address's domain (``portal.adapters``)."""
    from allauth.account.models import EmailAddress

    if not getattr(user, "is_authenticated", False):
        return []
    return [
        e.lower()
        for e in EmailAddress.objects.filter(user=user, verified=True).values_list(
            "email", flat=True
        )
    ]


def invitations_for_user(*, user):
    """Pending, unexpired invitations addressed to one of the user's *verified* e-mail addresses
    (an address merely added to the account claims nothing)."""
    from django.db.models import Q
    from django.utils import timezone

    from portal.models import InvitationStatus, ProjectInvitation

    emails = verified_emails(user=user)
    if not emails:
        return ProjectInvitation.objects.none()
    match = Q()
    for email in emails:
        match |= Q(email__iexact=email)
    return ProjectInvitation.objects.filter(
        match, status=InvitationStatus.PENDING, expires_at__gt=timezone.now()
    ).select_related("project__institution", "invited_by")
