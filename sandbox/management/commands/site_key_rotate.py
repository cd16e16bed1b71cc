"""``manage.py site_key_rotate``: a new key-encryption key for a site, every data key re-wrapped."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from sandbox import services
from sandbox.keyring import SiteKeyring
from sandbox.storage import StorageError, store_from_url


class Command(BaseCommand):
    help = (
        "Rotate a site's key-encryption key: re-wrap the data key of every registered version "
        "of the site's datasets (no data is re-encrypted), record the new object hashes, then "
        "delete the old key. Run it again after an interruption: it finishes the rotation."
    )

    def add_arguments(self, parser):
        parser.add_argument("site", help="Slug of the site.")
        parser.add_argument(
            "--store", default=None, help="Store URL; default: the site's local store."
        )
        parser.add_argument(
            "--keyring", default=None, type=Path, help="Keyring directory; default: the local one."
        )

    def handle(self, *args, site, store=None, keyring=None, **opts):
        from portal.models import Site

        try:
            site_obj = Site.objects.select_related("institution").get(slug=site)
        except Site.DoesNotExist:
            raise CommandError(f"no site {site!r} is registered in the portal") from None
        try:
            out = services.site_key_rotate(
                by=None,
                site=site_obj,
                store=store_from_url(store) if store else None,
                keyring=SiteKeyring(keyring) if keyring else None,
            )
        except (services.DatasetError, services.KeyringError, StorageError) as exc:
            raise CommandError(str(exc)) from None
        what = "Finished an interrupted rotation" if out.resumed else "Rotated the key"
        self.stdout.write(
            f"{what} of site {out.site}: {out.rewrapped} version(s) re-wrapped, "
            f"{out.already_done} already re-wrapped; previous key(s) {out.retired} deleted."
        )
