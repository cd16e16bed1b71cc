"""The portal's side of secure aggregation (issue 14, point 4): the form option, the run config,
the job page and the data-volume contribution of a SecAgg job."""

from __future__ import annotations

import pytest

from accounting.models import ContributionMethod
from accounting.services.contribution import contribution_score_job
from federation import services
from federation.models import SiteRoundMetric
from frp_flwr import contract
from tests.federation import test_services
from tests.federation.callback_support import record_one_round

# the service tests' fixtures: two granted datasets, a fake SuperLink, an eager launch
world, fake_superlink, launch = (
    test_services.world,
    test_services.fake_superlink,
    test_services.launch,
)
submit = test_services.submit

pytestmark = pytest.mark.django_db


def test_job_form_offers_secure_aggregation_and_says_how_contribution_is_measured(client, world):
    client.force_login(world["pi"])
    page = client.get("/jobs/new/").content.decode()
    assert "Secure aggregation (SecAgg+)" in page
    assert 'name="secure_aggregation"' in page
    assert "contribution is then measured by data volume and compute" in page


def test_job_form_submits_a_secure_aggregation_job(client, world, fake_superlink):
    client.force_login(world["pi"])
    data = {
        "title": "secure",
        "project": world["project"].pk,
        "datasets": [v.pk for v in world["versions"]],
        "target_column": "label",
        "feature_columns": "",
        "num_rounds": 2,
        "local_epochs": 1,
        "learning_rate": 0.1,
        "secure_aggregation": "on",
    }
    response = client.post("/jobs/new/", data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = services.FederatedJob.objects.get(title="secure")
    assert job.secure_aggregation is True
    spec = contract.JobSpec.from_json(services.job_run_config(job).job_spec)
    assert spec.privacy.secagg is True


def test_plain_job_run_config_has_no_secure_aggregation(world):
    job = submit(world)
    spec = contract.JobSpec.from_json(services.job_run_config(job).job_spec)
    assert spec.privacy.secagg is False
    assert job.secure_aggregation is False


def test_secagg_job_is_scored_by_data_volume_and_its_page_says_why(
    client, world, fake_superlink, launch
):
    job = launch(world, secure_aggregation=True)
    a, b = (v.dataset.site.slug for v in world["versions"])
    record_one_round(job, {a: 30, b: 10})
    job.refresh_from_db()
    assert job.final_metrics["updates_hidden"] is True
    assert SiteRoundMetric.objects.filter(job_site__job=job, ok=True).count() == 2

    scores = contribution_score_job(job=job)

    assert {s.method for s in scores} == {ContributionMethod.DATA_VOLUME}
    shares = {s.site.slug: s.share for s in scores}
    assert shares == pytest.approx({a: 0.75, b: 0.25})
    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="secure-aggregation"' in page
    row = page[page.index('id="job-contribution-basis"') :]
    assert row[: row.index("</dd>")].count("Data volume and compute") == 1
    assert "no site&#x27;s own update exists" in page or "no site's own update exists" in page


def _secure_form(world, **extra) -> dict:
    return {
        "title": "secure-strategy",
        "project": world["project"].pk,
        "datasets": [v.pk for v in world["versions"]],
        "target_column": "label",
        "feature_columns": "",
        "num_rounds": 2,
        "local_epochs": 1,
        "learning_rate": 0.1,
        "secure_aggregation": "on",
        **extra,
    }


@pytest.mark.parametrize("name", ["fedmedian", "fedtrimmedavg"])
def test_job_form_refuses_secure_aggregation_with_a_strategy_that_needs_each_update(
    client, world, fake_superlink, name
):
    client.force_login(world["pi"])
    response = client.post("/jobs/new/", _secure_form(world, strategy_name=name))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "needs each site's update" in " ".join(errors.get("strategy_name", [])), errors
    assert not services.FederatedJob.objects.filter(title="secure-strategy").exists()


def test_job_submit_refuses_krum_under_secure_aggregation_with_enough_sites_for_krum(world):
    with pytest.raises(services.JobError) as caught:
        services._validate_training(None, {"name": "krum"}, sites=5, secure_aggregation=True)
    assert "needs each site's update" in caught.value.field_errors["strategy_name"][0]
    services._validate_training(None, {"name": "krum"}, sites=5, secure_aggregation=False)


def test_job_form_submits_secure_aggregation_with_fedadam_and_the_mlp(
    client, world, fake_superlink
):
    client.force_login(world["pi"])
    response = client.post(
        "/jobs/new/", _secure_form(world, strategy_name="fedadam", model_kind="mlp")
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = services.FederatedJob.objects.get(title="secure-strategy")
    spec = contract.JobSpec.from_json(services.job_run_config(job).job_spec)
    assert spec.privacy.secagg is True
    assert spec.strategy["name"] == "fedadam" and spec.model["kind"] == "mlp"


def test_job_form_refuses_secure_aggregation_with_gradient_boosted_trees(
    client, world, fake_superlink
):
    """SecAgg+ sums weight vectors; trees send trees: refused inline, no job created."""
    client.force_login(world["pi"])
    response = client.post("/jobs/new/", _secure_form(world, model_kind="xgboost"))
    assert response.status_code == 200
    assert "cannot be aggregated securely" in response.content.decode()
    assert not services.FederatedJob.objects.filter(title="secure-strategy").exists()
