"""The institution admin's own pages: members and roles, IdP settings, sites and pools, audit log."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal import selectors, services
from portal import sites as site_services
from portal.forms import IdentityProviderForm, MemberRolesForm, SiteAddForm
from portal.models import IdentityProvider, Institution, Membership, Role
from portal.permissions import can


def _institution_or_404(request, slug: str) -> Institution:
    institution = get_object_or_404(Institution, slug=slug)
    if not can(request.user, "institution.admin", institution):
        raise Http404("No such institution")
    return institution


@login_required
def members(request, slug: str):
    """Members and their roles, paginated."""
    institution = _institution_or_404(request, slug)
    page = Paginator(selectors.institution_members(institution=institution), 25).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "portal/institution/members.html",
        {
            "institution": institution,
            "page_obj": page,
            "tab": "members",
            "role_choices": Role.choices,
        },
    )


@login_required
@require_POST
def member_roles(request, slug: str, user_id: int):
    """Set a member's roles at the institution (the boxes ticked are the roles they keep)."""
    institution = _institution_or_404(request, slug)
    if not Membership.objects.filter(institution=institution, user_id=user_id).exists():
        raise Http404("No such member")
    user = get_object_or_404(get_user_model(), pk=user_id)
    form = MemberRolesForm(request.POST)
    if form.is_valid():
        try:
            services.member_roles_set(
                by=request.user,
                user=user,
                institution=institution,
                roles=form.cleaned_data["roles"],
            )
        except services.MemberError as exc:
            messages.error(request, f"Roles not changed: {exc}.")
        else:
            messages.success(request, f"Roles of {user.get_full_name() or user.username} saved.")
    return redirect("portal:institution_members", slug=slug)


@login_required
@require_POST
def member_deactivate(request, slug: str, user_id: int):
    """Deactivate a member; their sessions end at once."""
    institution = _institution_or_404(request, slug)
    if not Membership.objects.filter(institution=institution, user_id=user_id).exists():
        raise Http404("No such member")
    user = get_object_or_404(get_user_model(), pk=user_id)
    if user == request.user:
        messages.error(request, "You cannot deactivate yourself.")
    else:
        try:
            services.member_deactivate(by=request.user, user=user, institution=institution)
        except services.MemberError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"{user.username} deactivated; their sessions were ended.")
    return redirect("portal:institution_members", slug=slug)


@login_required
def identity_provider(request, slug: str):
    """Connect the institution's OIDC or SAML IdP; shows the exact URLs to give the IdP."""
    institution = _institution_or_404(request, slug)
    idp = IdentityProvider.objects.filter(institution=institution).first()
    initial = {"protocol": "oidc", "enabled": True}
    if idp:
        initial.update(
            {
                f: getattr(idp, f)
                for f in (
                    "protocol",
                    "enabled",
                    "display_name",
                    "issuer",
                    "client_id",
                    "entity_id",
                    "sso_url",
                    "x509cert",
                    "uid_attribute",
                    "email_attribute",
                )
            }
        )
    initial["require_mfa_for_staff"] = institution.require_mfa_for_staff
    form = IdentityProviderForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        require_mfa = data.pop("require_mfa_for_staff")
        try:
            idp = services.identity_provider_configure(
                by=request.user, institution=institution, **data
            )
            services.institution_security_set(
                by=request.user, institution=institution, require_mfa_for_staff=require_mfa
            )
        except services.IdentityProviderError as exc:
            for field, errors in exc.field_errors.items():
                for error in errors:
                    form.add_error(field if field in form.fields else None, error)
        else:
            messages.success(request, "Identity provider saved. Give your IdP the URLs below.")
            if idp.protocol == "oidc" and idp.enabled:
                from portal.oidc_guard import IssuerError, discover

                try:  # the same fetch a sign-in makes: tell the admin now, not the users later
                    discover(idp.issuer)
                except IssuerError as exc:
                    messages.warning(
                        request, f"Saved, but sign-in will fail until this is fixed: {exc}."
                    )
            return redirect("portal:institution_idp", slug=slug)
    return render(
        request,
        "portal/institution/idp.html",
        {
            "institution": institution,
            "form": form,
            "idp": idp,
            "endpoints": idp.endpoints(request) if idp else {},
            "tab": "idp",
        },
    )


@login_required
def sites(request, slug: str):
    """The institution's sites, and a form to add one (then its kit, from the federation's panel:
    slot ``institution.site``, which also shows each SuperNode's state and the compute pools)."""
    institution = _institution_or_404(request, slug)
    form = SiteAddForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            site = site_services.site_create(
                by=request.user,
                institution=institution,
                slug=form.cleaned_data["slug"],
                name=form.cleaned_data["name"],
            )
        except site_services.SiteError as exc:
            form.add_error("slug", str(exc))
        else:
            messages.success(request, f"Site {site.slug} added: download its kit below.")
            return redirect("portal:institution_sites", slug=institution.slug)
    return render(
        request,
        "portal/institution/sites.html",
        {
            "institution": institution,
            "sites": institution.sites.order_by("slug"),
            "form": form,
            "tab": "sites",
        },
        status=400 if form.errors else 200,
    )


@login_required
@require_POST
def site_revoke(request, slug: str, site_slug: str):
    """Revoke a site: its credential stops working and its SuperNode is unregistered."""
    institution = _institution_or_404(request, slug)
    site = get_object_or_404(institution.sites, slug=site_slug)
    site_services.site_revoke(by=request.user, site=site)
    messages.success(request, f"Site {site.slug} revoked: the SuperLink refuses its SuperNode.")
    return redirect("portal:institution_sites", slug=institution.slug)


@login_required
def audit(request, slug: str):
    """Who did what, when, to which object, at this institution."""
    institution = _institution_or_404(request, slug)
    page = Paginator(selectors.institution_audit(institution=institution), 50).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "portal/institution/audit.html",
        {"institution": institution, "page_obj": page, "tab": "audit"},
    )
