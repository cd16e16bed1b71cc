"""Projects across institutions: list, create, members and roles, invitations (accept / decline)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from portal import selectors, services
from portal.forms import InviteForm, ProjectCreateForm
from portal.models import InvitationStatus, Project, ProjectInvitation, ProjectRole
from portal.permissions import can


def _project_or_404(request, slug: str) -> Project:
    try:
        return selectors.projects_for_user(user=request.user).get(slug=slug)
    except Project.DoesNotExist:
        raise Http404("No such project") from None


@login_required
def project_list(request):
    """The user's projects and the invitations waiting for them."""
    return render(
        request,
        "portal/projects/list.html",
        {
            "projects": selectors.projects_for_user(user=request.user),
            "invitations": selectors.invitations_for_user(user=request.user),
            "can_create": can(request.user, "project.create"),
        },
    )


@login_required
def project_create(request):
    """A researcher starts a project and becomes its principal investigator."""
    if not can(request.user, "project.create"):
        raise Http404("Only researchers create projects")
    form = ProjectCreateForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        base = slugify(form.cleaned_data["title"])[:40] or "project"
        slug, n = base, 1
        while Project.objects.filter(slug=slug).exists():
            n += 1
            slug = f"{base}-{n}"
        try:
            project = services.project_create(
                by=request.user,
                slug=slug,
                title=form.cleaned_data["title"],
                institution=form.cleaned_data["institution"],
                description=form.cleaned_data["description"],
            )
        except IntegrityError:
            form.add_error("title", "A project with this name was just created; choose another.")
        else:
            messages.success(request, "Project created. Invite your collaborators.")
            return redirect("portal:project_detail", slug=project.slug)
    return render(request, "portal/projects/form.html", {"form": form})


@login_required
def project_detail(request, slug: str):
    """Members (with institutions and roles), invitations (PI), grants and jobs."""
    project = _project_or_404(request, slug)
    is_pi = can(request.user, "project.invite", project)
    return render(
        request,
        "portal/projects/detail.html",
        {
            "project": project,
            "members": project.memberships.select_related("user").prefetch_related(
                "user__memberships__institution"
            ),
            "invitations": project.invitations.filter(status=InvitationStatus.PENDING)
            if is_pi
            else [],
            "grants": project.access_requests.select_related("dataset__site__institution"),
            "jobs": project.jobs.order_by("-created_at")[:10],
            "is_pi": is_pi,
            "invite_form": InviteForm(),
            "role_choices": ProjectRole.choices,
        },
    )


@login_required
@require_POST
def project_invite(request, slug: str):
    project = _project_or_404(request, slug)
    form = InviteForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Enter a valid e-mail address.")
    else:
        try:
            services.project_invite(
                by=request.user,
                project=project,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                base_url=request.build_absolute_uri("/"),
            )
        except services.InvitationError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Invitation sent to {form.cleaned_data['email']}.")
    return redirect("portal:project_detail", slug=slug)


@login_required
@require_POST
def project_member_role(request, slug: str, user_id: int):
    project = _project_or_404(request, slug)
    user = get_object_or_404(get_user_model(), pk=user_id, project_memberships__project=project)
    role = request.POST.get("role", "")
    if role not in ProjectRole.values:
        messages.error(request, "Unknown project role.")
    else:
        try:
            services.project_member_role_set(by=request.user, project=project, user=user, role=role)
        except services.InvitationError as exc:
            messages.error(request, str(exc))
    return redirect("portal:project_detail", slug=slug)


@login_required
def invitation_respond(request, token: str):
    """The invitation's page, reached by its single-use link: accept or decline.

    The link is the credential (e-mailed to the invited address, or listed for an account holding
    that address verified); once answered it opens nothing more.
    """
    invitation = get_object_or_404(
        ProjectInvitation.objects.select_related("project__institution", "invited_by"), token=token
    )
    if request.method == "POST":
        try:
            if request.POST.get("answer") == "accept":
                services.invitation_accept(by=request.user, token=token)
                messages.success(request, f"You joined {invitation.project.title}.")
                return redirect("portal:project_detail", slug=invitation.project.slug)
            services.invitation_decline(by=request.user, token=token)
            messages.info(request, "Invitation declined.")
            return redirect("portal:project_list")
        except services.InvitationError as exc:
            messages.error(request, str(exc))
    return render(request, "portal/projects/invitation.html", {"invitation": invitation})
