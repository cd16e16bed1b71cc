"""App config for federation."""

from django.apps import AppConfig


class FederationConfig(AppConfig):
    name = "federation"

    def ready(self) -> None:
        from federation import (
            panels,
            tasks,  # noqa: F401 — registers the tasks the services send by name
        )

        panels.register()

        from federation.onboarding import on_site_revoked
        from portal.signals import site_revoked

        site_revoked.connect(on_site_revoked, dispatch_uid="federation.on_site_revoked")
