"""How accounting takes a job's ends from the federation. Connected in ``AccountingConfig.ready()``.

* ``federation.signals.job_finished`` queues the job's accounting chain (usage → contribution →
  billing → credit, ADR 0016) once the job's end has committed. Nothing is written in the
  federation's transaction: if the queueing is lost (the broker away), the job has no accounting
  steps yet (or pending ones) and the periodic sweep starts them.
* ``federation.signals.job_resumed`` reopens a failed job's accounting (ADR 0028). This one
  writes in the federation's transaction, on purpose: the resume deletes the metering of the
  rounds after the checkpoint, so the failed run's usage is recorded in the same transaction —
  both commit, or neither (a usage that cannot be recorded refuses the resume).
"""

from __future__ import annotations

from accounting.services.steps import job_accounting_queue_on_commit, job_accounting_reopen


def job_account_on_commit(sender, *, job, **kwargs) -> None:
    """Queue the accounting of ``job`` after commit."""
    job_accounting_queue_on_commit([job.pk])


def job_account_reopen(sender, *, job, from_round: int | None = None, **kwargs) -> None:
    """Record the failed run's usage of ``job`` and reopen its steps (``job_accounting_reopen``);
    raises ``federation.services.JobError`` to refuse the resume when that usage cannot be
    recorded."""
    job_accounting_reopen(job=job, from_round=from_round)
