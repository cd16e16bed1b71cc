"""A real browser (Debian Chromium driven by Playwright) signs in through an OpenID Connect provider,
accepts a project invitation and submits the job form. Screenshots of the sign-in page, the dashboard
and the job page are saved under ``test-artifacts/screenshots/`` for people to look at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from federation.models import FederatedJob, JobStatus
from portal import services
from portal.models import ProjectRole
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
)
from tests.sso.test_sso_flows import connect_oidc

# Playwright's sync API runs an event loop in this thread; the ORM calls below are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        yield context.new_page()
        browser.close()


def test_researcher_signs_in_by_oidc_and_submits_a_job(live_server, oidc_idp_a, page):
    # Arrange: institution A on OIDC; a project (PI elsewhere) with two granted datasets
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    project = ProjectFactory(title="Browser-tested collaboration")
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    for _ in range(2):
        version = DatasetVersionFactory()
        GrantFactory(project=project, dataset=version.dataset)
    services.project_invite(by=pi, project=project, email="alice@inst-a.example")
    SHOTS.mkdir(parents=True, exist_ok=True)

    # Sign in through the institution's IdP
    page.goto(f"{live_server.url}/accounts/login/")
    page.screenshot(path=SHOTS / "sign-in.png", full_page=True)
    page.get_by_role("button", name=idp.institution.name).click()
    page.wait_for_url(f"{oidc_idp_a.issuer}/**")
    page.fill("input[name=login]", "alice")
    page.fill("input[name=password]", "alice-pass-A")
    page.locator("button[type=submit], input[type=submit]").first.click()
    for _ in range(2):  # the IdP may ask for consent
        if not page.url.startswith(oidc_idp_a.issuer):
            break
        page.locator("button[type=submit], input[type=submit]").first.click()
    page.wait_for_url(f"{live_server.url}/")
    assert "Alice" in page.content()
    page.screenshot(path=SHOTS / "dashboard.png", full_page=True)

    # Accept the invitation, then submit the job form
    page.get_by_role("link", name="Projects", exact=True).click()
    page.get_by_role("link", name="Answer").click()
    page.get_by_role("button", name="Accept").click()
    page.wait_for_url(f"{live_server.url}/projects/{project.slug}/")
    page.get_by_role("link", name="Submit a job").first.click()
    page.fill("input[name=title]", "Submitted from Chromium")
    page.select_option("select[name=project]", str(project.pk))
    for box in page.locator("input[name=datasets]").all():
        box.check()
    page.fill("input[name=target_column]", "label")
    # the columns table is redrawn (HTMX) for the chosen datasets and target before the post:
    # a post with a table drawn for other datasets only redraws the form
    page.locator("input[name=target_column]").dispatch_event("change")
    page.wait_for_selector("#task-hint")
    page.fill("input[name=num_rounds]", "3")
    page.get_by_role("button", name="Submit job").click()
    # a job's page, not the form again: "/jobs/*/" also matches "/jobs/new/"
    page.wait_for_url(re.compile(re.escape(live_server.url) + r"/jobs/\d+/$"))
    page.wait_for_timeout(500)
    page.screenshot(path=SHOTS / "job-page.png", full_page=True)

    job = FederatedJob.objects.get(title="Submitted from Chromium")
    assert job.submitted_by.email == "alice@inst-a.example"
    assert job.project == project and job.sites.count() == 2 and job.num_rounds == 3
    assert job.status in {JobStatus.QUEUED, JobStatus.FAILED}  # no worker/federation in this test
    assert page.locator("#progress").count() == 1
    for name in ("sign-in.png", "dashboard.png", "job-page.png"):
        assert (SHOTS / name).stat().st_size > 10_000
