"""Middleware of the portal core: request bodies declared larger than the portal accepts refused
before anything reads them, TOTP required for an institution's admins and data stewards, the
signed-in user's memberships read once per request, and allauth's user-session activity tracking
at most once a minute per session (ADR 0017)."""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import redirect
from django.template.defaultfilters import filesizeformat
from django.urls import reverse

from portal.models import Membership, Role

_EXEMPT_PREFIXES = ("/accounts/", "/static/", "/jobs/callback/")

#: Seconds between two writes of a session's ``last_seen_at`` (allauth's ``UserSession``) while
#: its client (IP address and user agent) stays the same; a changed client is written at once.
SESSION_ACTIVITY_SECONDS = 60
_SEEN_KEY = "_frp_session_seen"


def own_body_limit(view):
    """Marks a view that bounds its own request body (a dataset upload: it streams the file and
    refuses one larger than ``FRP_MAX_UPLOAD_BYTES`` with its form and a message), so that
    :class:`BodyLimitMiddleware` leaves it the request. Returns ``view``."""
    view.own_body_limit = True
    return view


class BodyLimitMiddleware:
    """Refuses (413, a sentence naming the limit) a request whose declared body
    (``Content-Length``) is larger than ``settings.FRP_MAX_UPLOAD_BYTES``, before any middleware
    or view reads a byte of it, unless its view is marked :func:`own_body_limit`.

    Why: Django parses a multipart body of any size into temporary files when a view (or the
    CSRF check) first reads ``request.POST``, so an anonymous 1.5 GB POST to the sign-in page
    filled the disk, and the development server then read what was left of it into memory
    (issue 9, hostile re-test A). A body sent without a length is bounded by Django's own
    limits (``DATA_UPLOAD_MAX_MEMORY_SIZE``, the upload's streaming check)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            return self.get_response(request)
        finally:
            close_partial_uploads(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        if getattr(view_func, "own_body_limit", False):
            return None
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        limit = settings.FRP_MAX_UPLOAD_BYTES
        if declared <= limit:
            return None
        response = HttpResponse(
            f"The request body ({filesizeformat(declared)}) is larger than the portal accepts "
            f"({filesizeformat(limit)}, FRP_MAX_UPLOAD_BYTES); nothing was read or stored.\n",
            status=413,
            content_type="text/plain; charset=utf-8",
        )
        return response


def close_partial_uploads(request) -> None:
    """Close (and so delete) the temporary file each upload handler of ``request`` still holds.

    Django closes the uploaded files of a parsed body at the end of the request and those of a
    parse that failed after a file was complete; a file part still being written when the body
    stopped (a client that disconnected part-way, an anonymous POST anywhere) stays open in its
    handler, which holds the request while the request holds it, so it left the disk only when
    the garbage collector ran (issue 9, hostile re-test A2). Closing a closed file does nothing."""
    for handler in getattr(request, "_upload_handlers", None) or ():
        upload = getattr(handler, "file", None)
        if upload is not None and hasattr(upload, "close"):
            upload.close()


def request_memberships(request) -> list[Membership]:
    """The signed-in user's memberships with their institutions, read once per request (one
    query; ``[]`` when anonymous). The MFA rule below and the navigation use the same list."""
    cached = getattr(request, "_frp_memberships", None)
    if cached is not None:
        return cached
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        rows: list[Membership] = []
    else:
        rows = list(Membership.objects.filter(user=user).select_related("institution"))
    request._frp_memberships = rows
    return rows


class RequireMFAMiddleware:
    """Send staff of an institution that requires MFA to TOTP set-up until they have it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if (
            user is not None
            and user.is_authenticated
            and not request.path.startswith(_EXEMPT_PREFIXES)
            and _mfa_required(request)
            and not _has_totp(user)
        ):
            return redirect(reverse("mfa_activate_totp"))
        return self.get_response(request)


def _mfa_required(request) -> bool:
    return any(
        m.role in (Role.INSTITUTION_ADMIN, Role.DATA_STEWARD)
        and m.institution.require_mfa_for_staff
        for m in request_memberships(request)
    )


def _has_totp(user) -> bool:
    from allauth.mfa.models import Authenticator

    return Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()


class UserSessionsMiddleware:
    """allauth's ``UserSessionsMiddleware`` (``USERSESSIONS_TRACK_ACTIVITY``), throttled.

    allauth records every request of a signed-in user (a transaction with a read and an UPDATE
    of ``usersessions_usersession``: five queries and a commit per page). Here a session's
    activity is recorded on its first request, when its client (IP address, user agent) changes
    — so allauth's ``session_client_changed`` signal still fires at once — and otherwise at most
    every :data:`SESSION_ACTIVITY_SECONDS`; ``last_seen_at`` is then accurate to that interval.
    The time and a hash of the client are kept in the session itself.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from allauth.usersessions.internal import usersessionkit

        session = getattr(request, "session", None)
        user = getattr(request, "user", None)
        if session is not None and user is not None and user.is_authenticated:
            client = hashlib.sha256(
                "\0".join(
                    (request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_USER_AGENT", ""))
                ).encode()
            ).hexdigest()[:16]
            seen = session.get(_SEEN_KEY)
            now = time.time()
            if (
                not isinstance(seen, list)
                or len(seen) != 2
                or seen[1] != client
                or not isinstance(seen[0], (int, float))
                or now - seen[0] >= SESSION_ACTIVITY_SECONDS
            ):
                usersessionkit.track_activity(request, user=user, session=session)
                if session.session_key:
                    session[_SEEN_KEY] = [now, client]
        return self.get_response(request)
