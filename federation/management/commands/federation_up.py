"""``manage.py federation_up``: start the local SuperLink and one SuperNode per local site."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from federation import callbacks, runtime
from federation.selectors import local_sites


class Command(BaseCommand):
    help = "Start the local Flower federation (SuperLink + SuperNodes) and point the portal at it."

    def handle(self, *args, **options):
        root = settings.FRP_FEDERATION_DIR
        try:
            state = runtime.load_state(root)
            if runtime.is_running(state):
                self.stdout.write(f"Federation already running at {state.superlink_address}.")
                return
            runtime.stop(state)
        except runtime.RuntimeError_:
            pass
        sites = local_sites()
        if not sites:
            raise CommandError("no local sites: run `manage.py demo_seed` first")
        try:
            state = runtime.start(root, sites, superlink_env=callbacks.serverapp_environment())
        except (runtime.RuntimeError_, callbacks.CallbackKeyError) as exc:
            raise CommandError(str(exc)) from exc
        runtime.write_control_config(
            settings.FRP_FLWR_HOME, settings.FRP_FEDERATION_NAME, state.superlink_address
        )
        self.stdout.write(
            f"SuperLink at {state.superlink_address}; SuperNodes: {', '.join(state.supernodes)}."
        )
