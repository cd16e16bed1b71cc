"""Integration: a differentially private job through the web form on a real Flower deployment
(issue 14 point 3, ADR 0025).

Real parts: PostgreSQL, a Celery worker with beat on Redis, a SuperLink and two SuperNodes, the
live server's callback endpoint (``tests/federation/conftest.flower_world``). The data steward sets
an ε budget on the grant through the steward's page; the researcher fills the job form as a browser
posts it (the columns table drawn for the chosen datasets), asks for the ε preview (the HTMX
partial's URL), and submits with server-side DP. The job completes; the ε on its page and in the
ledger equals the accountant's (``federation.privacy.epsilon``, dp-accounting) for its noise,
rounds and sites; a second identical job would go over the budget and is refused on the form with
the figures, and no job is created.
"""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from federation.models import FederatedJob, JobStatus
from federation.privacy import epsilon as accountant_epsilon
from portal.ledger.models import LedgerEntry
from portal.models import Membership, Role
from sandbox.models import AccessRequest, AccessStatus, PrivacyBudget
from tests.federation.conftest import flower_world, wait_for
from tests.federation.job_form import job_form_data

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b")
ROUNDS = 2
NOISE, CLIP, DELTA = 1.5, 1.0, 1e-5


@pytest.fixture(scope="module")
def dp_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        SITES,
        root=tmp_path_factory.mktemp("flower-dp"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as world:
        yield world


def _epsilon_in(page: str, anchor: str) -> float:
    return float(re.search(anchor + r'[^>]*data-epsilon="([0-9.e+-]+)"', page).group(1))


@pytest.fixture(scope="module")
def outcome(dp_world, django_db_blocker):
    w = dp_world
    expected = accountant_epsilon(noise_multiplier=NOISE, rounds=ROUNDS, delta=DELTA)
    with django_db_blocker.unblock():
        # The steward of hospital-a's institution sets the budget: room for one job, not two.
        dataset = w.versions[0].dataset
        steward = Membership.objects.filter(
            institution=dataset.site.institution, role=Role.DATA_STEWARD
        ).first()
        if steward is None:
            from django.contrib.auth import get_user_model

            user = get_user_model().objects.create_user("stella", password="pw-for-tests-123")
            Membership.objects.create(
                user=user, institution=dataset.site.institution, role=Role.DATA_STEWARD
            )
        else:
            user = steward.user
        grant = AccessRequest.objects.get(
            project=w.project, dataset=dataset, status=AccessStatus.APPROVED
        )
        stewards = Client()
        stewards.force_login(user)
        budget = round(1.5 * expected, 3)
        set_budget = stewards.post(
            f"/access-requests/{grant.pk}/privacy-budget/", {"epsilon": str(budget)}
        )
        assert set_budget.status_code == 302

        client = Client()
        client.force_login(w.researcher)
        versions = [str(v.pk) for v in w.versions]
        privacy = {
            "privacy-dp": "server",
            "privacy-noise_multiplier": str(NOISE),
            "privacy-clipping_norm": str(CLIP),
            "privacy-delta": str(DELTA),
        }

        def form(title: str) -> dict:
            _, data = job_form_data(
                client,
                datasets=versions,
                target="diagnosis",
                title=title,
                num_rounds=ROUNDS,
                local_epochs=3,
                learning_rate=0.1,
                **privacy,
            )
            return data

        data = form("DP job")
        preview = client.post("/jobs/new/privacy/", data).content.decode()
        response = client.post("/jobs/new/", data)
        assert response.status_code == 302, response.content.decode()[-3000:]
        job = FederatedJob.objects.get(title="DP job")

        def done(pk):
            j = FederatedJob.objects.get(pk=pk)
            return j if j.is_terminal else None

        job = wait_for(lambda: done(job.pk), timeout=600, what="the DP job to finish")
        job_page = client.get(f"/jobs/{job.pk}/").content.decode()
        leaf = json.loads(LedgerEntry.objects.get(kind="privacy").data)

        second = client.post("/jobs/new/", form("DP job, again"))
        return {
            "expected": expected,
            "budget": PrivacyBudget.objects.get(project=w.project, dataset=dataset).epsilon,
            "preview": preview,
            "job": job,
            "job_page": job_page,
            "leaf": leaf,
            "second": second,
            "second_created": FederatedJob.objects.filter(title="DP job, again").exists(),
        }


def test_the_dp_job_completes_with_the_accountants_epsilon_on_its_page_and_ledger(outcome):
    job, expected = outcome["job"], outcome["expected"]
    assert job.status == JobStatus.COMPLETED, job.status_detail or job.failure_reason
    assert job.privacy["dp"] == "server" and job.privacy["noise_multiplier"] == NOISE
    assert job.epsilon == pytest.approx(expected, rel=1e-9)
    assert _epsilon_in(outcome["preview"], "<strong") == pytest.approx(expected, rel=1e-9)
    assert _epsilon_in(outcome["job_page"], 'id="job-epsilon"') == pytest.approx(expected, rel=1e-9)
    assert "Server-side fixed clipping" in outcome["job_page"]
    assert outcome["leaf"]["job"] == job.pk
    assert float(outcome["leaf"]["epsilon"]) == pytest.approx(expected, rel=1e-9)
    assert job.final_metrics["metrics"]["accuracy"] is not None


def test_a_second_job_over_the_budget_is_refused_with_the_figures(outcome):
    second, expected = outcome["second"], outcome["expected"]
    assert second.status_code == 200 and not outcome["second_created"]
    page = second.content.decode()
    error = re.search(r'id="privacy-dp-error">([^<]*)<', page).group(1)
    figures = f"spent {expected:.3g}, this job {expected:.3g}, budget {outcome['budget']:.3g}"
    assert figures in error.replace("&#x27;", "'")
