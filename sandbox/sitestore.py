"""Where a site that runs beside the portal keeps its encrypted store and its keyring.

A site "runs beside the portal" when it has a directory ``FRP_SITES_DIR/<site slug>/`` on this
machine — the layout ``manage.py demo_seed`` creates and ``manage.py federation_up`` hands to each
SuperNode (``federation.selectors.local_sites``): the object store is ``<dir>/store`` (a
``FilesystemStore``) and the keyring ``<dir>/keyring`` (``SiteKeyring``). Only such sites accept web
uploads and key rotation from the portal; a site on its own host ingests with
``manage.py dataset_ingest --store URL --keyring DIR`` there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from sandbox.keyring import SiteKeyring
from sandbox.storage import ObjectStore, store_from_url


@dataclass(frozen=True)
class SiteStorage:
    """A site's object store URL (``file:///…`` or ``s3://…``) and keyring directory."""

    site: str
    store_url: str
    keyring_dir: Path

    def store(self) -> ObjectStore:
        """The site's object store (raises ``StorageError`` for a bad URL)."""
        return store_from_url(self.store_url)

    def keyring(self) -> SiteKeyring:
        """The site's keyring (reading it does not create the directory)."""
        return SiteKeyring(self.keyring_dir)


def site_dir(slug: str) -> Path:
    """The local directory of site ``slug`` (whether or not it exists)."""
    return Path(settings.FRP_SITES_DIR) / slug


def local_site_storage(site) -> SiteStorage | None:
    """The store and keyring of ``site`` (a ``portal.models.Site`` or its slug) if it runs beside the
    portal (see module doc), else ``None``."""
    slug = getattr(site, "slug", site)
    root = site_dir(slug)
    if not root.is_dir():
        return None
    return SiteStorage(
        site=slug, store_url=(root / "store").resolve().as_uri(), keyring_dir=root / "keyring"
    )
