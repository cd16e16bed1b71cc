"""App config for accounting."""

from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "accounting"

    def ready(self) -> None:
        # Celery's autodiscovery imports only ``accounting.tasks``; billing's tasks live apart.
        from accounting import billing_tasks  # noqa: F401
