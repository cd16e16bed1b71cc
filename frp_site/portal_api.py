"""Boundary to the portal's site API (``/api/site/v1/…``), for the site tool. Imports no Django.

JSON over HTTPS, the server's certificate verified with the kit's CA (``ssl`` with
``cafile``, host name checked); the site credential from the kit as ``Authorization: Bearer``.
Plain ``http://`` is refused unless ``allow_http`` (the development flag
``--insecure-development``). Every failure raises ``PortalError`` with the portal's own message
when it sent one (``{"error": …}``) and the HTTP status (0: no answer).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

from frp_site.config import SiteConfig

TIMEOUT_SECONDS = 60


class PortalError(Exception):
    """The portal refused a request or did not answer."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PortalClient:
    """Calls of one site (``config``) to its portal."""

    config: SiteConfig
    allow_http: bool = False

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        url = f"{self.config.portal_url}/api/site/v1/{path}"
        if url.startswith("http://") and not self.allow_http:
            raise PortalError(
                f"{self.config.portal_url} is plain HTTP: the site tool talks to the portal only "
                "over HTTPS (--insecure-development for a development portal)"
            )
        if not url.startswith(("http://", "https://")):
            raise PortalError(f"the portal URL must be https://, not {self.config.portal_url!r}")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 — http(s) only, checked above
            url,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.config.credential()}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        context = (
            ssl.create_default_context(cafile=str(self.config.portal_ca))
            if url.startswith("https://")
            else None
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=TIMEOUT_SECONDS, context=context
            ) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read() or b"{}").get("error") or exc.reason
            except ValueError:
                message = exc.reason
            raise PortalError(f"the portal refused ({exc.code}): {message}", exc.code) from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PortalError(
                f"the portal at {self.config.portal_url} did not answer: {exc}"
            ) from exc

    def status(self) -> dict:
        """What the portal knows of this site (``GET status``)."""
        return self._request("GET", "status")

    def supernode_key(self, public_key: str) -> dict:
        """Upload the SuperNode's public key; the portal registers it (``node_id``, ``fingerprint``)."""
        return self._request("POST", "supernode-key", {"public_key": public_key})

    def next_version(self, dataset: str) -> int:
        """The version number the next ingest of ``dataset`` takes."""
        return int(self._request("GET", f"datasets/{dataset}/next-version")["version"])

    def dataset_register(self, body: dict) -> dict:
        """Register an ingested version's metadata and suppressed profile (never rows)."""
        return self._request("POST", "datasets", body)

    def versions(self) -> list[dict]:
        """Every registered version of this site's datasets (``store_key``, hashes)."""
        return self._request("GET", "datasets")["versions"]

    def version_object(self, version_id: int, *, size_bytes: int, ciphertext_sha256: str) -> dict:
        """Report a version's object after a key rotation re-wrapped it."""
        return self._request(
            "POST",
            f"versions/{version_id}/object",
            {"size_bytes": size_bytes, "ciphertext_sha256": ciphertext_sha256},
        )
