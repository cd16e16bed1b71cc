"""Accounting takes a finished job from the federation's ``job_finished`` signal (connected in
``AccountingConfig.ready()``) and queues ``job_account`` only once the job's end has committed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from accounting import receivers
from federation.models import FederatedJob
from federation.signals import job_finished
from tests.factories import BillingJobFactory

pytestmark = pytest.mark.django_db


def test_job_finished_queues_job_account_after_commit(
    monkeypatch, django_capture_on_commit_callbacks
):
    job = BillingJobFactory()
    queued: list[int] = []
    monkeypatch.setattr(receivers, "job_account_task", SimpleNamespace(delay=queued.append))

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job_finished.send(sender=FederatedJob, job=job)
    assert queued == []  # nothing leaves before the commit

    for callback in callbacks:
        callback()
    assert queued == [job.pk]


def test_receiver_is_connected_once():
    assert job_finished.has_listeners(FederatedJob)
    keys = [entry[0][0] for entry in job_finished.receivers]  # ((dispatch_uid, sender id), …)
    assert keys.count("accounting.job_account_on_commit") == 1
