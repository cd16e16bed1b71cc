"""App config for the portal core."""

from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal core"

    def ready(self) -> None:
        from allauth.account.signals import password_reset

        from portal.adapters import lift_sign_in_lock

        password_reset.connect(lift_sign_in_lock, dispatch_uid="portal.lift_sign_in_lock")
