"""Pages and API of onboarding by site kit (``federation.onboarding``).

For institution admins (``institution.admin`` on the site's institution): the SuperNode panel of
each site on *Sites & pools* (its state loads by HTMX, since it asks the SuperLink), the kit
download and a form to paste a public key received by other means.

For the site's own tool (``frp_site.portal_api``), authenticated by the site credential from the
kit, JSON in and out, no cookies (hence no CSRF): ``POST /api/site/v1/supernode-key``
(``{"public_key": "ecdsa-sha2-nistp384 …"}``) → 201 ``{"node_id", "fingerprint"}``;
``GET /api/site/v1/status`` → the site and its SuperNode's state.
"""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from federation import onboarding
from portal.models import Site
from portal.permissions import can
from portal.sites import SiteError, site_from_request

MAX_API_BODY = 64 * 1024


def _admin_site_or_404(request, slug: str) -> Site:
    site = get_object_or_404(Site.objects.select_related("institution"), slug=slug)
    if not can(request.user, "institution.admin", site.institution):
        raise Http404("No such site")
    return site


@login_required
@require_GET
def site_node_state(request, slug: str):
    """HTMX partial: the site's SuperNode (key fingerprint, node id, state, last seen)."""
    site = _admin_site_or_404(request, slug)
    rows, error = onboarding.site_nodes_state(sites=[site])
    return render(
        request, "federation/partials/site_node_state.html", {"row": rows[0], "error": error}
    )


@login_required
@require_POST
def site_kit_download(request, slug: str):
    """The site kit (ZIP); a new kit replaces the previous kit's credential."""
    site = _admin_site_or_404(request, slug)
    try:
        kit = onboarding.site_kit(by=request.user, site=site)
    except (onboarding.OnboardingError, SiteError) as exc:
        messages.error(request, f"No kit for {site.slug}: {exc}")
        return redirect("portal:institution_sites", slug=site.institution.slug)
    response = HttpResponse(kit, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="site-kit-{site.slug}.zip"'
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def site_node_key_upload(request, slug: str):
    """Register a public key an admin pasted (the site sent its ``supernode.key.pub``)."""
    site = _admin_site_or_404(request, slug)
    try:
        node = onboarding.site_node_key_submit(
            site=site, public_key=request.POST.get("public_key", ""), by=request.user
        )
    except onboarding.OnboardingError as exc:
        messages.error(request, f"Key for {site.slug} not registered: {exc}")
    else:
        messages.success(request, f"Key {node.fingerprint} registered as SuperNode {node.node_id}.")
    return redirect("portal:institution_sites", slug=site.institution.slug)


def _api_error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _api_site(request) -> Site:
    return site_from_request(request)


@csrf_exempt
@require_POST
def api_supernode_key(request):
    """The site tool uploads its SuperNode's public key; the portal registers it."""
    try:
        site = _api_site(request)
    except SiteError as exc:
        return _api_error(401, str(exc))
    if len(request.body) > MAX_API_BODY:
        return _api_error(413, f"the body exceeds {MAX_API_BODY} bytes")
    try:
        body = json.loads(request.body or b"{}")
        public_key = body["public_key"]
    except (ValueError, KeyError, TypeError):
        return _api_error(400, 'send JSON {"public_key": "<OpenSSH public key line>"}')
    if not isinstance(public_key, str):
        return _api_error(400, "public_key must be a string")
    try:
        node = onboarding.site_node_key_submit(site=site, public_key=public_key)
    except onboarding.OnboardingError as exc:
        return _api_error(400, str(exc))
    return JsonResponse(
        {"site": site.slug, "node_id": node.node_id, "fingerprint": node.fingerprint}, status=201
    )


@csrf_exempt
@require_GET
def api_status(request):
    """What the portal knows of the calling site: its SuperNode's state."""
    try:
        site = _api_site(request)
    except SiteError as exc:
        return _api_error(401, str(exc))
    rows, error = onboarding.site_nodes_state(sites=[site])
    row = rows[0]
    return JsonResponse(
        {
            "site": site.slug,
            "institution": site.institution.name,
            "supernode": {
                "state": row.state,
                "node_id": row.node.node_id if row.node else None,
                "fingerprint": row.node.fingerprint if row.node else None,
                "last_seen": row.last_seen or None,
            },
            "superlink_error": error or None,
        }
    )
