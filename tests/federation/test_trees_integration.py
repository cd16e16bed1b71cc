"""Integration: gradient-boosted trees (XGBoost, Flower's FedXgbBagging) through the web form
(issue 14, point 1).

Three hospitals hold scikit-learn's wine data (178 rows, 13 numeric features, three cultivars as
text labels), dealt IID (a seeded shuffle, round-robin). The researcher ticks the three datasets
and the target on the job form (Django test client, as a browser posts it), chooses the model
"Gradient-boosted trees" with 2 local boosting rounds, max depth 3 and eta 0.1, 4 rounds, and
submits. Real parts: PostgreSQL, a Celery worker with beat on Redis, a SuperLink and three
SuperNodes, the live server's callback endpoint, the accounting steps.

Checked against XGBoost itself on the pooled training rows with the same splits (each site's own
held-out rows, drawn by the app's split rule) and the same hyper-parameters, boosted as many
rounds as the federated booster has trees (rounds × sites × local rounds; with rounds × local
rounds only, eta 0.1 left XGBoost at 0.83 on wine, under the federated 0.97): the federated pooled accuracy is at
least 0.95 of the centralised one, less one held-out row. The job page names the contribution
method (data volume) and says why; every site's contribution is a data-volume score.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb
from django.test import Client
from sklearn.datasets import load_wine
from sklearn.metrics import accuracy_score

from accounting.models import ContributionMethod, ContributionScore
from federation.models import FederatedJob, JobStatus
from frp_flwr import contract, trees
from tests.federation.conftest import flower_world, wait_for
from tests.federation.job_form import job_form_data, site_frames

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b", "hospital-c")
ROUNDS = 4
MODEL = {"local_rounds": 2, "max_depth": 3, "eta": 0.1}


def _write_sites(folder: Path) -> dict[str, Path]:
    wine = load_wine()
    names = [n.replace("/", "_") for n in wine.feature_names]
    order = np.random.default_rng(11).permutation(len(wine.target))
    folder.mkdir(parents=True)
    paths = {}
    for i, site in enumerate(SITES):
        path = folder / f"{site}.csv"
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow([*names, "cultivar"])
            for r in sorted(order[i :: len(SITES)]):
                writer.writerow(
                    [*(repr(float(v)) for v in wine.data[r]), f"class_{wine.target[r]}"]
                )
        paths[site] = path
    return paths


@pytest.fixture(scope="module")
def trees_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("flower-trees")
    with flower_world(
        SITES,
        root=root,
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        csvs=_write_sites(root / "incoming"),
        # 2 shared cores: a ClientApp importing XGBoost under other jobs' load may take minutes
        env={"FRP_ROUND_TIMEOUT": "600"},
    ) as world:
        yield world


def _centralised(w, job) -> tuple[float, int]:
    """XGBoost on the pooled training rows, same splits and hyper-parameters (module doc)."""
    spec = contract.JobSpec(
        sites={js.site.slug: contract.SitePointer("k", "d", 1) for js in job.sites.all()},
        target=job.target_column,
        features=list(job.feature_columns),
        plans=[contract.FeaturePlan(**p) for p in job.preprocessing],
    )
    parts = {"train": ([], []), "test": ([], [])}
    for _site, frame in site_frames(w, job, spec):
        X = np.column_stack([frame.values[f] for f in spec.features])
        for part, rows in (("train", frame.train), ("test", frame.test)):
            parts[part][0].append(X[rows])
            parts[part][1].append(frame.y[rows])
    X_train, X_test = (np.vstack(parts[p][0]) for p in ("train", "test"))
    classes = sorted({str(v) for v in np.concatenate(parts["train"][1])})
    y_train, y_test = (
        np.array([classes.index(str(v)) for v in np.concatenate(parts[p][1])])
        for p in ("train", "test")
    )
    params = trees.xgb_params(
        trees.model_spec(MODEL), task="classification", num_classes=3, base_score=0.5, seed=1
    )
    booster = xgb.train(
        params,
        xgb.DMatrix(X_train, label=y_train),
        num_boost_round=ROUNDS * len(SITES) * MODEL["local_rounds"],
    )
    predicted = booster.predict(xgb.DMatrix(X_test)).argmax(axis=1)
    return float(accuracy_score(y_test, predicted)), len(y_test)


@pytest.fixture(scope="module")
def outcome(trees_world, django_db_blocker):
    w = trees_world
    with django_db_blocker.unblock():
        client = Client()
        client.force_login(w.researcher)
        form_page, data = job_form_data(
            client,
            datasets=[str(v.pk) for v in w.versions],
            target="cultivar",
            title="Wine, boosted",
            num_rounds=ROUNDS,
            model_kind="xgboost",
            **{f"xgb_{k}": v for k, v in MODEL.items()},
        )
        response = client.post("/jobs/new/", data)
        assert response.status_code == 302, response.content.decode()[-3000:]
        job = FederatedJob.objects.get(title="Wine, boosted")

        def done(pk):
            j = FederatedJob.objects.get(pk=pk)
            return j if j.is_terminal else None

        job = wait_for(lambda: done(job.pk), timeout=1200, what="the trees job to finish")
        assert job.status == JobStatus.COMPLETED, (job.status_detail, job.failure_reason)
        scores = wait_for(
            lambda: list(ContributionScore.objects.filter(job=job)) or None,
            timeout=120,
            what="the trees job's contribution scores",
        )
        job_page = client.get(f"/jobs/{job.pk}/").content.decode()
        centralised, test_rows = _centralised(w, job)
        # read here: the live server's transactional_db flushes the database after each test
        facts = {
            "rounds": job.round_metrics.count(),
            "train_rows": {
                js.site.slug: sum(m.train_examples for m in js.round_metrics.filter(ok=True))
                for js in job.sites.select_related("site")
            },
            "scores": {s.site.slug: s.raw_value for s in scores},
        }
        return job, form_page, job_page, scores, centralised, test_rows, facts


def test_the_form_offers_trees_with_their_hyper_parameters(outcome):
    _, form_page, *_ = outcome
    assert 'value="xgboost"' in form_page and "Gradient-boosted trees" in form_page
    assert 'name="xgb_local_rounds"' in form_page and 'name="xgb_max_depth"' in form_page
    assert "Trees each site adds per round" in form_page


def test_trees_train_to_within_target_of_xgboost_on_the_pooled_rows(outcome):
    job, _, _, _, centralised, test_rows, facts = outcome
    assert job.status == JobStatus.COMPLETED, job.status_detail
    assert job.model == "xgboost" and job.model_spec["max_depth"] == 3
    federated = job.final_metrics["metrics"]["accuracy"]
    print(f"\nwine trees: federated {federated:.4f} centralised xgboost {centralised:.4f}")
    assert centralised > 0.85
    assert federated >= 0.95 * centralised - 1.0 / test_rows
    assert job.final_metrics["baseline"]["better"] is True
    assert facts["rounds"] == ROUNDS


def test_contribution_is_data_volume_and_the_job_page_says_why(outcome):
    job, _, job_page, scores, _, _, facts = outcome
    assert {s.method for s in scores} == {ContributionMethod.DATA_VOLUME}
    assert len(scores) == len(SITES)
    assert facts["scores"] == pytest.approx(facts["train_rows"])
    assert all(rows > 0 for rows in facts["train_rows"].values())
    assert "contribution" not in job.final_metrics  # no coalition models were scored
    assert 'id="contribution-method"' in job_page
    assert "Contribution method: <strong>data volume</strong>" in job_page
    assert "cannot be rebuilt from the logged updates" in job_page
    assert "Gradient-boosted trees (XGBoost, bagged" in job_page and "FedXgbBagging" in job_page
