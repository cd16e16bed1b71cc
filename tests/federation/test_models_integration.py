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

On the same federation, at the same time (issue 14, points 2 and 3): every other server-side
strategy the job form offers, and client-side differential privacy. The researcher submits six
more jobs through the form with the MLP job, all at once as researchers do, and the portal's
scheduler admits them onto the sites' pools: FedAdam with client-side fixed clipping (Flower's
``DifferentialPrivacyClientSideFixedClipping`` and the sites' clipping mod), FedYogi, FedAdagrad,
FedMedian, FedTrimmedAvg and Krum, one round each. Checked for each: it completed; the run config
every site receives names the strategy and its parameters as the form set them; the pooled
held-out accuracy is finite and above the held-out majority-class rate (computed here from the
sites' decrypted tables with the app's split rule, not from the portal's figures); the job page
names the strategy. For the DP job: the ε on the job page equals the accountant's
(``federation.privacy.epsilon``, dp-accounting) for its noise and rounds, and the page says the
clipping was client-side. The strategies' arithmetic against Flower's own classes is in
``test_flwr_strategies.py``; this module proves the whole path from the form to a completed job
for each of them. (One module, one federation: each federation's start and idle polling cost the
CI machine's two cores what the other modules' ClientApps need.)
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from django.test import Client
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import accuracy_score
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from federation import services
from federation.models import ComputePool, FederatedJob, JobStatus
from federation.privacy import epsilon as accountant_epsilon
from frp_flwr import contract
from tests.federation.conftest import flower_world, wait_for
from tests.federation.job_form import job_form_data, site_frames

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b", "hospital-c")
ROUNDS = 6  # the MLP job
#: One round: it takes each strategy's aggregate (and the DP job's noise) from the form to the final
#: model; the arithmetic of later rounds (server momentum, DP over rounds) is test_flwr_strategies'
#: and the accountant's. Each round costs every site a ClientApp process per job.
STRATEGY_ROUNDS = 1
NOISE, CLIP, DELTA = 0.2, 1.0, 1e-5

#: title → (form fields, the strategy spec the sites must receive, the label on the job page).
JOBS = {
    "FedAdam with client-side DP": (
        {
            "strategy_name": "fedadam",
            "server_eta": "0.1",
            "server_tau": "0.001",
            "privacy-dp": "client",
            "privacy-noise_multiplier": str(NOISE),
            "privacy-clipping_norm": str(CLIP),
            "privacy-delta": str(DELTA),
        },
        {"name": "fedadam", "eta": 0.1, "tau": 0.001},
        "FedAdam",
    ),
    "FedYogi": (
        {"strategy_name": "fedyogi", "server_eta": "0.05"},
        {"name": "fedyogi", "eta": 0.05},
        "FedYogi",
    ),
    "FedAdagrad": ({"strategy_name": "fedadagrad"}, {"name": "fedadagrad"}, "FedAdagrad"),
    "FedMedian": ({"strategy_name": "fedmedian"}, {"name": "fedmedian"}, "FedMedian"),
    "FedTrimmedAvg": (
        {"strategy_name": "fedtrimmedavg", "trimmed_beta": "0.2"},
        {"name": "fedtrimmedavg", "beta": 0.2},
        "FedTrimmedAvg",
    ),
    "Krum": ({"strategy_name": "krum", "krum_faulty": "0"}, {"name": "krum"}, "Krum"),
}


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
def submitted(cancer_world, django_db_blocker):
    """The MLP job and the six strategy jobs, posted through the job form at once (as researchers
    do) onto one federation: four jobs at a time on every site's pool (the world's pools take
    one), the MLP first, so the six one-round jobs run beside its six rounds in two waves."""
    w = cancer_world
    with django_db_blocker.unblock():
        ComputePool.objects.filter(site__in=[v.dataset.site for v in w.versions]).update(slots=4)
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
        mlp = FederatedJob.objects.get(title="Cancer MLP").pk
        strategies = {}
        for title, (fields, _, _) in JOBS.items():
            _, data = job_form_data(
                client,
                datasets=[str(v.pk) for v in w.versions],
                target="diagnosis",
                title=title,
                num_rounds=STRATEGY_ROUNDS,
                local_epochs=3,
                learning_rate=0.1,
                **fields,
            )
            response = client.post("/jobs/new/", data)
            assert response.status_code == 302, (title, response.content.decode()[-3000:])
            strategies[title] = FederatedJob.objects.get(title=title).pk
        # Everything is waited for and read here, in the first test's setup: every test of this
        # module has the live server in its closure, so pytest-django flushes the database after
        # each test (the job rows are gone by the second).
        return {
            "mlp": _mlp_outcome(w, client, form_page, mlp),
            "strategies": _strategy_outcome(w, client, strategies),
        }


@pytest.fixture(scope="module")
def outcome(submitted):
    return submitted["mlp"]


@pytest.fixture(scope="module")
def strategy_outcome(submitted):
    return submitted["strategies"]


def _mlp_outcome(w, client, form_page, pk) -> dict:
    """Wait for the MLP job (and its contribution) and read what its tests check."""
    job = FederatedJob.objects.get(pk=pk)

    def finished_with_contribution():
        j = FederatedJob.objects.get(pk=job.pk)
        if not j.is_terminal:
            return None
        if j.status == JobStatus.COMPLETED and not j.final_metrics.get("contribution"):
            return None
        return j

    job = wait_for(finished_with_contribution, timeout=900, what="the MLP job to finish")
    site_errors = {js.site.slug: js.last_error for js in job.sites.select_related("site")}
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


def _held_out_majority(w, job) -> float:
    """The share of the most frequent label among the pooled held-out rows (the app's split)."""
    spec = contract.JobSpec(
        sites={js.site.slug: contract.SitePointer("k", "d", 1) for js in job.sites.all()},
        target=job.target_column,
        features=list(job.feature_columns),
    )
    labels: list[str] = []
    for _site, frame in site_frames(w, job, spec):
        labels.extend(np.asarray(frame.y)[frame.test].astype(str).tolist())
    return Counter(labels).most_common(1)[0][1] / len(labels)


def _strategy_outcome(w, client, pks) -> dict:
    """Wait for the six strategy jobs and read what their tests check."""

    def all_finished():
        jobs = list(FederatedJob.objects.filter(pk__in=pks.values()))
        assert len(jobs) == len(pks), "job rows gone: read outside the first test's setup?"
        return jobs if all(j.is_terminal for j in jobs) else None

    wait_for(all_finished, timeout=1800, what="the six strategy jobs to finish")
    results = {}
    for title, pk in pks.items():
        job = FederatedJob.objects.get(pk=pk)
        results[title] = {
            "job": job,
            "site_errors": {js.site.slug: js.last_error for js in job.sites.select_related("site")},
            "sent_spec": contract.JobSpec.from_json(services.job_run_config(job).job_spec),
            "job_page": client.get(f"/jobs/{job.pk}/").content.decode(),
            "majority": _held_out_majority(w, job),
        }
    return results


@pytest.mark.parametrize("title", list(JOBS))
def test_each_strategy_completes_above_the_majority_class_and_is_named(strategy_outcome, title):
    result = strategy_outcome[title]
    job = result["job"]
    _, expected_strategy, label = JOBS[title]
    assert job.status == JobStatus.COMPLETED, (job.status_detail, result["site_errors"])
    # The run config every SuperNode receives carries the strategy and its parameters.
    sent = result["sent_spec"].strategy
    assert {k: sent.get(k) for k in expected_strategy} == expected_strategy
    accuracy = job.final_metrics["metrics"]["accuracy"]
    print(f"\n{title}: accuracy {accuracy:.4f}, held-out majority {result['majority']:.4f}")
    assert math.isfinite(accuracy)
    assert accuracy > result["majority"]
    shown = re.search(r'id="job-strategy">([^<]*)<', result["job_page"]).group(1)
    assert shown.startswith(label), shown


def test_client_side_dp_spends_the_accountants_epsilon(strategy_outcome):
    result = strategy_outcome["FedAdam with client-side DP"]
    job = result["job"]
    expected = accountant_epsilon(noise_multiplier=NOISE, rounds=STRATEGY_ROUNDS, delta=DELTA)
    assert job.privacy["dp"] == "client"
    assert result["sent_spec"].privacy.dp == "client"
    assert result["sent_spec"].privacy.clipping_norm == CLIP
    assert job.epsilon == pytest.approx(expected, rel=1e-9)
    page = result["job_page"]
    shown = float(re.search(r'id="job-epsilon" data-epsilon="([0-9.e+-]+)"', page).group(1))
    assert shown == pytest.approx(expected, rel=1e-9)
    assert re.search(r'id="job-dp">Client-side fixed clipping<', page)
    # The jobs without DP spent nothing.
    others = [r["job"] for t, r in strategy_outcome.items() if t != "FedAdam with client-side DP"]
    assert all(j.epsilon is None for j in others)
