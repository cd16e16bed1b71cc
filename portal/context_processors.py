"""Template context: the navigation a user's roles allow."""

from portal import selectors


def navigation(request):
    """Return ``{"nav_roles": set[str]}`` for the signed-in user (empty when anonymous)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_roles": set()}
    return {"nav_roles": selectors.user_roles(user=user)}
