"""Reads for the portal core, scoped by permission."""

from portal.models import Institution, Membership, Project


def user_roles(*, user) -> set[str]:
    """Return the set of role values (``Role``) the user holds at any institution."""
    roles = set(Membership.objects.filter(user=user).values_list("role", flat=True))
    if user.is_staff:
        roles.add("platform_admin")
    return roles


def user_institutions(*, user):
    """Institutions where the user holds any role."""
    return Institution.objects.filter(memberships__user=user).distinct()


def projects_for_user(*, user):
    """Projects the user is a member of, lead institution joined."""
    return Project.objects.filter(memberships__user=user).select_related("institution").distinct()
