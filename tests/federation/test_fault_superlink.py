"""Fault: the SuperLink killed (SIGKILL to its process group) in the middle of a job.

The job page must say the SuperLink is unreachable within a minute, and the job must end FAILED
within the stated bound: ``FRP_SUPERLINK_LOST_SECONDS`` (here 20 s) plus one reconcile interval
(here 1 s) after the first unanswered tick — the test allows generous slack on both.
"""

from __future__ import annotations

import os
import signal

import pytest
from django.urls import reverse

from federation.models import JobSiteStatus, JobStatus
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOST_SECONDS = 20


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("fault-superlink"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        env={"FRP_SUPERLINK_LOST_SECONDS": str(LOST_SECONDS)},
    ) as w:
        yield w


def test_superlink_killed_mid_job_is_shown_unreachable_and_the_job_fails(world, django_db_blocker):
    with django_db_blocker.unblock():
        job = fs.submit(world, title="lose the SuperLink", num_rounds=30)
        pk = job.pk
        fs.wait_round(pk, 1)
        os.killpg(world.federation.superlink_pid, signal.SIGKILL)

        job = wait_for(
            lambda: (j := fs.job(pk)).superlink_lost_at and j,
            timeout=60,
            what="the job to notice the SuperLink is gone (within a minute)",
        )
        assert job.status == JobStatus.RUNNING
        html = fs.page(world.researcher, reverse("federation:job_detail", args=[job.pk]))
        assert "The SuperLink is unreachable" in html
        assert f"within {LOST_SECONDS} s" in html

        job = fs.wait_terminal(job.pk, timeout=LOST_SECONDS + 120, world=world)

        assert job.status == JobStatus.FAILED
        assert "The SuperLink stopped answering" in job.status_detail
        assert fs.is_sentence(job.status_detail), job.status_detail
        assert (job.finished_at - job.superlink_lost_at).total_seconds() >= LOST_SECONDS
        assert set(job.sites.values_list("status", flat=True)) == {JobSiteStatus.FAILED}
        html = fs.page(world.researcher, reverse("federation:job_detail", args=[job.pk]))
        assert "The SuperLink stopped answering" in html
