"""App config for the demo (management commands only: no models)."""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo federation"
