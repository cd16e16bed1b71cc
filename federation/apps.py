"""App config for federation."""

from django.apps import AppConfig


class FederationConfig(AppConfig):
    name = "federation"

    def ready(self) -> None:
        from federation import panels

        panels.register()
