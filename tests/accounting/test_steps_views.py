"""Accounting-step pages: the job page's accounting card, the admins' list of jobs whose
accounting failed, and the retry POST (``accounting.views.steps``)."""

from __future__ import annotations

import pytest
from django.test import Client

from accounting.models import JobAccountingStep
from accounting.services import steps
from federation.models import FederatedJob
from tests.accounting.steps_world import BROKEN, FULL, build_steps_world
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

REASON = "no utility for coalition {1} was reported"


@pytest.fixture
def world(eager_celery):
    w = build_steps_world()
    w.failed = w.job(utilities=BROKEN)
    steps.job_accounting_chain(w.failed.pk).apply()
    w.staff = UserFactory(is_staff=True)
    return w


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _states(job) -> dict[str, str]:
    return dict(JobAccountingStep.objects.filter(job=job).values_list("step", "status"))


@pytest.mark.parametrize("who", ["s0", "s1", "project", "staff"])
def test_job_page_shows_the_failed_step_and_its_reason_to_admins(world, who):
    user = world.staff if who == "staff" else world.admins[who]

    page = _client(user).get(f"/jobs/{world.failed.pk}/").content.decode()

    assert 'id="job-accounting"' in page
    assert REASON in page
    assert "Retry accounting" in page
    assert "Done in part" in page  # billing and credit went on without it


def test_job_page_hides_the_accounting_card_from_researchers(world):
    page = _client(world.pi).get(f"/jobs/{world.failed.pk}/").content.decode()

    assert 'id="job-accounting"' not in page
    assert REASON not in page


def test_job_page_of_a_fully_accounted_job_shows_one_line(world):
    job = world.job()
    steps.job_accounting_chain(job.pk).apply()

    page = _client(world.admins["s0"]).get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="job-accounting"' in page
    assert "Retry accounting" not in page
    assert page.count(">Done</span>") == 4


def test_failures_list_scoped_to_the_admins_institutions(world):
    other_job = world.job(utilities=BROKEN)
    steps.job_accounting_chain(other_job.pk).apply()
    FederatedJob.objects.filter(pk=other_job.pk).update(title="another failure")

    for user in (world.staff, world.admins["s1"], world.admins["project"]):
        page = _client(user).get("/accounting/jobs/").content.decode()
        assert f"#{world.failed.pk} steps test" in page and REASON in page
        assert "another failure" in page
    page = _client(world.admins["other"]).get("/accounting/jobs/").content.decode()
    assert REASON not in page and "No job's accounting has failed" in page
    assert _client(world.pi).get("/accounting/jobs/").status_code == 404


def test_institution_tab_lists_its_jobs_only(world):
    s0 = world.versions[0].dataset.site.institution
    page = _client(world.admins["s0"]).get(f"/accounting/institutions/{s0.slug}/jobs/")

    assert page.status_code == 200
    assert REASON in page.content.decode()
    other = world.admins["other"].memberships.get().institution
    page = _client(world.admins["other"]).get(f"/accounting/institutions/{other.slug}/jobs/")
    assert REASON not in page.content.decode()
    assert (
        _client(world.admins["other"]).get(f"/accounting/institutions/{s0.slug}/jobs/").status_code
        == 404
    )


def test_retry_post_after_mending_completes_the_job(world, django_capture_on_commit_callbacks):
    job = world.failed
    metrics = job.final_metrics
    metrics["contribution"]["utilities"] = {"0": FULL}
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics=metrics)

    client = _client(world.admins["s0"])

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/accounting/jobs/{job.pk}/retry/", {"next": "/accounting/jobs/"})

    assert response.status_code == 302 and response["Location"] == "/accounting/jobs/"
    assert set(_states(job).values()) == {"done"}
    page = client.get("/accounting/jobs/").content.decode()
    assert f"Accounting of job #{job.pk} queued again: contribution, billing, credit." in page
    assert REASON not in page


def test_retry_post_goes_back_to_the_job_page_for_a_foreign_next(world):
    response = _client(world.staff).post(
        f"/accounting/jobs/{world.failed.pk}/retry/", {"next": "https://evil.example/"}
    )

    assert response["Location"] == f"/jobs/{world.failed.pk}/"


def test_retry_refused_to_researchers_and_other_admins_with_404(world):
    for user in (world.pi, world.admins["other"]):
        response = _client(user).post(f"/accounting/jobs/{world.failed.pk}/retry/")
        assert response.status_code == 404
    assert _states(world.failed)["contribution"] == "failed"


def test_retry_is_a_post(world):
    response = _client(world.staff).get(f"/accounting/jobs/{world.failed.pk}/retry/")

    assert response.status_code == 405
    assert _states(world.failed)["contribution"] == "failed"


def test_retry_of_a_done_job_says_so(world, django_capture_on_commit_callbacks):
    job = world.job()
    steps.job_accounting_chain(job.pk).apply()

    response = _client(world.staff).post(f"/accounting/jobs/{job.pk}/retry/", follow=True)

    assert "nothing to retry" in response.content.decode()
