"""Integration: an MLP trained with FedProx through the web form on a real Flower deployment,
against scikit-learn's MLPClassifier on the pooled data (issue 14, points 1 and 2; ADR 0022).

Three hospitals hold scikit-learn's breast-cancer data (569 rows, 30 numeric features, a 0/1
diagnosis), dealt IID. The researcher opens the job form (Django test client, as a browser posts
it), ticks the datasets and the target, chooses *Multilayer perceptron* (hidden 16, ReLU) and
*FedProx* (μ 0.01) and submits. Real parts: PostgreSQL, a Celery worker with beat on Redis, a
SuperLink and three SuperNodes, the live server's callback endpoint.

Checked: the run config every site received holds the model and the strategy; the federated
pooled held-out accuracy is at least 0.98 of scikit-learn's ``MLPClassifier(hidden_layer_sizes=
(16,))`` fitted on the pooled training rows with the same splits (each site's own held-out rows,
drawn by the app's split rule) and the same standardisation — within one held-out row; the job
page and the credit statement name the model, the strategy and its parameter and the job page
says how the contribution's coalition models were rebuilt; the contribution event arrived.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from django.test import Client
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import accuracy_score
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from federation.models import FederatedJob, JobStatus
from frp_flwr import contract
from tests.federation.conftest import flower_world, wait_for
from tests.federation.job_form import job_form_data, site_frames

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b", "hospital-c")
ROUNDS = 6


def _write_sites(folder: Path) -> dict[str, Path]:
    data = load_breast_cancer()
    names = [n.replace(" ", "_") for n in data.feature_names]
    order = np.random.default_rng(3).permutation(len(data.target))
    folder.mkdir(parents=True)
    paths = {}
    for k, site in enumerate(SITES):
        path = folder / f"{site}.csv"
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow([*names, "diagnosis"])
            for i in sorted(order[k :: len(SITES)]):
                writer.writerow([*(repr(float(v)) for v in data.data[i]), f"d{data.target[i]}"])
        paths[site] = path
    return paths


@pytest.fixture(scope="module")
def cancer_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("flower-mlp")
    with flower_world(
        SITES,
        root=root,
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        csvs=_write_sites(root / "incoming"),
        env={"FRP_ROUND_TIMEOUT": "400"},  # a loaded 2-core machine starts ClientApps slowly
    ) as world:
        yield world


def _centralised(w, job) -> tuple[float, int]:
    """scikit-learn's MLP on the pooled rows with the app's splits and standardisation."""
    spec = contract.JobSpec(
        sites={js.site.slug: contract.SitePointer("k", "d", 1) for js in job.sites.all()},
        target=job.target_column,
        features=list(job.feature_columns),
    )
    parts = {"train": ([], []), "test": ([], [])}
    for _site, frame in site_frames(w, job, spec):
        X = np.column_stack([frame.values[f] for f in spec.features])
        for part, rows in (("train", frame.train), ("test", frame.test)):
            parts[part][0].append(X[rows])
            parts[part][1].append(frame.y[rows])
    X_train, X_test = (np.vstack(parts[p][0]) for p in ("train", "test"))
    y_train, y_test = (np.concatenate(parts[p][1]).astype(str) for p in ("train", "test"))
    model = make_pipeline(
        StandardScaler(),
        MLPClassifier(hidden_layer_sizes=(16,), max_iter=2000, random_state=0),
    ).fit(X_train, y_train)
    return float(accuracy_score(y_test, model.predict(X_test))), len(y_test)


@pytest.fixture(scope="module")
def outcome(cancer_world, django_db_blocker):
    w = cancer_world
    with django_db_blocker.unblock():
        client = Client()
        client.force_login(w.researcher)
        form_page, data = job_form_data(
            client,
            datasets=[str(v.pk) for v in w.versions],
            target="diagnosis",
            title="Cancer MLP",
            num_rounds=ROUNDS,
            local_epochs=5,
            learning_rate=0.05,
            model_kind="mlp",
            mlp_hidden="16",
            mlp_activation="relu",
            strategy_name="fedprox",
            fedprox_mu="0.01",
        )
        response = client.post("/jobs/new/", data)
        assert response.status_code == 302, response.content.decode()[-3000:]
        job = FederatedJob.objects.get(title="Cancer MLP")

        def finished_with_contribution():
            j = FederatedJob.objects.get(pk=job.pk)
            if not j.is_terminal:
                return None
            if j.status == JobStatus.COMPLETED and not j.final_metrics.get("contribution"):
                return None
            return j

        job = wait_for(finished_with_contribution, timeout=900, what="the MLP job to finish")
        site_errors = {js.site.slug: js.last_error for js in job.sites.select_related("site")}
        from federation import services

        sent_spec = contract.JobSpec.from_json(services.job_run_config(job).job_spec)
        centralised, test_rows = _centralised(w, job)
        return {
            "site_errors": site_errors,
            "sent_spec": sent_spec,
            "job": job,
            "form_page": form_page,
            "job_page": client.get(f"/jobs/{job.pk}/").content.decode(),
            "credit_page": client.get(f"/accounting/credit/jobs/{job.pk}/").content.decode(),
            "centralised": centralised,
            "test_rows": test_rows,
        }


def test_the_form_offers_models_and_strategies_with_help(outcome):
    page = outcome["form_page"]
    assert 'name="model_kind"' in page and "Multilayer perceptron (MLP)" in page
    assert 'name="strategy_name"' in page and ">FedTrimmedAvg<" in page and ">Krum<" in page
    assert "proximal term" in page


def test_mlp_with_fedprox_reaches_sklearn_mlp_on_pooled_data(outcome):
    job = outcome["job"]
    assert job.status == JobStatus.COMPLETED, (job.status_detail, outcome["site_errors"])
    assert job.model_spec["kind"] == "mlp" and job.model_spec["hidden"] == [16]
    assert job.strategy_spec == {"name": "fedprox", "mu": 0.01}
    federated = job.final_metrics["metrics"]["accuracy"]
    print(
        f"\ncancer mlp+fedprox: federated {federated:.4f} centralised {outcome['centralised']:.4f}"
    )
    assert federated >= 0.98 * outcome["centralised"] - 1.0 / outcome["test_rows"]
    assert federated > 0.9  # far above the majority class (0.63)
    # The model has the MLP's shapes: 30 features → 16 hidden → 2 classes.
    model = job.final_metrics.get("model") or []
    if model:
        assert [np.asarray(layer).shape for layer in model] == [(30, 16), (16,), (16, 2), (2,)]


def test_every_site_received_the_model_and_the_strategy_in_the_run_config(outcome):
    spec = outcome["sent_spec"]
    assert spec.model["kind"] == "mlp" and spec.strategy["name"] == "fedprox"


def test_the_job_page_and_credit_statement_name_model_strategy_and_contribution_method(outcome):
    page = outcome["job_page"]
    assert "Multilayer perceptron (hidden 16, relu" in page
    assert "FedProx (μ = 0.01)" in page
    assert "Coalition models rebuilt from the logged updates by FedProx" in page
    credit = outcome["credit_page"]
    assert "multilayer perceptron (hidden 16, relu" in credit and "FedProx (μ = 0.01)" in credit


def test_the_contribution_was_measured_for_the_mlp(outcome):
    contribution = outcome["job"].final_metrics["contribution"]
    assert not contribution.get("error"), json.dumps(contribution)[:500]
    assert contribution["method"] == "exact"
    assert contribution["utilities"]["0"]["0,1,2"] > 0.9
