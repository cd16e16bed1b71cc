"""Middleware of the portal core: TOTP required for an institution's admins and data stewards."""

from __future__ import annotations

from django.shortcuts import redirect
from django.urls import reverse

from portal.models import Membership, Role

_EXEMPT_PREFIXES = ("/accounts/", "/static/", "/jobs/callback/")


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
            and _mfa_required(user)
            and not _has_totp(user)
        ):
            return redirect(reverse("mfa_activate_totp"))
        return self.get_response(request)


def _mfa_required(user) -> bool:
    return Membership.objects.filter(
        user=user,
        role__in=[Role.INSTITUTION_ADMIN, Role.DATA_STEWARD],
        institution__require_mfa_for_staff=True,
    ).exists()


def _has_totp(user) -> bool:
    from allauth.mfa.models import Authenticator

    return Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()
