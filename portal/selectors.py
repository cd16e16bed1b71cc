"""Reads for the portal core, scoped by permission."""

from __future__ import annotations

from django.db.models import Prefetch, Q

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
        pk__in=Membership.objects.filter(user=user, role=Role.INSTITUTION_ADMIN).values(
            "institution_id"
        )
    )


def projects_for_user(*, user):
    """Projects the user is a member of, lead institution joined (an ``IN (subquery)``: one row
    per project without a ``DISTINCT``)."""
    from portal.models import ProjectMember

    return Project.objects.filter(
        pk__in=ProjectMember.objects.filter(user=user).values("project_id")
    ).select_related("institution")


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


class MemberRows:
    """The members of an institution as a sequence of ``(user, [role values])`` for a
    ``Paginator``: counted and sliced in the database, so a page reads its 25 users (with their
    roles there and their SSO accounts prefetched: three queries) whatever the institution's size."""

    def __init__(self, institution) -> None:
        from django.contrib.auth import get_user_model

        self.institution = institution
        self.users = (
            get_user_model()
            .objects.filter(
                pk__in=Membership.objects.filter(institution=institution).values("user_id")
            )
            .prefetch_related(
                Prefetch(
                    "memberships",
                    queryset=Membership.objects.filter(institution=institution).order_by("role"),
                    to_attr="roles_here",
                ),
                "socialaccount_set",
            )
            .order_by("last_name", "username", "pk")
        )

    def count(self) -> int:
        return self.users.count()

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [(u, [m.role for m in u.roles_here]) for u in self.users[key]]
        user = self.users[key]
        return (user, [m.role for m in user.roles_here])


def institution_members(*, institution) -> MemberRows:
    """Users with a role at ``institution``: a sequence of ``(user, [role values])`` by last
    name, username (:class:`MemberRows`, for a ``Paginator``)."""
    return MemberRows(institution)


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
