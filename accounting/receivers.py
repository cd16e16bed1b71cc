"""How accounting takes a finished job from the federation: ``federation.signals.job_finished``
queues the job's accounting chain (usage → contribution → billing → credit, ADR 0015) once the
job's end has committed. Connected in ``AccountingConfig.ready()``.

Nothing is written in the federation's transaction: if the queueing is lost (the broker away),
the job has no accounting steps yet and the periodic sweep starts them.
"""

from __future__ import annotations

from accounting.services.steps import job_accounting_queue_on_commit


def job_account_on_commit(sender, *, job, **kwargs) -> None:
    """Queue the accounting of ``job`` after commit."""
    job_accounting_queue_on_commit([job.pk])
