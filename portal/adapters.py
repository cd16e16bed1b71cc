"""Boundary to django-allauth: who may sign up, and how a single sign-on becomes a portal user.

Contract:

- Identity is (IdP, subject): ``SocialAccount(provider=<IdP provider_id>, uid=<subject>)``. An e-mail
  address never links a sign-on to an existing account: when an IdP asserts an e-mail that another
  account already holds (compared case-insensitively), the sign-in is refused with a clear page.
- A new SSO user becomes a researcher of the IdP's institution.
- A disabled IdP signs nobody in.
- An e-mail address an IdP asserts counts as verified only where that IdP is trusted for it: the
  address is in its institution's e-mail domain (``Institution.email_domain``, which only the
  platform admin sets) and, for OpenID Connect, the IdP itself says ``email_verified``
  (:func:`sso_email_trusted`). Anything else is not stored at all (hostile re-test of issue 9,
  finding 2a): an address another institution's IdP asserts never becomes the account's e-mail
  or username, claims no invitation and reserves nothing, so it cannot lock out the address's
  owner.
- Usernames come from a trusted address's local part, else from the IdP's institution and the
  subject (``inst-b-mallory``), never from an unverified address.
- Local self-sign-up is closed unless ``FRP_OPEN_SIGNUP`` (accounts are onboarded by institutions).
"""

from __future__ import annotations

import re

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.shortcuts import redirect, render
from django.utils.translation import gettext_lazy as _

from portal.models import IdentityProvider, IdPProtocol, Role


def sso_email_trusted(idp: IdentityProvider, email: str, *, idp_says_verified: bool) -> bool:
    """Whether an address ``idp`` asserts counts as verified (see the module docstring).

    ``idp_says_verified``: the OpenID Connect ``email_verified`` claim (SAML has no standard one;
    a SAML assertion is signed by the IdP, so its institution's domain is the whole test).
    """
    trusted = (idp.institution.email_domain or "").strip().lower().lstrip("@")
    domain = (email or "").rpartition("@")[2].strip().lower()
    if not trusted or not domain or not (domain == trusted or domain.endswith("." + trusted)):
        return False
    return idp.protocol == IdPProtocol.SAML or idp_says_verified


class AccountAdapter(DefaultAccountAdapter):
    """Accounts are onboarded by institutions; open self-sign-up only when ``FRP_OPEN_SIGNUP``."""

    #: allauth's own messages, with the way out of a sign-in lock said: the lock counts failures
    #: per account (anyone can set it off by failing to sign in as someone), and allauth lifts it
    #: when the account's password is reset (``_delete_login_attempts_cached_email``), which
    #: needs the account's mailbox.
    error_messages = {
        **DefaultAccountAdapter.error_messages,
        "too_many_login_attempts": _(
            "Too many failed sign-in attempts for this account or from your network. Try again "
            "in a few minutes, or reset your password (Forgot your password?): a completed reset "
            "lifts the lock at once."
        ),
    }

    def is_open_for_signup(self, request) -> bool:
        return settings.FRP_OPEN_SIGNUP

    def _delete_login_attempts_cached_email(self, request, **credentials) -> None:
        """Nothing: allauth calls this on a completed reset for *every* address of the
        resetting account, unverified ones included, and clears every rate of the lock, the
        per-address one too — so anyone could add a victim's address to their own account,
        reset their own password and lift the victim's lock (hostile re-test of F6).
        :func:`lift_sign_in_lock` does it instead, for the owner's verified names only."""


def lift_sign_in_lock(sender, request, user, **kwargs) -> None:
    """On allauth's ``password_reset`` signal: clear the per-account part of the failed-sign-in
    lock (``login_failed``'s ``…/key`` rates) of every name ``user`` signs in with — username
    and each *verified* address of theirs (an unverified one may be someone else's). The
    per-address part (``…/ip``) stays (allauth's own clearing is off, see
    ``AccountAdapter._delete_login_attempts_cached_email``).

    allauth clears the lock for the account's ``EmailAddress`` rows only, so an account locked
    by failures under its *username* stayed locked after its owner reset the password (issue 9,
    F6). The key is allauth's own (``_get_login_attempts_cache_key``), so it follows allauth's
    format; with ``ACCOUNT_LOGIN_ON_PASSWORD_RESET`` the completed reset also signs the owner
    in, so an attacker who locks the account again at once does not keep its owner out."""
    from allauth.account import app_settings as account_settings
    from allauth.account.adapter import get_adapter
    from allauth.account.models import EmailAddress
    from allauth.core.internal import ratelimit

    rates = (account_settings.RATE_LIMITS or {}).get("login_failed") or ""
    per_key = ",".join(r.strip() for r in rates.split(",") if r.strip().endswith("/key"))
    if not per_key:
        return
    adapter = get_adapter(request)
    names = {user.get_username()}
    names |= set(
        EmailAddress.objects.filter(user_id=user.pk, verified=True).values_list("email", flat=True)
    )
    for name in sorted(n for n in names if n):
        ratelimit.clear(
            request,
            app="allauth.account",
            action="login_failed",
            config={"login_failed": per_key},
            key=adapter._get_login_attempts_cache_key(request, username=name),
        )


def _idp_for(sociallogin) -> IdentityProvider | None:
    return (
        IdentityProvider.objects.select_related("institution")
        .filter(provider_id=sociallogin.account.provider)
        .first()
    )


def _says_verified(sociallogin, email: str) -> bool:
    """Whether the IdP's own claims mark ``email`` verified (the provider set each address's
    ``verified`` from OpenID Connect ``email_verified`` before :meth:`pre_social_login` runs)."""
    return any(a.verified for a in sociallogin.email_addresses if a.email.lower() == email.lower())


def _claim_verified_address(request, idp: IdentityProvider, email: str) -> None:
    """A trusted IdP asserts ``email`` (verified) for a new account: refused when another account
    already has it as its e-mail (case-insensitively; accounts are never linked by e-mail). Only
    trusted addresses become an account's e-mail, so no other institution's IdP can hold one."""
    if get_user_model().objects.filter(email__iexact=email).exists():
        _refuse(
            request,
            "This e-mail address belongs to another account",
            f"{idp.institution.name} asserted an e-mail address that an existing portal account "
            "already uses. Accounts are never linked by e-mail; ask your institution admin.",
        )


def _refuse(request, title: str, message: str):
    response = render(
        request, "account/sso_refused.html", {"title": title, "message": message}, status=403
    )
    raise ImmediateHttpResponse(response)


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    """Maps institutional sign-ons to portal users (see the module docstring)."""

    def get_requests_session(self):
        """Every fetch from an IdP goes through the SSRF guard (``portal.oidc_guard``); a refused
        URL or an issuer that does not answer sends the visitor back to the sign-in page with
        the reason, never a 500."""
        from allauth.core import context

        from portal.oidc_guard import IssuerError, guarded_session

        session = guarded_session()
        fetch = session.request

        def request(method, url, *args, **kwargs):
            try:
                return fetch(method, url, *args, **kwargs)
            except IssuerError as exc:
                http_request = context.request
                if http_request is None:
                    raise
                messages.error(http_request, f"Single sign-on is unavailable: {exc}.")
                raise ImmediateHttpResponse(redirect("account_login")) from None

        session.request = request
        return session

    def list_apps(self, request, provider=None, client_id=None):
        """allauth's apps, each OIDC app with its client secret unsealed in memory only: the
        database holds it sealed on the ``IdentityProvider`` (``portal.secretbox``)."""
        from portal.secretbox import SecretBoxError, unseal

        apps = super().list_apps(request, provider=provider, client_id=client_id)
        sealed = dict(
            IdentityProvider.objects.filter(
                social_app__in=[a.pk for a in apps if a.pk]
            ).values_list("social_app_id", "client_secret")
        )
        for app in apps:
            if app.pk in sealed:
                try:
                    app.secret = unseal(sealed[app.pk])
                except SecretBoxError as exc:
                    if request is None:
                        raise
                    _refuse(
                        request, "Sign-in unavailable", f"The portal cannot use this IdP: {exc}."
                    )
        return apps

    def is_open_for_signup(self, request, sociallogin) -> bool:
        idp = _idp_for(sociallogin)
        return bool(idp and idp.enabled)

    def pre_social_login(self, request, sociallogin) -> None:
        idp = _idp_for(sociallogin)
        if idp is None or not idp.enabled:
            _refuse(
                request, "Sign-in refused", "This identity provider is not enabled on the portal."
            )
        if sociallogin.is_existing:
            return
        trusted = []
        for address in sociallogin.email_addresses:
            if sso_email_trusted(idp, address.email, idp_says_verified=bool(address.verified)):
                address.verified = True
                trusted.append(address)
        sociallogin.email_addresses = trusted  # untrusted addresses are not stored at all
        email = (sociallogin.user.email or "").strip()
        if email.lower() not in {a.email.strip().lower() for a in trusted}:
            sociallogin.user.email = email = ""
        if email:
            _claim_verified_address(request, idp, email)

    def populate_user(self, request, sociallogin, data):
        user = super().populate_user(request, sociallogin, data)
        user.email = (user.email or "").strip().lower()
        idp = _idp_for(sociallogin)
        trusted = bool(
            user.email
            and idp
            and sso_email_trusted(
                idp, user.email, idp_says_verified=_says_verified(sociallogin, user.email)
            )
        )
        if trusted:
            base = re.sub(r"[^a-z0-9_.-]", "", user.email.split("@")[0].lower())
        else:  # never an unverified address: the IdP's institution and its subject
            prefix = f"{idp.institution.slug}-" if idp else ""
            base = re.sub(r"[^a-z0-9_.-]", "", f"{prefix}{sociallogin.account.uid}".lower())
        base = (base or "user")[:24]
        User = get_user_model()
        candidate, n = base, 1
        while User.objects.filter(username=candidate).exists():
            n += 1
            candidate = f"{base}{n}"
        user.username = candidate
        return user

    def save_user(self, request, sociallogin, form=None):
        from portal.services import membership_grant

        user = super().save_user(request, sociallogin, form)
        idp = _idp_for(sociallogin)
        if idp is not None:
            membership_grant(by=user, user=user, institution=idp.institution, role=Role.RESEARCHER)
        return user
