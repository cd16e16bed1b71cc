"""``manage.py federation_up``: start the local SuperLink and one SuperNode per local site.

TLS is always on (a platform CA under ``FRP_VAR_DIR/federation/pki``, made on first start);
``--insecure-development`` runs the SuperLink and SuperNodes in plain HTTP, for debugging only.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from federation import callbacks, onboarding, pki, runtime
from federation.selectors import local_sites
from frp_site import nodekey
from portal.models import Site


class Command(BaseCommand):
    help = "Start the local Flower federation (SuperLink + SuperNodes) and point the portal at it."

    def add_arguments(self, parser):
        parser.add_argument(
            "--insecure-development",
            action="store_true",
            help="DEVELOPMENT ONLY: no TLS between SuperLink, SuperNodes and the flwr CLI.",
        )

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
        insecure = options["insecure_development"]
        if insecure:
            self.stderr.write(
                "WARNING: TLS is off (--insecure-development): never use this for data."
            )
        try:
            state = runtime.start(
                root, sites, superlink_env=callbacks.serverapp_environment(), insecure=insecure
            )
        except (runtime.RuntimeError_, callbacks.CallbackKeyError, pki.PkiError) as exc:
            raise CommandError(str(exc)) from exc
        runtime.write_state_control_config(
            settings.FRP_FLWR_HOME, settings.FRP_FEDERATION_NAME, state
        )
        # The admin pages show these SuperNodes like any other (registered by the runtime itself).
        for site in sites:
            if site.site in state.node_ids:
                onboarding.site_node_record(
                    site=Site.objects.get(slug=site.site),
                    public_key=nodekey.public_key_of(runtime.site_auth_key(state, site)),
                    node_id=state.node_ids[site.site],
                )
        tls = "plain HTTP (development)" if insecure else f"TLS, CA {state.ca_cert}"
        gateway = (
            f", Fleet gateway at {state.public_address} (the only address sites dial)"
            if state.public_address
            else ""
        )
        self.stdout.write(
            f"SuperLink at {state.superlink_address} ({tls}){gateway}; "
            f"SuperNodes: {', '.join(state.supernodes)}."
        )
