"""Accounting takes a finished job from the federation's ``job_finished`` signal (connected in
``AccountingConfig.ready()``) and queues the job's chain of steps only once the job's end has
committed; nothing is written in the federation's transaction."""

from __future__ import annotations

import pytest

from accounting.models import JobAccountingStep
from federation.models import FederatedJob
from federation.signals import job_finished
from tests.factories import BillingJobFactory

pytestmark = pytest.mark.django_db


def test_job_finished_queues_the_steps_after_commit(
    eager_celery, django_capture_on_commit_callbacks
):
    job = BillingJobFactory()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job_finished.send(sender=FederatedJob, job=job)
    assert not JobAccountingStep.objects.filter(job=job).exists()  # nothing before the commit
    assert len(callbacks) == 1

    for callback in callbacks:
        callback()  # the chain, run in-process here
    assert sorted(JobAccountingStep.objects.filter(job=job).values_list("step", "status")) == [
        ("billing", "done"),
        ("contribution", "done"),
        ("credit", "done"),
        ("usage", "done"),
    ]


def test_receiver_is_connected_once():
    assert job_finished.has_listeners(FederatedJob)
    keys = [entry[0][0] for entry in job_finished.receivers]  # ((dispatch_uid, sender id), …)
    assert keys.count("accounting.job_account_on_commit") == 1
