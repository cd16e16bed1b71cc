"""Integration: a secure-aggregation (SecAgg+) job through the web form on a real Flower deployment
(issue 14, point 4).

Three hospitals hold the demo breast-cancer data. The researcher ticks "Secure aggregation
(SecAgg+)" on the job form; a plain FedAvg job with the same columns and settings is the reference.
Real parts: PostgreSQL, a Celery worker with beat on Redis, a SuperLink, three SuperNodes, the live
server's callback endpoint; the ServerApp logs every reply it receives (``reply-log``) and every
site's ClientApp every message it receives (``received-log``).

Checked:

- the SecAgg job's final model and accuracy match the plain FedAvg job's (SecAgg+ sums the same
  weighted updates; only its quantisation differs);
- each site's true local update of each round is recomputed here from the site's own data (its
  store and key, the global model and rules it received) — and the recomputation is right: the
  next global model is the example-weighted mean of them;
- no training reply the ServerApp received holds any site's update or local weights, nor anything
  close: its plain parameter record is empty and its masked vector is not near any of them;
- the job page says SecAgg+ was used and that contribution is by data volume, and accounting
  scored the sites by data volume only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from django.test import Client
from flwr.common import bytes_to_ndarray

from accounting.models import ContributionScore
from federation import artifacts, services
from federation.models import ComputePool, FederatedJob, JobStatus
from frp_flwr import contract
from frp_flwr.preprocess import Fitted, site_frame, transform
from frp_flwr.task import train_sgd
from tests.federation.conftest import flower_world, wait_for
from tests.federation.job_form import decrypted_table, job_form_data

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b", "hospital-c")
#: Two rounds: the second starts from the first's secure aggregate, which is what the recomputation
#: checks; each round costs every site four ClientApp processes (SecAgg+'s exchanges).
ROUNDS, EPOCHS, LR = 2, 3, 0.1


@pytest.fixture(scope="module")
def secagg_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        SITES,
        root=tmp_path_factory.mktemp("flower-secagg"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        # each of SecAgg+'s four exchanges a round waits up to this (a shared 2-CPU machine can
        # take minutes to start a ClientApp process); a stage that outlasts it halts the round
        env={"FRP_ROUND_TIMEOUT": "900"},
    ) as world:
        yield world


def _done(pk):
    job = FederatedJob.objects.get(pk=pk)
    return job if job.is_terminal else None


@pytest.fixture(scope="module")
def jobs(secagg_world, django_db_blocker):
    w = secagg_world
    with django_db_blocker.unblock():
        # The plain reference job runs beside the SecAgg job (the world's pools take one job).
        ComputePool.objects.filter(site__in=[v.dataset.site for v in w.versions]).update(slots=2)
        client = Client()
        client.force_login(w.researcher)
        form_page, data = job_form_data(
            client,
            datasets=[str(v.pk) for v in w.versions],
            target="diagnosis",
            title="secure",
            num_rounds=ROUNDS,
            local_epochs=EPOCHS,
            learning_rate=LR,
            secure_aggregation="on",
        )
        assert "Secure aggregation (SecAgg+)" in form_page
        response = client.post("/jobs/new/", data)
        assert response.status_code == 302, response.content.decode()[-3000:]
        secure = FederatedJob.objects.get(title="secure")
        assert secure.secure_aggregation
        plain = services.job_submit(
            by=w.researcher,
            project=w.project,
            dataset_versions=w.versions,
            title="plain",
            target_column="diagnosis",
            feature_columns=list(secure.feature_columns),
            preprocessing=[contract.FeaturePlan(**p) for p in secure.preprocessing],
            num_rounds=ROUNDS,
            local_epochs=EPOCHS,
            learning_rate=LR,
        )
        secure = wait_for(lambda: _done(secure.pk), timeout=600, what="the SecAgg job")
        plain = wait_for(lambda: _done(plain.pk), timeout=600, what="the plain FedAvg job")
        if secure.status == JobStatus.COMPLETED:
            wait_for(
                lambda: ContributionScore.objects.filter(job=secure).exists(),
                timeout=120,
                what="the SecAgg job's contribution scores",
            )
        page = client.get(f"/jobs/{secure.pk}/").content.decode()
        scores = list(ContributionScore.objects.filter(job=secure).select_related("site"))
        frames = {site: _site_rows(w, secure, site) for site in SITES}
        # the final models, from the model store (ADR 0026), read while the fixture's store is set
        models = {j.pk: (artifacts.model_payload(j) or {}).get("weights") for j in (secure, plain)}
        return secure, plain, page, scores, frames, models


def _site_rows(w, job, site: str):
    """The site's training frame, read from its own store with its own key."""
    js = job.sites.select_related("dataset_version__dataset").get(site__slug=site)
    table = decrypted_table(w, site, js.dataset_version)
    spec = contract.JobSpec(
        sites={s: contract.SitePointer("k", "d", 1) for s in SITES},
        target=job.target_column,
        features=list(job.feature_columns),
        plans=[contract.FeaturePlan(**p) for p in job.preprocessing],
    )
    return site_frame(table, spec, test_fraction=0.2, seed=42)


def _true_updates(w, job, frames) -> dict[int, dict[str, tuple[list, list, int]]]:
    """round → site → (global model received, local weights, training rows), recomputed from
    each site's frame (``frames``: site → its rows, read from its own store)."""
    out: dict[int, dict[str, tuple[list, list, int]]] = {}
    for site in SITES:
        frame = frames[site]
        for line in (w.received_log_dir / f"{site}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry["message_type"] != "train" or entry["run_config"]["job-id"] != job.pk:
                continue
            content = entry["content"]
            start = [np.asarray(a, dtype=np.float64) for a in content["arrays"]]
            config = content["config"]
            fitted = Fitted.from_text(config["preprocess"])
            data = transform(frame, fitted, "train")
            local, _ = train_sgd(
                [a.copy() for a in start],
                data.X,
                data.y,
                epochs=EPOCHS,
                learning_rate=LR,
                batch_size=32,
                seed=int(config["server-round"]),
                task=fitted.task,
            )
            out.setdefault(int(config["server-round"]), {})[site] = (start, local, len(data.y))
    return out


def _reply_vectors(w, job) -> list[np.ndarray]:
    """Per training reply the ServerApp logged for ``job``, each list of numpy-serialised arrays
    in its records, the arrays raveled and joined (SecAgg+'s masked vector: factor + layers)."""
    (log,) = w.reply_log_dir.glob(f"job-{job.pk}-replies.jsonl")
    vectors = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry["message_type"] != "train" or entry["content"] is None:
            continue
        for key, record in entry["content"].items():
            if isinstance(record, list):  # an array record: the plain parameters, emptied
                assert record == [], f"{key}: a training reply carried plain arrays"
                continue
            for value in record.values():
                items = value if isinstance(value, list) else [value]
                arrays = [
                    bytes_to_ndarray(bytes.fromhex(item)).ravel()
                    for item in items
                    if isinstance(item, str) and item.startswith("934e554d5059")  # b"\x93NUMPY"
                ]
                if arrays:
                    vectors.append(np.concatenate(arrays))
    return vectors


def test_secagg_job_completes_with_the_accuracy_of_plain_fedavg(jobs):
    secure, plain, *_ = jobs
    assert secure.status == JobStatus.COMPLETED, secure.status_detail
    assert plain.status == JobStatus.COMPLETED, plain.status_detail
    a, b = secure.final_metrics["eval_accuracy"], plain.final_metrics["eval_accuracy"]
    print(f"\nSecAgg+ accuracy {a:.4f}, plain FedAvg {b:.4f}")
    assert a == pytest.approx(b, abs=0.01)
    models = jobs[5]
    assert models[secure.pk] and models[plain.pk]
    for x, y in zip(models[secure.pk], models[plain.pk], strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-3)


def test_the_serverapp_never_held_a_sites_update(jobs, secagg_world):
    secure, frames = jobs[0], jobs[4]
    w = secagg_world
    truth = _true_updates(w, secure, frames)
    assert sorted(truth) == list(range(1, ROUNDS + 1))
    assert all(set(sites) == set(SITES) for sites in truth.values())
    # The recomputation is right: each next global model is the mean weighted by the sites'
    # training examples as released (ADR 0036, amendment: what every site receives).
    finals = [np.asarray(a) for a in jobs[5][secure.pk]]
    for rnd, sites in truth.items():
        nxt = truth[rnd + 1][SITES[0]][0] if rnd < ROUNDS else finals
        total = sum(contract.released(n) for _, _, n in sites.values())
        for k, layer in enumerate(nxt):
            start = sites[SITES[0]][0][k]
            mean = (
                sum(contract.released(n) * (local[k] - s[k]) for s, local, n in sites.values())
                / total
            )
            np.testing.assert_allclose(layer, start + mean, atol=1e-4)
    vectors = _reply_vectors(w, secure)
    assert len(vectors) >= ROUNDS * len(SITES)  # masked vectors (+ factor) of every round
    secrets = []
    for sites in truth.values():
        for start, local, _ in sites.values():
            secrets.append(np.concatenate([np.ravel(a) for a in local]))
            secrets.append(
                np.concatenate([np.ravel(a - s) for a, s in zip(local, start, strict=True)])
            )
    compared = 0
    for vector in vectors:
        for secret in secrets:
            for j in range(vector.size - secret.size + 1):  # any alignment
                window = vector[j : j + secret.size].astype(np.float64)
                assert not np.allclose(window, secret, atol=1e-2)
                compared += 1
    assert compared >= len(vectors) * len(secrets)  # every masked vector was compared


def test_job_page_and_accounting_say_data_volume(jobs):
    secure, _, page, scores, *_ = jobs
    assert "SecAgg+" in page and "data volume" in page
    assert "Individual updates were hidden by secure aggregation" in page
    assert secure.final_metrics["updates_hidden"] is True
    assert "contribution" not in secure.final_metrics  # no coalition utilities were posted
    assert {s.method for s in scores} == {"data_volume"}
    assert sorted(s.site.slug for s in scores) == sorted(SITES)
    assert sum(s.share for s in scores) == pytest.approx(1.0)
