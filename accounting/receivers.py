"""How accounting takes a finished job from the federation: ``federation.signals.job_finished``
queues ``job_account`` once the job's end has committed. Connected in ``AccountingConfig.ready()``."""

from __future__ import annotations

from functools import partial

from django.db import transaction

from accounting.tasks import job_account_task


def job_account_on_commit(sender, *, job, **kwargs) -> None:
    """Queue the accounting of ``job`` (usage → contribution → billing → credit) after commit."""
    transaction.on_commit(partial(job_account_task.delay, job.pk))
