"""Boundary to institutions' OpenID Connect issuers: which URLs the portal fetches, and how.

An institution admin types the issuer URL, and an anonymous visitor's sign-in makes the portal
fetch ``<issuer>/.well-known/openid-configuration`` (and then the endpoints it names): without a
guard that is a server-side request to any address (issue 9, finding 3).

Contract:

- :func:`check_url` — ``https`` only (``http`` too while ``DEBUG``: ``FRP_OIDC_ALLOW_HTTP``), no
  credentials in the URL, and
  every address the host is or resolves to is public (``ipaddress``'s ``is_global``): loopback,
  private (RFC 1918, ULA), link-local (with the cloud metadata addresses 169.254.169.254 and
  100.100.100.200), multicast, reserved, unspecified and every other non-global address (RFC 6598
  shared space 100.64.0.0/10, 6to4, the IANA special-purpose blocks) are refused unless ``settings.FRP_OIDC_ALLOWED_HOSTS`` names the host, the address or a network
  (CIDR) holding it. Raises :class:`IssuerError`.
- :func:`guarded_session` — a ``requests`` session that checks every URL it is asked for the same
  way (so a discovery document cannot point the token or key endpoint at an internal address),
  follows no redirects and times out after ``FETCH_TIMEOUT`` seconds; any failure is an
  :class:`IssuerError` "the issuer did not answer: …".
- :func:`discover` — the issuer's discovery document, fetched through that session and checked.

Limit: a name is resolved for the check and again by the connection, so a DNS answer that changes
in between (rebinding) is not caught; the allow-list and https keep that window small.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import requests
from django.conf import settings

FETCH_TIMEOUT = 10  # seconds
_METADATA = {
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack …
    ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
}

#: IANA special-purpose blocks that are not globally reachable (RFC 6890 and its updates), which
#: some Python versions' ``is_global`` still counts as global: checked as well.
_NOT_GLOBAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "100.64.0.0/10",  # RFC 6598 shared address space (carrier-grade NAT)
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "240.0.0.0/4",  # reserved
        "64:ff9b::/96",  # NAT64 (embeds an IPv4 address)
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo, ORCHIDv2 …)
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4 (embeds an IPv4 address)
    )
)


class IssuerError(Exception):
    """The issuer URL is not allowed, or the issuer did not answer; the message says which."""


def _allowed(host: str, addresses: list) -> bool:
    entries = [str(e).strip().lower() for e in settings.FRP_OIDC_ALLOWED_HOSTS if str(e).strip()]
    if host.lower() in entries:
        return True
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue
    return bool(addresses) and all(any(a in n for n in networks) for a in addresses)


def _forbidden(address) -> str | None:
    if address in _METADATA:
        return "a cloud metadata address"
    for test, what in (
        ("is_unspecified", "an unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_private", "a private address"),
        ("is_multicast", "a multicast address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(address, test):
            return what
    if not address.is_global or any(
        address.version == n.version and address in n for n in _NOT_GLOBAL
    ):
        # Every other non-global range (RFC 6598 shared space 100.64.0.0/10, 192.0.0.0/24,
        # 6to4 and other special-purpose blocks of the IANA registries): is_private misses them.
        return "not a public address"
    return None


def _addresses(host: str) -> list:
    """The host's addresses: itself when it is an IP literal, else what it resolves to."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    return sorted({ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}, key=str)


def check_url(url: str, *, must_resolve: bool = True) -> str:
    """``url`` if the portal may fetch it (see the module docstring); else ``IssuerError``.

    ``must_resolve=False`` (saving a setting): a host that does not resolve (yet) is accepted;
    every fetch checks again and then requires it.
    """
    parts = urlsplit(url or "")
    schemes = ("https", "http") if settings.FRP_OIDC_ALLOW_HTTP else ("https",)
    if parts.scheme not in schemes:
        raise IssuerError(
            "the issuer URL must start with https://"
            + (" (or http://: DEBUG is on)" if settings.FRP_OIDC_ALLOW_HTTP else "")
        )
    if parts.username or parts.password:
        raise IssuerError("the issuer URL must not contain a user name or password")
    host = parts.hostname or ""
    if not host:
        raise IssuerError("the issuer URL has no host")
    addresses = _addresses(host)
    if _allowed(host, addresses):
        return url
    for address in addresses:
        why = _forbidden(address)
        if why:
            raise IssuerError(
                f"{host} is {why} ({address}); the portal fetches only public addresses unless "
                "FRP_OIDC_ALLOWED_HOSTS names it"
            )
    if must_resolve and not addresses:
        raise IssuerError(f"the issuer did not answer: {host} does not resolve")
    return url


class _GuardedSession(requests.Session):
    def request(self, method, url, *args, **kwargs):
        check_url(str(url))
        kwargs["allow_redirects"] = False
        kwargs.setdefault("timeout", FETCH_TIMEOUT)
        try:
            response = super().request(method, url, *args, **kwargs)
        except requests.RequestException as exc:
            raise IssuerError(f"the issuer did not answer: {_reason(exc)}") from None
        if response.is_redirect:
            raise IssuerError(
                f"the issuer did not answer: {urlsplit(str(url)).netloc} redirects "
                f"({response.status_code}); give the final URL"
            )
        return response


def _reason(exc: Exception) -> str:
    text = str(exc.__cause__ or exc)
    if "Connection refused" in text:
        return "connection refused"
    if isinstance(exc, requests.Timeout):
        return f"no answer within {FETCH_TIMEOUT} s"
    return type(exc).__name__ + (": " + text[:200] if text else "")


def guarded_session() -> requests.Session:
    """A ``requests.Session`` that fetches only allowed URLs (see the module docstring)."""
    return _GuardedSession()


def discover(issuer: str) -> dict:
    """The issuer's discovery document (OpenID Connect Discovery 1.0 §4), checked.

    Raises ``IssuerError`` when the issuer cannot be fetched, answers an HTTP error or not JSON,
    or its document names another issuer or lacks an endpoint the portal needs.
    """
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    with guarded_session() as session:
        response = session.get(url)
    if response.status_code != 200:
        raise IssuerError(f"the issuer did not answer: HTTP {response.status_code} from {url}")
    try:
        document = response.json()
    except ValueError:
        raise IssuerError(f"the issuer did not answer: {url} is not JSON") from None
    if not isinstance(document, dict):
        raise IssuerError(f"the issuer did not answer: {url} is not a JSON object")
    if str(document.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
        raise IssuerError(
            f"the issuer's document names another issuer ({str(document.get('issuer'))[:100]!r})"
        )
    missing = [
        k for k in ("authorization_endpoint", "token_endpoint", "jwks_uri") if not document.get(k)
    ]
    if missing:
        raise IssuerError(f"the issuer's document lacks {', '.join(missing)}")
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        if document.get(key):
            check_url(str(document[key]), must_resolve=False)
    return document
