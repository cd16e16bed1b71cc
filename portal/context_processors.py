"""Template context: the navigation a user's roles allow."""

from portal import selectors
from portal.middleware import request_memberships
from portal.models import Role


def navigation(request):
    """Return the user's roles and the institutions they administer (empty when anonymous)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_roles": set(), "nav_role_labels": [], "nav_admin_institutions": []}
    memberships = request_memberships(request)  # read once per request (portal.middleware)
    roles = {m.role for m in memberships} | ({"platform_admin"} if user.is_staff else set())
    if user.is_staff:
        admin_of = list(selectors.administered_institutions(user=user)[:10])
    else:
        admin_of = sorted(
            {m.institution for m in memberships if m.role == Role.INSTITUTION_ADMIN},
            key=lambda i: (i.name, i.pk),
        )[:10]
    labels = dict(Role.choices) | {"platform_admin": "Platform admin"}
    return {
        "nav_roles": roles,
        "nav_role_labels": [labels[r] for r in sorted(roles)],
        "nav_admin_institutions": admin_of,
    }
