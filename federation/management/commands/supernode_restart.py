"""``manage.py supernode_restart SITE``: restart one site's SuperNode of the local federation.

The SuperLink and the other sites' SuperNodes keep running (and so do their jobs); the site's
SuperNode registers again under a new node id, which the admin pages show (``manage.py
federation_up`` would restart nothing that runs, and a new federation means new ports).
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from federation import runtime


class Command(BaseCommand):
    help = "Restart one site's SuperNode alone (the SuperLink and the other sites keep running)."

    def add_arguments(self, parser):
        parser.add_argument("site", help="The site's id (slug), e.g. hospital-a.")
        parser.add_argument(
            "--root",
            default=None,
            help="The local federation's folder (default: <FRP_VAR_DIR>/federation).",
        )

    def handle(self, *args, site: str, root: str | None, **options):
        folder = Path(root) if root else settings.FRP_FEDERATION_DIR
        try:
            pid = runtime.supernode_restart(folder, site)
        except runtime.RuntimeError_ as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"SuperNode of {site} restarted (pid {pid}); the SuperLink and the other sites' "
            "SuperNodes were not touched."
        )
