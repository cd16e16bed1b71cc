"""App config for accounting."""

from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "accounting"

    def ready(self) -> None:
        from accounting import (
            panels,
            receivers,
            tasks,  # noqa: F401 — registers the step tasks the services chain by name
        )
        from federation.signals import job_finished, job_resumed

        panels.register()
        job_finished.connect(
            receivers.job_account_on_commit, dispatch_uid="accounting.job_account_on_commit"
        )
        job_resumed.connect(
            receivers.job_account_reopen, dispatch_uid="accounting.job_account_reopen"
        )
