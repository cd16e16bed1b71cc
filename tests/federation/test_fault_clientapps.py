"""Fault: every ClientApp fails (each site's keyring is gone, so no site can open its data).

The job must end FAILED with a reason that reads as a sentence naming each site — not Flower's
``<class 'frp_flwr.task.SiteDataError'>:<'…'>`` — and release its sites."""

from __future__ import annotations

import pytest
from django.urls import reverse

from federation.models import JobSiteStatus, JobStatus
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b")


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        SITES,
        root=tmp_path_factory.mktemp("fault-clientapps"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as w:
        yield w


def test_every_clientapp_failing_fails_the_job_with_a_sentence(world, django_db_blocker):
    for site in SITES:
        keyring = world.sites_dir / site / "keyring"
        keyring.rename(keyring.with_name("keyring-away"))
    with django_db_blocker.unblock():
        job = fs.submit(world, title="no site can read its data", num_rounds=2)

        job = fs.wait_terminal(job.pk, timeout=600, world=world)

        assert job.status == JobStatus.FAILED
        reason = job.status_detail
        assert fs.is_sentence(reason), reason
        assert reason.startswith("Only 0 of 2 sites could take part, and the job needs 2.")
        for site in SITES:
            assert f"{site} could not take part: " in reason
        assert "SiteDataError" not in reason and str(world.sites_dir) not in reason
        assert set(job.sites.values_list("status", flat=True)) == {JobSiteStatus.FAILED}
        html = fs.page(world.researcher, reverse("federation:job_detail", args=[job.pk]))
        assert "could not take part" in html
