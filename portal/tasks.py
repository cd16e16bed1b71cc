"""Celery tasks of the core, thin and idempotent: sign ledger checkpoints."""

from __future__ import annotations

import logging

from celery import shared_task

from portal.ledger.services import ledger_checkpoint_create

log = logging.getLogger(__name__)


@shared_task(
    name="portal.ledger_checkpoint_create",
    acks_late=True,
    ignore_result=True,
    soft_time_limit=300,
    time_limit=330,
)
def ledger_checkpoint_create_task() -> int | None:
    """Periodic: sign a checkpoint of the ledger if it grew since the last one.

    Idempotent: the service takes the ledger lock and writes nothing when the size is unchanged,
    so a second delivery or an overlapping tick does nothing. Returns the new size, or ``None``.
    """
    checkpoint = ledger_checkpoint_create(by=None)
    if checkpoint is None:
        return None
    log.info("ledger checkpoint signed at size %d", checkpoint.size)
    return checkpoint.size
