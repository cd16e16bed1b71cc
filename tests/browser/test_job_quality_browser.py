"""The job form's columns table and a finished job's results in a real browser (Debian Chromium
driven by Playwright): ticking datasets draws the columns they share (HTMX) with types, missing
counts and the careful defaults; the job page shows how the data were prepared, the metrics, the
confusion matrix with small counts suppressed, the baseline and its plot. Screenshots go to
``test-artifacts/screenshots/`` for people to look at."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.test import Client

from federation import services
from federation.models import FederatedJob, JobStatus
from frp_flwr import contract
from portal.models import ProjectRole
from tests.browser.test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEMA = [
    {"name": "rownames", "type": "int"},
    {"name": "age", "type": "float"},
    {"name": "ward", "type": "str"},
    {"name": "admitted", "type": "date"},
    {"name": "outcome", "type": "str"},
]


def _profile(missing_age):
    return {
        "format": 2,
        "rows": 100,
        "columns": [
            {"name": "rownames", "type": "int", "missing": 0, "identifier": True},
            {"name": "age", "type": "float", "missing": missing_age, "identifier": False},
            {"name": "ward", "type": "str", "missing": 0, "identifier": False},
            {"name": "admitted", "type": "date", "missing": 0, "identifier": False},
            {"name": "outcome", "type": "str", "missing": 0, "identifier": False},
        ],
    }


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


def _finish(job: FederatedJob) -> None:
    """Record a run's events as the ServerApp posts them (through the contract's parser)."""
    job.flower_run_id = "7"
    job.status = JobStatus.RUNNING
    job.save()
    sites = [js.site.slug for js in job.sites.select_related("site")]
    prep = contract.Preparation(
        task="classification",
        columns=["age", "age (missing)", "ward=A", "ward=B", "ward=(other)"],
        fills={"age": "median: 61.5 + missing indicator", "ward": "most frequent: 'A'"},
        notes=["ward: values held by 7 or fewer rows at a site are merged into '(other)'"],
        sites={
            s: contract.SitePreparation(
                rows=100, train_rows=80, test_rows=20, imputed={"age": 12 * i, "ward": 0}
            )
            for i, s in enumerate(sites)
        },
    )
    # Each class has at least 8 held-out rows at each site, so the class-based metrics (ROC AUC
    # and its bound) are released to the PI (federation.disclosure: a class of "≤7" rows at a
    # site would suppress them).
    confusion = [[[10, 2], [1, 7]], [[8, 4], [2, 6]]]
    site_metrics = {}
    for s, c in zip(sites, confusion, strict=True):
        site_metrics[s] = contract.SiteEvaluation(
            eval_examples=20,
            eval_loss=0.5,
            eval_accuracy=(c[0][0] + c[1][1]) / 20,
            metrics=contract.Metrics(
                examples=20,
                accuracy=(c[0][0] + c[1][1]) / 20,
                balanced_accuracy=0.6,
                macro_f1=0.6,
                roc_auc=0.7,
                log_loss=0.5,
                confusion=c,
            ),
        )
    events = [
        contract.Started(nodes={s: str(i + 1) for i, s in enumerate(sites)}, preparation=prep),
        contract.Round(round=1, eval_accuracy=0.7, eval_loss=0.6, train_loss=0.7),
        contract.Round(round=2, eval_accuracy=0.7, eval_loss=0.55, train_loss=0.6),
        contract.Finished(
            rounds=2,
            eval_accuracy=0.7,
            eval_loss=0.55,
            classes=["died", "survived"],
            sites=site_metrics,
            metrics=contract.Metrics(
                examples=40,
                accuracy=0.7,
                balanced_accuracy=0.62,
                macro_f1=0.61,
                roc_auc=0.71,
                roc_auc_bound=0.0021,
                log_loss=0.55,
                confusion=[[18, 6], [3, 13]],
            ),
            baseline=contract.Baseline(
                name="majority class (died)", metric="accuracy", value=0.8, model=0.7, better=False
            ),
        ),
    ]
    for seq, event in enumerate(events, start=1):
        _, parsed = contract.parse_event(contract.encode_event(event, seq=seq))
        services.job_callback_record(job_id=job.pk, seq=seq, event=parsed)
    job.refresh_from_db()
    job.status = JobStatus.COMPLETED
    job.save()


def test_columns_table_and_results_in_the_browser(live_server, transactional_db, page):
    project = ProjectFactory(title="Sepsis outcomes")
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    versions = []
    for missing in (15, "≤7"):
        v = DatasetVersionFactory(schema=SCHEMA, profile=_profile(missing))
        GrantFactory(project=project, dataset=v.dataset)
        versions.append(v)
    SHOTS.mkdir(parents=True, exist_ok=True)
    client = Client()
    client.force_login(pi)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )

    page.goto(f"{live_server.url}/jobs/new/")
    assert "Choose datasets above" in page.content()
    page.fill("input[name=title]", "Sepsis, from the form")
    page.select_option("select[name=project]", str(project.pk))
    for box in page.locator("input[name=datasets]").all():
        box.check()
    page.wait_for_selector("#feature-table")
    page.fill("input[name=target_column]", "outcome")
    page.locator("input[name=target_column]").dispatch_event("change")
    page.wait_for_selector("#task-hint")
    page.screenshot(path=SHOTS / "job-form-columns.png", full_page=True)

    rows = {
        r.get_attribute("data-column"): r for r in page.locator("#feature-table tbody tr").all()
    }
    assert not rows["rownames"].locator("input[type=checkbox]").first.is_checked()
    assert "looks like a row identifier" in rows["rownames"].inner_text()
    assert rows["age"].locator("input[type=checkbox]").first.is_checked()
    assert "15" in rows["age"].inner_text() and "≤7" in rows["age"].inner_text()
    assert rows["age"].locator("select").last.input_value() == "median"
    assert not rows["admitted"].locator("input[type=checkbox]").first.is_checked()
    assert "target" in rows["outcome"].inner_text()
    assert "Classification (str target)" in page.locator("#task-hint").inner_text()

    page.get_by_role("button", name="Submit job").click()
    # a job's page, not the form again: "/jobs/*/" also matches "/jobs/new/"
    page.wait_for_url(re.compile(re.escape(live_server.url) + r"/jobs/\d+/$"))
    job = FederatedJob.objects.get(title="Sepsis, from the form")
    assert job.feature_columns == ["age", "ward"]
    assert job.preprocessing[0] == {
        "name": "age",
        "kind": "numeric",
        "missing": "median",
        "indicator": True,
    }

    _finish(job)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#results-chart")
    page.wait_for_function(
        "() => document.querySelector('#results-chart').getBoundingClientRect().height > 0"
    )
    page.wait_for_timeout(300)  # the chart's first frame (no animation)
    page.screenshot(path=SHOTS / "job-results.png", full_page=True)
    text = page.content()
    assert "No better than the baseline" in text
    assert page.locator('[data-bound="roc_auc"]').inner_text().strip() == "± 0.0021"
    assert "How the data were prepared" in text and "median: 61.5 + missing indicator" in text
    pooled = page.locator(".confusion").first.inner_text()
    # the PI stewards neither site: every cell under the profile's rule (ADR 0036), so the cells
    # do not add up to the exact pooled rows: 18 → ≈20, 13 → ≈15, 6 and 3 suppressed
    assert "≤7" in pooled and "≈20" in pooled and "≈15" in pooled and "18" not in pooled
    for name in ("job-form-columns.png", "job-results.png"):
        assert (SHOTS / name).stat().st_size > 10_000
