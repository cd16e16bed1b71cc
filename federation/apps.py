"""App config for federation."""

from django.apps import AppConfig


class FederationConfig(AppConfig):
    name = "federation"
