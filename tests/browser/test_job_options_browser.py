"""The job form's model, strategy and differential-privacy fieldsets, a failed job's resume
button, the model card and a resumed job's runs on its page and invoice in a real browser (Debian Chromium driven by Playwright, issue 14).
Screenshots go to ``test-artifacts/screenshots/`` for people to look at."""

# ruff: noqa: F811 — fixtures imported from other test modules are redefined as arguments
from __future__ import annotations

import os

import pytest
from django.test import Client

from federation.models import FederatedJob
from portal.models import ProjectRole
from tests.accounting.test_run_columns import FIRST, SECOND, _job, run_world
from tests.browser.test_browser import SHOTS, page  # noqa: F401 — fixture
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
)
from tests.federation.test_artifacts import (  # noqa: F401 — fixtures
    _failed_with_checkpoint,
    _finish,
    _fitted,
    _weights,
    model_store,
    world,
)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _sign_in(page, live_server, user) -> None:
    client = Client()
    client.force_login(user)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )


def test_job_form_model_strategy_and_privacy_fieldsets(live_server, transactional_db, page):
    project = ProjectFactory(title="Options in the browser")
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    for _ in range(3):
        version = DatasetVersionFactory()
        GrantFactory(project=project, dataset=version.dataset)
    SHOTS.mkdir(parents=True, exist_ok=True)
    _sign_in(page, live_server, pi)

    page.goto(f"{live_server.url}/jobs/new/")
    page.fill("input[name=title]", "Options")
    page.select_option("select[name=project]", str(project.pk))
    for box in page.locator("input[name=datasets]").all():
        box.check()
    page.wait_for_selector("#feature-table")
    page.fill("input[name=target_column]", "label")
    page.locator("input[name=target_column]").dispatch_event("change")
    page.wait_for_selector("#task-hint")
    page.screenshot(path=SHOTS / "job-form.png", full_page=True)

    # The linear model has no hyper-parameters of its own: the MLP's and the trees' are hidden
    assert page.locator("#id_model_kind").input_value() == "linear"
    assert not page.locator("#id_mlp_hidden").is_visible()
    assert not page.locator("#xgboost-params").is_visible()
    assert not page.locator("#id_fedprox_mu").is_visible()
    page.select_option("#id_model_kind", "mlp")
    page.locator("#id_mlp_hidden").wait_for(state="visible")
    assert page.locator("#id_mlp_dropout").is_visible()
    assert page.locator("#id_mlp_activation").is_visible()
    assert not page.locator("#xgboost-params").is_visible()
    page.select_option("#id_model_kind", "xgboost")
    page.locator("#xgboost-params").wait_for(state="visible")
    assert not page.locator("#id_mlp_hidden").is_visible()
    page.locator("#model-fieldset").screenshot(path=SHOTS / "job-form-trees.png")
    page.select_option("#id_strategy_name", "fedadam")
    page.locator("#id_server_eta").wait_for(state="visible")
    assert page.locator("#id_server_beta_2").is_visible()
    page.select_option("#id_strategy_name", "fedadagrad")
    page.locator("#id_server_beta_2").wait_for(state="hidden")  # FedAdagrad has no β
    assert page.locator("#id_server_tau").is_visible()
    page.locator("#model-fieldset").screenshot(path=SHOTS / "job-form-fedadagrad.png")
    page.select_option("#id_model_kind", "mlp")
    page.select_option("#id_strategy_name", "fedprox")
    page.locator("#id_fedprox_mu").wait_for(state="visible")
    page.locator("#privacy-fieldset").scroll_into_view_if_needed()
    page.locator("#model-fieldset").screenshot(path=SHOTS / "job-form-model.png")

    # Differential privacy: the ε preview follows the settings
    page.check("input[name='privacy-dp'][value=server]")
    epsilon = page.locator("#privacy-epsilon [data-epsilon]")
    epsilon.wait_for()
    first = float(epsilon.get_attribute("data-epsilon"))
    page.fill("input[name='privacy-noise_multiplier']", "3")
    page.locator("input[name='privacy-noise_multiplier']").dispatch_event("change")
    page.wait_for_function(
        "(before) => { const e = document.querySelector('#privacy-epsilon [data-epsilon]');"
        " return e && parseFloat(e.dataset.epsilon) !== before; }",
        arg=first,
    )
    second = float(epsilon.get_attribute("data-epsilon"))
    assert second < first  # more noise, smaller ε
    page.locator("#privacy-fieldset").screenshot(path=SHOTS / "job-form-privacy.png")

    # An MLP too large for the final model is refused inline, at its field
    page.fill("#id_mlp_hidden", "1024,1024")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_load_state()
    page.screenshot(path=SHOTS / "job-form-refused.png", full_page=True)
    error = page.locator("#id_mlp_hidden ~ .invalid-feedback")
    assert "80,000 numbers" in error.inner_text()
    assert page.locator("#id_mlp_hidden").is_visible()  # the chosen model's fields stay shown
    page.locator("#model-fieldset").screenshot(path=SHOTS / "job-form-model-error.png")
    assert FederatedJob.objects.count() == 0


def test_failed_job_with_a_checkpoint_offers_resume(
    live_server, transactional_db, page, world, model_store
):
    job = _failed_with_checkpoint(world, model_store, rnd=2)
    SHOTS.mkdir(parents=True, exist_ok=True)
    _sign_in(page, live_server, world["researcher"])

    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    resume = page.locator("#resume")
    assert "round 2" in resume.inner_text()
    resume.screenshot(path=SHOTS / "job-resume.png")
    page.screenshot(path=SHOTS / "job-failed-page.png", full_page=True)
    page.get_by_role("button", name="Resume from round 2").click()
    page.wait_for_url(f"{live_server.url}/jobs/{job.pk}/")
    page.locator(".alert").filter(has_text="queued to resume").wait_for()
    job.refresh_from_db()
    assert job.status == "queued" and job.resume_round == 2
    assert page.locator("#resume").count() == 0


def test_failed_job_without_a_checkpoint_says_it_cannot_be_resumed(
    live_server, transactional_db, page, world, model_store
):
    job = _failed_with_checkpoint(world, model_store, rnd=0)
    _sign_in(page, live_server, world["researcher"])

    page.goto(f"{live_server.url}/jobs/{job.pk}/")

    assert page.get_by_role("button", name="Resume", exact=False).count() == 0


def test_model_card_page(live_server, transactional_db, page, world, model_store):
    job = world["job"]
    FederatedJob.objects.filter(pk=job.pk).update(
        privacy={"dp": "server", "noise_multiplier": 1.1, "clipping_norm": 1.0, "delta": 1e-5},
        epsilon=2.9137,
    )
    job.refresh_from_db()
    fitted = _fitted()
    _finish(job, fitted, _weights(fitted))
    SHOTS.mkdir(parents=True, exist_ok=True)
    _sign_in(page, live_server, world["researcher"])

    page.goto(f"{live_server.url}/jobs/{job.pk}/model-card/")

    assert page.locator("#card-epsilon").inner_text() == "ε = 2.91 at δ = 1e-5"
    page.screenshot(path=SHOTS / "model-card.png", full_page=True)


def test_resumed_job_usage_cost_and_invoice_name_their_runs(live_server, transactional_db, page):
    w = run_world()
    job = _job(w, [FIRST, SECOND])
    SHOTS.mkdir(parents=True, exist_ok=True)
    _sign_in(page, live_server, w["member"])

    page.goto(f"{live_server.url}/jobs/{job.pk}/")

    usage = page.locator("#usage")
    assert "run 2 of 2\n(Flower run 12345678…)" in usage.inner_text()
    usage.screenshot(path=SHOTS / "job-usage-runs.png")
    cost = page.locator("#job-cost")
    assert "run 1 of 2\n(Flower run 90817263…)" in cost.inner_text()
    cost.screenshot(path=SHOTS / "job-cost-runs.png")
    _sign_in(page, live_server, w["admin"])
    page.goto(f"{live_server.url}/accounting/invoices/{w['invoice'].pk}/")
    assert "run 2 of 2" in page.locator("table").first.inner_text()
    page.screenshot(path=SHOTS / "invoice-runs.png", full_page=True)
