"""The researcher dashboard."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from portal import selectors


@login_required
def dashboard(request):
    """Projects, memberships and invitations of the signed-in user; the floors above add their
    panels (``portal.panels`` slots ``dashboard.actions``, ``dashboard.stats``,
    ``dashboard.main``: the federation's recent jobs)."""
    return render(
        request,
        "portal/dashboard.html",
        {
            "projects": selectors.projects_for_user(user=request.user),
            "memberships": request.user.memberships.select_related("institution"),
            "invitations": selectors.invitations_for_user(user=request.user),
        },
    )
