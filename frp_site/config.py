"""The site's configuration: the unpacked site kit (``site.toml`` and the files beside it).

``load(kit_dir)`` reads ``site.toml`` (written by the portal, ``federation.onboarding.site_kit``)
and resolves every path against the kit's folder: the CA certificate, the site credential, the
SuperNode key, the keyring and the store (a bare path becomes ``file://<kit>/<path>``; an
``s3://`` or ``s3s://`` URL is used as it is). Raises ``ConfigError`` naming what is missing.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    """The kit folder is incomplete or ``site.toml`` is malformed."""


@dataclass(frozen=True)
class SiteConfig:
    """Everything the site tool needs; paths absolute."""

    kit_dir: Path
    site: str
    name: str
    portal_url: str
    portal_ca: Path
    credential_file: Path
    superlink: str
    superlink_ca: Path
    store_url: str
    keyring_dir: Path
    supernode_key: Path

    def credential(self) -> str:
        """The site credential (``frps_…``). Raises ``ConfigError`` when it is missing."""
        try:
            return self.credential_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"the site credential {self.credential_file} cannot be read") from exc

    def node_config(self) -> dict[str, str]:
        """What the SuperNode tells its ClientApps (``--node-config``): site, store, keyring."""
        return {"site": self.site, "store": self.store_url, "keyring": str(self.keyring_dir)}


def _get(table: dict, dotted: str):
    node = table
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"site.toml has no {dotted}")
        node = node[part]
    if not isinstance(node, str) or not node.strip():
        raise ConfigError(f"site.toml: {dotted} must be a non-empty string")
    return node.strip()


def load(kit_dir: Path) -> SiteConfig:
    """Read the kit in ``kit_dir``."""
    kit_dir = Path(kit_dir).expanduser().resolve()
    path = kit_dir / "site.toml"
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"no site kit in {kit_dir} (site.toml: {exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"site.toml is not valid TOML: {exc}") from exc

    def rel(value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else kit_dir / p

    store = raw.get("storage", {}).get("store", "store")
    store_url = store if "://" in store else rel(store).as_uri()
    return SiteConfig(
        kit_dir=kit_dir,
        site=_get(raw, "site.id"),
        name=raw.get("site", {}).get("name", ""),
        portal_url=_get(raw, "portal.url").rstrip("/"),
        portal_ca=rel(_get(raw, "portal.ca-certificate")),
        credential_file=rel(_get(raw, "portal.credential")),
        superlink=_get(raw, "superlink.address"),
        superlink_ca=rel(_get(raw, "superlink.ca-certificate")),
        store_url=store_url,
        keyring_dir=rel(raw.get("storage", {}).get("keyring", "keyring")),
        supernode_key=rel(raw.get("storage", {}).get("supernode-key", "supernode.key")),
    )
