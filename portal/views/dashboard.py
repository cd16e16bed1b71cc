"""The researcher dashboard."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from federation import selectors as federation_selectors
from portal import selectors


@login_required
def dashboard(request):
    """Projects, recent jobs and memberships of the signed-in user."""
    return render(
        request,
        "portal/dashboard.html",
        {
            "projects": selectors.projects_for_user(user=request.user),
            "jobs": federation_selectors.jobs_for_user(user=request.user)[:10],
            "memberships": request.user.memberships.select_related("institution"),
            "invitations": selectors.invitations_for_user(user=request.user),
        },
    )
