"""``manage.py federation_down``: stop the local federation started by ``federation_up``."""

from django.conf import settings
from django.core.management.base import BaseCommand

from federation import runtime


class Command(BaseCommand):
    help = "Stop the local Flower federation."

    def handle(self, *args, **options):
        try:
            state = runtime.load_state(settings.FRP_FEDERATION_DIR)
        except runtime.RuntimeError_ as exc:
            self.stdout.write(str(exc))
            return
        runtime.stop(state)
        self.stdout.write("Federation stopped.")
