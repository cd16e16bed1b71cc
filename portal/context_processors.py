"""Template context: the navigation a user's roles allow."""

from portal import selectors
from portal.models import Role


def navigation(request):
    """Return the user's roles and the institutions they administer (empty when anonymous)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_roles": set(), "nav_role_labels": [], "nav_admin_institutions": []}
    roles = selectors.user_roles(user=user)
    labels = dict(Role.choices) | {"platform_admin": "Platform admin"}
    return {
        "nav_roles": roles,
        "nav_role_labels": [labels[r] for r in sorted(roles)],
        "nav_admin_institutions": list(selectors.administered_institutions(user=user)[:10]),
    }
