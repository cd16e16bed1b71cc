"""Writes and reads of sites and their credentials (the core's part of onboarding by site kit).

An institution admin adds a site (``site_create``); the site kit carries a fresh credential
(``site_credential_issue``: 32 random bytes, URL-safe base64, prefixed ``frps_``; the database keeps
only its SHA-256, so it is shown once and a new kit replaces it). The site's own tool authenticates
with it (``site_authenticate``), never with a person's password. ``site_revoke`` refuses the site
from then on: its credentials stop working and the federation (a receiver of
``portal.signals.site_revoked``) unregisters its SuperNode.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.models import Institution, Site, SiteCredential
from portal.services import audit_record
from portal.signals import site_revoked

TOKEN_PREFIX = "frps_"  # noqa: S105 — a marker, not a secret
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{1,48}[a-z0-9]")


class SiteError(Exception):
    """A site could not be added, or a credential was refused (the message says why)."""


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def site_create(*, by, institution: Institution, slug: str, name: str) -> Site:
    """Add site ``slug`` (3–50 lower-case letters, digits, hyphens) to ``institution``.

    Raises ``SiteError`` for a bad or taken slug.
    """
    slug = (slug or "").strip()
    if not _SLUG.fullmatch(slug):
        raise SiteError(
            "a site id has 3 to 50 lower-case letters, digits and hyphens, "
            "and starts and ends with a letter or digit"
        )
    name = (name or "").strip() or slug
    try:
        with transaction.atomic():
            site = Site.objects.create(institution=institution, slug=slug, name=name[:200])
    except IntegrityError as exc:
        raise SiteError(f"the site id {slug!r} is taken") from exc
    audit_record(by=by, action="site.create", target=site, institution=institution, slug=slug)
    return site


@transaction.atomic
def site_credential_issue(*, by, site: Site) -> str:
    """A new credential for ``site`` (returned once, in clear); earlier ones are revoked.

    Raises ``SiteError`` for a revoked site.
    """
    site = Site.objects.select_for_update().get(pk=site.pk)
    if site.is_revoked:
        raise SiteError(f"site {site.slug} is revoked")
    now = timezone.now()
    site.credentials.filter(revoked_at__isnull=True).update(revoked_at=now)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    cred = SiteCredential.objects.create(
        site=site, token_sha256=_sha256(token), prefix=token[:12], created_by=by
    )
    audit_record(
        by=by,
        action="site.credential_issue",
        target=site,
        institution=site.institution,
        credential=cred.prefix,
    )
    return token


def site_authenticate(token: str) -> Site:
    """The site whose live credential is ``token``; records its use.

    Raises ``SiteError`` for a missing, unknown or revoked credential, or a revoked site.
    """
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 100:
        raise SiteError("no site credential")
    cred = (
        SiteCredential.objects.select_related("site__institution")
        .filter(token_sha256=_sha256(token))
        .first()
    )
    if cred is None or cred.revoked_at is not None or cred.site.is_revoked:
        raise SiteError("the site credential is unknown or revoked")
    SiteCredential.objects.filter(pk=cred.pk).update(last_used_at=timezone.now())
    return cred.site


@transaction.atomic
def site_revoke(*, by, site: Site) -> Site:
    """Revoke ``site``: its credentials stop working and its SuperNode is unregistered (idempotent)."""
    site = Site.objects.select_for_update().get(pk=site.pk)
    if site.is_revoked:
        return site
    site.revoked_at = timezone.now()
    site.save(update_fields=["revoked_at"])
    site.credentials.filter(revoked_at__isnull=True).update(revoked_at=site.revoked_at)
    audit_record(by=by, action="site.revoke", target=site, institution=site.institution)
    site_revoked.send(sender=Site, site=site, by=by)
    return site


def site_from_request(request) -> Site:
    """The site authenticated by ``request``'s ``Authorization: Bearer <credential>`` header.

    Raises ``SiteError`` when there is none or it is refused.
    """
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise SiteError("send the site credential as 'Authorization: Bearer <credential>'")
    return site_authenticate(token.strip())
