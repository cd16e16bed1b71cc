"""A data steward uploads a CSV through the upload page in a real browser (Debian Chromium driven by
Playwright): a bad file comes back with the error inline under the file field and nothing stored; a
good one lands on the dataset page with its version, detected encoding and delimiter, and profile.
Screenshots go to ``test-artifacts/screenshots/`` for people to look at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.test import Client

from portal.models import Membership, Role
from sandbox.models import DatasetVersion
from tests.browser.test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS
from tests.factories import SiteFactory, UserFactory

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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


def test_steward_uploads_a_csv_in_the_browser(
    live_server, transactional_db, settings, tmp_path, page
):
    settings.FRP_SITES_DIR = tmp_path / "sites"
    site = SiteFactory(slug="hospital-up", institution__name="St Aurelia University Hospital")
    (settings.FRP_SITES_DIR / site.slug).mkdir(parents=True)
    steward = UserFactory(username="stella", first_name="Stella", last_name="Steward")
    Membership.objects.create(user=steward, institution=site.institution, role=Role.DATA_STEWARD)
    bad = tmp_path / "visits.csv"
    bad.write_text("id,visit_date,ward\n1,2024-01-03,A\n2,2024-02-30x,B\n", encoding="utf-8")
    good = tmp_path / "visits-fixed.csv"
    rows = "".join(
        f"{i};2024-0{1 + i % 9}-1{i % 10};{('Médecine', 'Chirurgie')[i % 2]};{30 + i % 50}\r\n"
        for i in range(60)
    )
    good.write_bytes(("id;visit_date;ward;age\r\n" + rows).encode("cp1252"))
    SHOTS.mkdir(parents=True, exist_ok=True)

    client = Client()  # signed in as the steward (sign-in itself is the SSO browser test's job)
    client.force_login(steward)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    page.goto(f"{live_server.url}/datasets/")
    page.get_by_role("link", name="Upload a dataset").click()
    page.fill("input[name=slug]", "ward-visits")
    page.fill("input[name=title]", "Ward visits 2024")
    page.fill(
        "textarea[name=description]", "Outpatient visits per ward, January to September 2024."
    )
    page.fill("textarea[name=types]", "visit_date=date")
    page.set_input_files("input[name=file]", str(bad))
    page.screenshot(path=SHOTS / "dataset-upload.png", full_page=True)
    page.get_by_role("button", name="Encrypt and register").click()
    error = page.locator("[data-testid=file-error]")
    error.wait_for()
    assert "line 3, column 'visit_date'" in error.inner_text()
    assert page.input_value("input[name=slug]") == "ward-visits"  # the form keeps its values
    page.screenshot(path=SHOTS / "dataset-upload-error.png", full_page=True)
    assert not DatasetVersion.objects.exists()
    assert not any((settings.FRP_SITES_DIR / site.slug).rglob("*.enc"))

    page.set_input_files("input[name=file]", str(good))
    page.get_by_role("button", name="Encrypt and register").click()
    page.wait_for_url(f"{live_server.url}/datasets/*/")
    text = page.locator("[data-testid=read-parameters]").inner_text()
    assert "cp1252" in text and "semicolon" in text
    assert "Version 1 of Ward visits 2024 registered: 60 rows" in page.content()
    page.screenshot(path=SHOTS / "dataset-uploaded.png", full_page=True)
    dv = DatasetVersion.objects.get()
    assert (dv.row_count, dv.created_by_id) == (60, steward.pk)
