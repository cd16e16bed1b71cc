"""The final model as an artifact (issue 14, point 6) and resuming a failed job (point 5), portal
side: the model goes to the model store, never into the row; the ``.skops`` file leaves only
through the airlock and, loaded with skops, predicts what the federation predicts on the same raw
rows; the model card; the resume service, its page action and its audit event."""

from __future__ import annotations

import html
import importlib
import json
from dataclasses import asdict

import numpy as np
import pytest
import skops.io as sio
from django.apps import apps as django_apps
from django.urls import reverse

from federation import artifacts, services
from federation.exporters import EXPORTERS, ExportError, ExportInput, export
from federation.models import (
    FederatedJob,
    JobSite,
    JobSiteStatus,
    JobStatus,
    RoundMetric,
    SiteRoundMetric,
)
from frp_flwr import checkpoints, contract, preprocess, task
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent, Membership, ProjectRole, Role
from sandbox.storage import store_from_url
from tests.factories import DatasetVersionFactory, ProjectFactory, ProjectMemberFactory, UserFactory

pytestmark = pytest.mark.django_db

RNG = np.random.default_rng(7)
N = 60


@pytest.fixture(autouse=True)
def model_store(settings, tmp_path):
    settings.FRP_MODEL_STORE_URL = (tmp_path / "model-store").as_uri()
    return store_from_url(settings.FRP_MODEL_STORE_URL)


def _fitted(task_="classification", classes=("no", "yes", "maybe")) -> preprocess.Fitted:
    features = [
        preprocess.FittedFeature("age", "numeric", "median", True, fill=49.5),
        preprocess.FittedFeature(
            "colour", "categorical", "most_frequent", False, fill="red", vocabulary=["blue", "red"]
        ),
        preprocess.FittedFeature("dose", "numeric", "mean", False, fill=1.25),
    ]
    fitted = preprocess.Fitted(task_, list(classes), features)
    d = len(fitted.columns())
    fitted.mean = list(RNG.normal(0, 1, d))
    fitted.std = list(RNG.uniform(0.5, 2.0, d))
    if task_ == "regression":
        fitted.target_mean, fitted.target_std = 120.0, 15.0
    return fitted


def _raw(fitted) -> tuple[np.ndarray, preprocess.SiteFrame]:
    """Raw rows as a researcher has them (missing cells, a colour outside the vocabulary) and
    the same rows as the federation's SiteFrame."""
    age = RNG.normal(50, 12, N)
    age[[2, 11, 30]] = np.nan
    colour = np.array(RNG.choice(["red", "blue", "green"], N), dtype=object)
    colour[[5, 17]] = None
    dose = RNG.uniform(0, 3, N)
    dose[[8]] = np.nan
    frame = preprocess.SiteFrame(
        {"age": age, "colour": colour, "dose": dose},
        (
            np.array([fitted.classes[0]] * N, dtype=object)
            if fitted.task == "classification"
            else np.zeros(N)
        ),
        np.arange(N),
        np.arange(0),
        N,
        0,
    )
    raw = np.empty((N, 3), dtype=object)
    raw[:, 0], raw[:, 1], raw[:, 2] = age, colour, dose
    return raw, frame


@pytest.fixture
def world():
    project = ProjectFactory()
    researcher = ProjectMemberFactory(project=project, role=ProjectRole.MEMBER).user
    versions = [DatasetVersionFactory(), DatasetVersionFactory()]
    stewards = []
    for v in versions:
        steward = UserFactory()
        Membership.objects.create(
            user=steward, institution=v.dataset.site.institution, role=Role.DATA_STEWARD
        )
        stewards.append(steward)
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=researcher,
        title="artifact",
        target_column="label",
        feature_columns=["age", "colour", "dose"],
        status=JobStatus.RUNNING,
        flower_run_id="41",
        num_rounds=4,
    )
    for v in versions:
        JobSite.objects.create(job=job, site=v.dataset.site, dataset_version=v)
    return dict(
        project=project, researcher=researcher, versions=versions, stewards=stewards, job=job
    )


def _finish(job, fitted, weights) -> None:
    event = contract.Finished(
        rounds=job.num_rounds,
        eval_accuracy=0.8,
        eval_loss=0.4,
        eval_examples=20,
        classes=fitted.classes,
        model=[w.tolist() for w in weights],
        preprocessing=asdict(fitted),
    )
    services.job_callback_record(job_id=job.pk, seq=job.callback_seq + 1, event=event)
    FederatedJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    job.refresh_from_db()


def _weights(fitted) -> list[np.ndarray]:
    d, k = len(fitted.columns()), max(1, len(fitted.classes))
    return [RNG.normal(0, 1, (d, k)), RNG.normal(0, 1, k)]


def _approve(world) -> None:
    release = services.release_request(by=world["researcher"], job=world["job"])
    for steward, v in zip(world["stewards"], world["versions"], strict=True):
        services.release_decide(
            by=steward, release_id=release.pk, site=v.dataset.site, approve=True
        )


# --- the model in the store -------------------------------------------------------------------


def test_finished_writes_the_model_to_the_store_not_the_row(world, model_store):
    fitted = _fitted()
    weights = _weights(fitted)

    _finish(world["job"], fitted, weights)

    job = FederatedJob.objects.get(pk=world["job"].pk)
    assert "model" not in job.final_metrics
    assert job.model_key == f"models/job-{job.pk}/model.json"
    stored = json.loads(model_store.get_bytes(job.model_key))
    assert np.allclose(stored["weights"][0], weights[0])
    assert stored["classes"] == ["no", "yes", "maybe"]
    assert artifacts.has_model(job)


def test_a_store_that_fails_records_nothing_so_the_serverapp_can_retry(world, settings):
    settings.FRP_MODEL_STORE_URL = "ftp://nowhere/models"
    fitted = _fitted()

    with pytest.raises(artifacts.ArtifactError, match="FRP_MODEL_STORE_URL"):
        _finish(world["job"], fitted, _weights(fitted))

    job = FederatedJob.objects.get(pk=world["job"].pk)
    assert (job.callback_seq, job.model_key, job.final_metrics) == (0, "", {})


def test_the_data_migration_moves_a_rows_model_into_the_store(world, model_store):
    job = world["job"]
    FederatedJob.objects.filter(pk=job.pk).update(
        final_metrics={"classes": ["a", "b"], "model": [[[0.5]], [0.1]], "rounds": 2}
    )
    migration = importlib.import_module(
        "federation.migrations.0009_final_model_in_store_and_resume"
    )

    migration.models_to_store(django_apps, None)

    job.refresh_from_db()
    assert "model" not in job.final_metrics and job.final_metrics["rounds"] == 2
    assert json.loads(model_store.get_bytes(job.model_key))["weights"] == [[[0.5]], [0.1]]
    migration.models_to_rows(django_apps, None)  # and back
    job.refresh_from_db()
    assert job.final_metrics["model"] == [[[0.5]], [0.1]] and job.model_key == ""


# --- the .skops file through the airlock -------------------------------------------------------


def test_skops_file_is_404_before_the_airlock_and_predicts_as_the_federation_after(
    client, world, tmp_path
):
    fitted = _fitted()
    weights = _weights(fitted)
    _finish(world["job"], fitted, weights)
    client.force_login(world["researcher"])
    url = reverse("federation:job_model_skops", args=[world["job"].pk])
    assert client.get(url).status_code == 404  # no release asked

    release = services.release_request(by=world["researcher"], job=world["job"])
    assert client.get(url).status_code == 404  # pending
    services.release_decide(
        by=world["stewards"][0],
        release_id=release.pk,
        site=world["versions"][0].dataset.site,
        approve=True,
    )
    assert client.get(url).status_code == 404  # one of two sites
    services.release_decide(
        by=world["stewards"][1],
        release_id=release.pk,
        site=world["versions"][1].dataset.site,
        approve=True,
    )
    response = client.get(url)

    assert response.status_code == 200
    assert "job-" in response["Content-Disposition"] and ".skops" in response["Content-Disposition"]
    path = tmp_path / "model.skops"
    path.write_bytes(response.content)
    untrusted = sio.get_untrusted_types(file=path)
    assert all(t.startswith(("sklearn.", "numpy.")) for t in untrusted), untrusted
    model = sio.load(path, trusted=untrusted)
    raw, frame = _raw(fitted)
    federation = task.predict_proba(weights, preprocess.transform(frame, fitted, "train").X)
    np.testing.assert_allclose(model.predict_proba(raw), federation, rtol=0, atol=1e-12)
    assert list(model.predict(raw)) == [fitted.classes[i] for i in federation.argmax(axis=1)]


def test_an_outsider_gets_404_for_the_released_file(client, world):
    fitted = _fitted()
    _finish(world["job"], fitted, _weights(fitted))
    _approve(world)
    client.force_login(UserFactory())

    assert (
        client.get(reverse("federation:job_model_skops", args=[world["job"].pk])).status_code == 404
    )


@pytest.mark.parametrize("classes", [("no", "yes"), ("a", "b", "c", "d")])
def test_the_linear_exporter_matches_softmax_for_binary_and_multiclass(classes):
    fitted = _fitted(classes=classes)
    weights = _weights(fitted)
    raw, frame = _raw(fitted)

    model = export("logreg", ExportInput("classification", list(classes), weights, asdict(fitted)))

    want = task.predict_proba(weights, preprocess.transform(frame, fitted, "train").X)
    np.testing.assert_allclose(model.predict_proba(raw), want, rtol=0, atol=1e-12)


def test_the_linear_exporter_gives_regression_in_the_targets_units():
    fitted = _fitted("regression", classes=())
    weights = _weights(fitted)
    raw, frame = _raw(fitted)

    model = export("linear", ExportInput("regression", [], weights, asdict(fitted)))

    X = preprocess.transform(frame, fitted, "train").X
    want = task.predict(weights, X) * 15.0 + 120.0  # the ClientApp's mapping back to units
    np.testing.assert_allclose(model.predict(raw), want, rtol=1e-12, atol=1e-9)


def test_a_kind_without_an_exporter_says_so_and_the_registry_takes_new_kinds():
    with pytest.raises(ExportError, match="no exporter for 'forest' models"):
        export("forest", ExportInput("classification", [], [], {}))
    EXPORTERS["forest"] = lambda m: "an estimator"
    try:
        assert export("forest", ExportInput("classification", [], [], {})) == "an estimator"
    finally:
        del EXPORTERS["forest"]


# --- the model card ----------------------------------------------------------------------------


def test_model_card_page_and_json_name_datasets_strategy_rounds_and_the_file(client, world):
    fitted = _fitted()
    _finish(world["job"], fitted, _weights(fitted))
    client.force_login(world["researcher"])
    url = reverse("federation:job_model_card", args=[world["job"].pk])

    page = client.get(url)
    card = client.get(url, {"format": "json"}).json()

    assert page.status_code == 200
    text = page.content.decode()
    for v in world["versions"]:
        assert v.dataset.slug in text
    assert "no differential privacy" in text
    # the job page's wording (federation.method), not the stored codes
    assert _dd(text, "card-model-kind") == "Logistic (softmax) regression"
    assert _dd(text, "card-strategy") == "FedAvg"
    assert "available once the airlock has released it" in text
    assert card["rounds"] == 4 and card["strategy"] == "fedavg"
    assert {d["dataset"] for d in card["datasets"]} == {v.dataset.slug for v in world["versions"]}
    assert card["file"]["exportable"] is True and card["epsilon"] is None
    client.force_login(UserFactory())
    assert client.get(url).status_code == 404


def test_a_trees_job_is_not_exportable_yet_and_its_card_page_and_files_say_so(client, world):
    """Gradient-boosted trees (``model_spec.kind == "xgboost"``): the ServerApp sends no booster,
    the exporter registry's ``xgboost`` entry refuses, and after the airlock the card, the job
    page and both file URLs say it, with no 500."""
    job = world["job"]
    job.model, job.model_spec = "xgboost", {"kind": "xgboost", "max_depth": 3}
    job.save(update_fields=["model", "model_spec"])
    fitted = _fitted()
    _finish(job, fitted, [])  # the trees ServerApp's finished event: no weights
    _approve(world)
    client.force_login(world["researcher"])

    card_url = reverse("federation:job_model_card", args=[job.pk])
    page = client.get(card_url)
    card = client.get(card_url, {"format": "json"}).json()
    job_page = client.get(reverse("federation:job_detail", args=[job.pk]))
    skops = client.get(reverse("federation:job_model_skops", args=[job.pk]))
    weights = client.get(reverse("federation:job_model_download", args=[job.pk]))

    assert card["file"]["exportable"] is False
    assert "not exportable yet" in card["file"]["why_not"]
    assert page.status_code == 200 and "not exportable yet" in page.content.decode()
    assert job_page.status_code == 200
    text = job_page.content.decode()
    assert 'id="trees-not-exportable"' in text and "Download model (.skops)" not in text
    assert "FedXgbBagging" in text and "data volume" in text
    assert skops.status_code == 404 and weights.status_code == 404


def test_model_card_of_a_dp_job_states_its_epsilon_and_delta(client, world):
    """The card read ε from ``final_metrics["privacy"]``, which nothing writes: a DP job's card
    said "no differential privacy". The job's ε (charged at submission and on resume) is it."""
    dp = {"dp": "client", "noise_multiplier": 2.0, "clipping_norm": 1.0, "delta": 1e-6}
    FederatedJob.objects.filter(pk=world["job"].pk).update(privacy=dp, epsilon=3.25)
    world["job"].refresh_from_db()
    fitted = _fitted()
    _finish(world["job"], fitted, _weights(fitted))
    client.force_login(world["researcher"])
    url = reverse("federation:job_model_card", args=[world["job"].pk])

    card = client.get(url, {"format": "json"}).json()
    text = client.get(url).content.decode()

    assert (card["epsilon"], card["delta"]) == (3.25, 1e-6)
    assert card["privacy"] == {"dp": "client", "noise_multiplier": 2.0, "clipping_norm": 1.0}
    assert "ε = 3.25 at δ = 1e-6" in text and "no differential privacy" not in text


def _dd(page: str, dd_id: str) -> str:
    """The text of the ``<dd id="dd_id">`` element of ``page``."""
    start = page.index(f'id="{dd_id}"')
    return html.unescape(page[page.index(">", start) + 1 : page.index("</dd>", start)]).strip()


def test_model_card_and_job_page_state_a_dp_jobs_epsilon_in_the_same_words(client, world):
    """One wording (``federation.method.epsilon_text``) on the card page, in the card file and on
    the job page: ε 2.9137 to 3 significant digits is 2.91; δ 1e-5 in its shortest form."""
    dp = {"dp": "server", "noise_multiplier": 1.1, "clipping_norm": 1.0, "delta": 1e-5}
    FederatedJob.objects.filter(pk=world["job"].pk).update(privacy=dp, epsilon=2.9137)
    world["job"].refresh_from_db()
    fitted = _fitted()
    _finish(world["job"], fitted, _weights(fitted))
    client.force_login(world["researcher"])
    card_url = reverse("federation:job_model_card", args=[world["job"].pk])

    card_page = client.get(card_url).content.decode()
    card = client.get(card_url, {"format": "json"}).json()
    job_page = client.get(reverse("federation:job_detail", args=[world["job"].pk])).content.decode()

    assert _dd(card_page, "card-epsilon") == "ε = 2.91 at δ = 1e-5"
    assert _dd(job_page, "job-epsilon") == "ε = 2.91 at δ = 1e-5"
    assert card["epsilon_text"] == "ε = 2.91 at δ = 1e-5"
    assert card["epsilon"] == 2.9137  # the figure itself stays exact in the file


# --- resuming a failed job ---------------------------------------------------------------------


def _failed_with_checkpoint(world, model_store, rnd=2):
    job = world["job"]
    for r in (1, 2, 3):
        RoundMetric.objects.update_or_create(job=job, round=r, defaults={"eval_accuracy": 0.5})
        for js in job.sites.all():
            SiteRoundMetric.objects.update_or_create(job_site=js, round=r, defaults={"ok": True})
    sites = sorted(js.site.slug for js in job.sites.select_related("site"))
    if rnd:
        checkpoints.save(
            model_store,
            checkpoints.Checkpoint(
                job_id=job.pk,
                round=rnd,
                weights=[np.zeros((2, 2)), np.zeros(2)],
                initial=[np.zeros((2, 2)), np.zeros(2)],
                history=[],
                players=sites,
                active=sites,
                fitted="{}",
                preparation={},
            ),
        )
    job.sites.update(status=JobSiteStatus.FAILED, last_error="the job failed: killed")
    FederatedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.FAILED,
        callback_seq=9,
        failure_reason="",
        status_detail="Flower run 41 failed.",
    )
    return FederatedJob.objects.get(pk=job.pk)


def test_resume_requeues_the_job_from_its_checkpoint_and_keeps_its_history(
    world, model_store, django_capture_on_commit_callbacks
):
    job = _failed_with_checkpoint(world, model_store)

    with django_capture_on_commit_callbacks() as queued:
        services.job_resume(by=world["researcher"], job_id=job.pk)

    job.refresh_from_db()
    assert (job.status, job.resume_round, job.earlier_runs) == (JobStatus.QUEUED, 2, ["41"])
    assert (job.flower_run_id, job.callback_seq, job.launch_nonce) == ("", 0, "")
    assert list(job.round_metrics.values_list("round", flat=True).order_by("round")) == [1, 2]
    assert not SiteRoundMetric.objects.filter(job_site__job=job, round=3).exists()
    assert set(job.sites.values_list("status", flat=True)) == {JobSiteStatus.PENDING}
    assert set(job.sites.values_list("rounds_completed", flat=True)) == {2}
    assert services.job_run_config(job).to_flower()["resume-round"] == 2
    event = AuditEvent.objects.get(action="job.resume")
    assert event.actor_id == world["researcher"].pk
    assert len(queued) == 1  # the launch task


DP = {"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1e-5}


def _dp_job(world, model_store):
    from federation import privacy_budget

    job = _failed_with_checkpoint(world, model_store)  # rounds 1–3 posted, checkpoint after 2
    eps = privacy_budget.job_epsilon(DP, num_rounds=job.num_rounds, sites=2)
    FederatedJob.objects.filter(pk=job.pk).update(privacy=DP, epsilon=eps)
    job.refresh_from_db()
    return job, eps


def test_resume_of_a_dp_job_charges_the_rounds_it_trains_again(world, model_store):
    """Round 3 of the failed run was noised, sent to every site and reported; the resumed run
    trains round 3 again: a second release, charged to the job's ε and its ledger leaf."""
    from federation import privacy

    job, before = _dp_job(world, model_store)

    services.job_resume(by=world["researcher"], job_id=job.pk)

    job.refresh_from_db()
    again = privacy.epsilon(noise_multiplier=1.0, rounds=1, delta=1e-5)
    assert job.epsilon == pytest.approx(before + again)
    leaf = json.loads(LedgerEntry.objects.filter(kind="privacy").latest("index").data)
    assert leaf["job"] == job.pk and leaf["rounds"] == 1 and float(leaf["epsilon"]) == again
    assert leaf["resumed_from_round"] == 2


def test_resume_of_a_dp_job_over_the_budget_is_refused_with_the_figures(world, model_store):
    from sandbox.models import PrivacyBudget

    job, before = _dp_job(world, model_store)
    dataset = world["versions"][0].dataset
    PrivacyBudget.objects.create(project=world["project"], dataset=dataset, epsilon=before * 1.01)

    with pytest.raises(services.JobError, match="would exceed the project's budget") as err:
        services.job_resume(by=world["researcher"], job_id=job.pk)

    assert f"spent {before:.3g}" in str(err.value)
    job.refresh_from_db()
    assert (job.status, job.epsilon) == (JobStatus.FAILED, before)
    assert job.round_metrics.count() == 3


def test_resume_is_refused_without_a_checkpoint_for_others_and_for_a_live_job(world, model_store):
    job = _failed_with_checkpoint(world, model_store, rnd=0)
    with pytest.raises(services.JobError, match="no round checkpoint"):
        services.job_resume(by=world["researcher"], job_id=job.pk)
    job = _failed_with_checkpoint(world, model_store, rnd=2)
    with pytest.raises(services.JobError, match="only the job's submitter"):
        services.job_resume(by=world["stewards"][0], job_id=job.pk)
    FederatedJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    with pytest.raises(services.JobError, match="only a failed job can be resumed"):
        services.job_resume(by=world["researcher"], job_id=job.pk)
    assert not AuditEvent.objects.filter(action="job.resume").exists()


def test_the_job_page_of_a_failed_job_without_a_checkpoint_offers_no_resume(
    client, world, model_store
):
    """The button used to show on every failed job; without a checkpoint the resume is refused."""
    job = _failed_with_checkpoint(world, model_store, rnd=0)
    client.force_login(world["researcher"])

    page = client.get(reverse("federation:job_detail", args=[job.pk])).content.decode()

    assert 'id="resume"' not in page and "Resume from" not in page
    assert "cannot be resumed: submit the job again" in page


def test_the_job_page_offers_resume_to_its_submitter_and_the_button_works(
    client, world, model_store
):
    job = _failed_with_checkpoint(world, model_store)
    detail = reverse("federation:job_detail", args=[job.pk])
    client.force_login(world["researcher"])
    assert "Resume from round 2" in client.get(detail).content.decode()

    response = client.post(reverse("federation:job_resume", args=[job.pk]))

    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    client.force_login(world["stewards"][0])
    assert "Resume from round" not in client.get(detail).content.decode()


def test_model_card_shows_each_sites_row_counts_under_the_disclosure_rule(client, world):
    """Issue 9, finding 5 (hostile re-test): the card (page and JSON, every project member)
    carried ``job.preparation`` raw — a site's exact rows, train and test rows, dropped and
    imputed cells — while the job page shows them as "≤7" / "≈…" to all but the site's
    stewards. The card is a document for sharing: its counts follow the rule for everyone."""
    fitted = _fitted()
    _finish(world["job"], fitted, _weights(fitted))
    slugs = [v.dataset.site.slug for v in world["versions"]]
    counts = {"rows": 3, "dropped_target": 1, "dropped_rows": 0, "train_rows": 1, "test_rows": 1}
    big = {
        "rows": 1234,
        "dropped_target": 12,
        "dropped_rows": 0,
        "train_rows": 977,
        "test_rows": 245,
    }
    world["job"].preparation = {
        "task": "classification",
        "columns": ["age"],
        "fills": {"age": "median 41"},
        "notes": [],
        "sites": {
            slugs[0]: {**counts, "imputed": {"age": 2}},
            slugs[1]: {**big, "imputed": {"age": 13}},
        },
    }
    world["job"].final_metrics["eval_examples"] = 246
    world["job"].save(update_fields=["preparation", "final_metrics"])
    url = reverse("federation:job_model_card", args=[world["job"].pk])
    steward = world["stewards"][0]  # of the small site, and a member of the project
    ProjectMemberFactory(project=world["project"], user=steward, role=ProjectRole.MEMBER)

    for user in (world["researcher"], steward):
        client.force_login(user)
        card = client.get(url, {"format": "json"}).json()
        small, large = (card["preparation"]["sites"][s] for s in slugs)
        assert small == {
            "rows": "≤7",
            "dropped_target": "≤7",
            "dropped_rows": 0,
            "train_rows": "≤7",
            "test_rows": "≤7",
            "imputed": {"age": "≤7"},
        }
        # safe_count: nearest multiple of 5, halves up (1234 → 1235, 977 → 975, 13 → 15)
        assert large == {
            "rows": 1235,
            "dropped_target": 10,
            "dropped_rows": 0,
            "train_rows": 975,
            "test_rows": 245,
            "imputed": {"age": 15},
        }
        assert card["preparation"]["fills"] == {"age": "median 41"}
        assert card["metrics"]["eval_examples"] == 245  # safe_count(246): nearest multiple of 5
        assert client.get(url).status_code == 200
