"""The job form's model and strategy choice (issue 14): stored complete, sent in the run config,
bad values shown inline, named on the job page and the credit statement (ADR 0022)."""

# ruff: noqa: F811 — the fixtures imported from test_views are redefined as arguments
from __future__ import annotations

import json

import pytest

from federation import services
from federation.models import FederatedJob
from frp_flwr import contract
from tests.federation.test_views import (  # noqa: F401 — fixtures
    _field_block,
    _form_data,
    _job,
    fake_superlink,
    pi_client,
    world,
)

pytestmark = pytest.mark.django_db


def test_job_form_offers_models_and_strategies(pi_client):
    page = pi_client.get("/jobs/new/").content.decode()

    assert 'name="model_kind"' in page and 'value="mlp"' in page
    for label in ("FedAvg", "FedProx", "FedAdam", "FedYogi", "FedAdagrad", "FedMedian", "Krum"):
        assert f">{label}<" in page
    assert "Units per hidden layer" in page and "proximal term" in page


def test_job_form_mlp_and_fedadam_are_stored_complete_and_sent_to_the_sites(
    pi_client, world, fake_superlink, eager_celery, django_capture_on_commit_callbacks
):
    data = _form_data(
        world,
        model_kind="mlp",
        mlp_hidden="64, 32",
        mlp_activation="tanh",
        mlp_dropout="0.1",
        strategy_name="fedadam",
        server_eta="0.05",
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = pi_client.post("/jobs/new/", data)

    assert response.status_code == 302
    job = FederatedJob.objects.get()
    assert job.model_spec == {
        "kind": "mlp",
        "hidden": [64, 32],
        "activation": "tanh",
        "dropout": 0.1,
        "l2": 1e-4,
    }
    assert job.strategy_spec == {
        "name": "fedadam",
        "eta": 0.05,
        "eta_l": 0.1,  # the form's learning rate
        "tau": 1e-3,
        "beta_1": 0.9,
        "beta_2": 0.99,
    }
    assert (job.model, job.strategy) == ("mlp", "fedadam")
    sent = contract.JobSpec.from_json(fake_superlink.submitted[0]["job-spec"])
    assert sent.model == job.model_spec and sent.strategy == job.strategy_spec


def test_job_form_without_model_fields_means_linear_and_fedavg(
    pi_client, world, fake_superlink, eager_celery
):
    response = pi_client.post("/jobs/new/", _form_data(world))

    assert response.status_code == 302
    job = FederatedJob.objects.get()
    assert job.model_spec == {"kind": "linear"} and job.strategy_spec == {"name": "fedavg"}


@pytest.mark.parametrize("hidden", ["64,abc", "\u0663\u0662", "64,\u0663\u0662", "1_0", "+8", "²"])
def test_job_form_bad_hidden_layers_show_inline(pi_client, world, hidden):
    """Not ASCII whole numbers: refused inline (Python's ``int`` reads Arabic-Indic digits
    "٣٢" as 32, ``1_0`` as 10 and ``+8`` as 8; a hostile tester's finding, issue 9)."""
    response = pi_client.post("/jobs/new/", _form_data(world, model_kind="mlp", mlp_hidden=hidden))

    assert response.status_code == 200
    assert "whole numbers separated by commas" in _field_block(
        response.content.decode(), "id_mlp_hidden"
    )
    assert FederatedJob.objects.count() == 0


def test_job_form_out_of_range_values_show_inline_on_their_fields(pi_client, world):
    response = pi_client.post(
        "/jobs/new/",
        _form_data(world, model_kind="mlp", mlp_dropout="0.95", strategy_name="fedprox"),
    )
    page = response.content.decode()
    assert "outside [0, 0.9]" in _field_block(page, "id_mlp_dropout")

    response = pi_client.post(
        "/jobs/new/", _form_data(world, strategy_name="fedtrimmedavg", trimmed_beta="0.5")
    )
    assert "outside [0, 0.5)" in _field_block(response.content.decode(), "id_trimmed_beta")
    assert FederatedJob.objects.count() == 0


def test_job_form_krum_with_too_few_sites_is_refused_inline(pi_client, world):
    response = pi_client.post(
        "/jobs/new/", _form_data(world, strategy_name="krum", krum_faulty="1")
    )

    assert response.status_code == 200
    block = _field_block(response.content.decode(), "id_strategy_name")
    assert "more than 4 sites" in block and "this job has 2" in block
    assert FederatedJob.objects.count() == 0


def test_job_submit_refuses_a_bad_strategy_spec_on_its_field(world):
    try:
        services.job_submit(
            by=world["pi"],
            project=world["project"],
            dataset_versions=world["versions"],
            title="x",
            target_column="label",
            strategy={"name": "fedsgd"},
        )
    except services.JobError as exc:
        assert "strategy.name" in exc.field_errors["strategy_name"][0]
    else:
        raise AssertionError("no JobError")


def test_job_page_and_credit_statement_name_model_strategy_and_contribution_method(
    pi_client, world
):
    job = _job(
        world["project"],
        world["pi"],
        model="mlp",
        model_spec={"kind": "mlp", "hidden": [8], "activation": "relu", "dropout": 0.0, "l2": 1e-4},
        strategy="fedmedian",
        strategy_spec={"name": "fedmedian"},
    )

    page = pi_client.get(f"/jobs/{job.pk}/").content.decode()
    credit = pi_client.get(f"/accounting/credit/jobs/{job.pk}/").content.decode()

    assert "Multilayer perceptron (hidden 8, relu, dropout 0, L2 0.0001)" in page
    assert "FedMedian" in page
    assert "re-applying FedMedian to the coalition" in page
    assert "multilayer perceptron (hidden 8" in credit
    assert 'data-method="strategy">FedMedian</dd>' in credit


def test_job_page_of_an_old_job_says_logistic_regression_and_fedavg(pi_client, world):
    job = _job(world["project"], world["pi"])

    page = pi_client.get(f"/jobs/{job.pk}/").content.decode()

    assert "Logistic (softmax) regression" in page
    assert '<dd class="col-6" id="job-strategy">FedAvg</dd>' in page


@pytest.mark.parametrize("hidden", ["1024,1024", "1024,1024,1024,1024", "400,300"])
def test_job_form_an_mlp_too_large_for_the_final_model_is_refused_inline(pi_client, world, hidden):
    """The final model reaches the portal in the signed ``finished`` event, at most
    ``contract.MAX_FINAL_MODEL_VALUES`` numbers: a larger MLP trained every round and then
    failed at the end (and held every round's weights of every site in the ServerApp)."""
    response = pi_client.post("/jobs/new/", _form_data(world, model_kind="mlp", mlp_hidden=hidden))

    assert response.status_code == 200
    block = _field_block(response.content.decode(), "id_mlp_hidden")
    assert f"{contract.MAX_FINAL_MODEL_VALUES:,} numbers" in block and "at least" in block
    assert FederatedJob.objects.count() == 0


def test_job_form_the_largest_mlp_that_fits_the_final_model_is_accepted(
    pi_client, world, fake_superlink, eager_celery
):
    response = pi_client.post(
        "/jobs/new/", _form_data(world, model_kind="mlp", mlp_hidden="256,256")
    )

    assert response.status_code == 302
    assert FederatedJob.objects.get().model_spec["hidden"] == [256, 256]


def test_final_model_values_fit_the_callback_body():
    """Every number of the final model, at its longest JSON spelling, fits the event's bytes."""
    longest = len(json.dumps(-2.2250738585072014e-308)) + 1  # a comma after each
    assert contract.MAX_FINAL_MODEL_VALUES * longest < contract.MAX_EVENT_BYTES
    assert contract.MAX_FINAL_MODEL_VALUES <= contract.MAX_MODEL_VALUES


def _ward_world(world, per_dataset: list[list[str]]) -> None:
    """Give the world's datasets a categorical column ``ward`` whose profile lists the categories
    ``per_dataset[i]`` (each held by more than 7 rows, as a profile lists them)."""
    for version, wards in zip(world["versions"], per_dataset, strict=True):
        version.schema = [*version.schema, {"name": "ward", "type": "str"}]
        version.profile = {
            "format": 2,
            "rows": 500,
            "columns": [
                {"name": "x1", "type": "float", "missing": 0, "count": 500},
                {
                    "name": "ward",
                    "type": "str",
                    "missing": 0,
                    "count": 500,
                    "categories": [{"value": w, "count": 10} for w in wards],
                    "other": 0,
                },
                {
                    "name": "label",
                    "type": "str",
                    "missing": 0,
                    "count": 500,
                    "categories": [{"value": "no", "count": 250}, {"value": "yes", "count": 250}],
                    "other": 0,
                },
            ],
        }
        version.save()


def test_job_form_an_mlp_over_the_limit_by_its_one_hot_width_is_refused_with_its_weights(
    pi_client, world
):
    """Two datasets list 6 + 6 wards with one in common: 11 categories, one-hot with the
    "(other)" column 12 inputs, plus x1: 13 inputs. Hidden 1024,64, 2 classes:
    13·1024 + 1024 + 1024·64 + 64 + 64·2 + 2 = 80,066 weights > 80,000. One input per feature
    (2) would give 2·1024 + 66,754 = 68,802, below the limit."""
    wards_a = [f"A{i}" for i in range(5)] + ["shared"]
    wards_b = [f"B{i}" for i in range(5)] + ["shared"]
    _ward_world(world, [wards_a, wards_b])

    response = pi_client.post(
        "/jobs/new/",
        _form_data(world, feature_columns="x1, ward", model_kind="mlp", mlp_hidden="1024,64"),
    )

    assert response.status_code == 200
    block = _field_block(response.content.decode(), "id_mlp_hidden")
    assert "This model has 80,066 weights" in block
    assert "13 inputs (12 of them for categorical features, one-hot" in block
    assert "at least" not in block
    assert FederatedJob.objects.count() == 0


def test_job_form_an_mlp_just_under_the_limit_with_its_one_hot_width_is_accepted(
    pi_client, world, fake_superlink, eager_celery
):
    """One ward fewer (10 categories, 12 inputs): 12·1024 + 66,754 = 79,042 ≤ 80,000."""
    wards_a = [f"A{i}" for i in range(5)] + ["shared"]
    wards_b = [f"B{i}" for i in range(4)] + ["shared"]
    _ward_world(world, [wards_a, wards_b])

    response = pi_client.post(
        "/jobs/new/",
        _form_data(world, feature_columns="x1, ward", model_kind="mlp", mlp_hidden="1024,64"),
    )

    assert response.status_code == 302
    assert FederatedJob.objects.get().model_spec["hidden"] == [1024, 64]


def test_job_form_a_model_size_with_a_truncated_profile_list_says_at_least(pi_client, world):
    """A profile lists at most 20 categories (``sandbox.profile.MAX_CATEGORIES``): a column
    with 20 listed may have more, so the count is a lower bound and says so. 20 + 1 + 1 = 22
    inputs: 22·1024 + 66,754 = 89,282 > 80,000."""
    wards = [f"W{i:02d}" for i in range(20)]
    _ward_world(world, [wards, wards])

    response = pi_client.post(
        "/jobs/new/",
        _form_data(world, feature_columns="x1, ward", model_kind="mlp", mlp_hidden="1024,64"),
    )

    block = _field_block(response.content.decode(), "id_mlp_hidden")
    assert "at least 89,282 weights" in block
    assert FederatedJob.objects.count() == 0
