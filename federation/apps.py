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
