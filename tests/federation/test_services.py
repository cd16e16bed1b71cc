"""Unit tests of federation services: submission checks, launch, callbacks, reconcile, stop.

The SuperLink boundary is faked here (``FakeSuperLink``); the real SuperLink is exercised through the
same functions in tests/federation/test_integration.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from federation import services, superlink
from federation.models import FederatedJob, JobSiteStatus, JobStatus, RoundMetric, SiteRoundMetric
from federation.signals import job_finished
from frp_flwr import contract
from portal.models import AuditEvent, Membership, ProjectRole, Role
from sandbox.models import AccessStatus
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
    UserFactory,
)
from tests.federation.callback_support import record

pytestmark = pytest.mark.django_db


class FakeSuperLink:
    """Stands in for ``federation.superlink`` (same function names and errors)."""

    def __init__(self):
        self.submitted: list[dict] = []
        self.status = superlink.RunStatus("7", "running", "", "", {})
        self.fail_submit: str | None = None
        self.stopped: list[str] = []
        self.runs: list[superlink.RunStatus] = []  # what runs_list answers
        self.error: Exception | None = None  # raised by runs_list and run_status when set

    def runs_list(self, conn, *, limit=100):
        if self.error:
            raise self.error
        return list(self.runs)

    def runs_status(self, conn, run_ids, *, newest=None):
        return {r: self.run_status(conn, r) for r in run_ids}

    def run_submit(self, conn, run_config):
        if self.fail_submit:
            raise superlink.SuperLinkError(self.fail_submit)
        self.submitted.append(run_config)
        return "18446744073709551615"  # the largest uint64: must survive as text

    def run_status(self, conn, run_id):
        if self.error:
            raise self.error
        return self.status

    def run_stop(self, conn, run_id):
        self.stopped.append(run_id)


@pytest.fixture
def fake_superlink(monkeypatch):
    fake = FakeSuperLink()
    for name in ("run_submit", "run_status", "run_stop", "runs_list", "runs_status"):
        monkeypatch.setattr(services.superlink, name, getattr(fake, name))
    return fake


@pytest.fixture
def launch(eager_celery, django_capture_on_commit_callbacks):
    """Submit and run the on-commit launch (eager Celery), as after a real commit."""

    def _launch(world, **overrides):
        with django_capture_on_commit_callbacks(execute=True):
            job = submit(world, **overrides)
        job.refresh_from_db()
        return job

    return _launch


@pytest.fixture
def world():
    """A project with a PI and two granted dataset versions at two sites."""
    project = ProjectFactory()
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    versions = [DatasetVersionFactory(), DatasetVersionFactory()]
    grants = [GrantFactory(project=project, dataset=v.dataset) for v in versions]
    return {"project": project, "pi": pi, "versions": versions, "grants": grants}


def submit(world, **overrides):
    kwargs = dict(
        by=world["pi"],
        project=world["project"],
        dataset_versions=world["versions"],
        title="t",
        target_column="label",
        num_rounds=2,
    )
    kwargs.update(overrides)
    return services.job_submit(**kwargs)


def test_job_submit_valid_creates_queued_job_with_sites_and_audit(world, fake_superlink, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    job = submit(world)
    assert job.status == JobStatus.QUEUED
    assert job.sites.count() == 2
    assert job.feature_columns == ["x1", "x2"]  # numeric columns shared by both, target excluded
    assert AuditEvent.objects.filter(action="job.submit", target_id=str(job.pk)).exists()


def test_job_submit_non_member_refused(world):
    with pytest.raises(services.JobError) as err:
        submit(world, by=UserFactory())
    assert "project" in err.value.field_errors


def test_job_submit_single_site_refused(world):
    with pytest.raises(services.JobError) as err:
        submit(world, dataset_versions=world["versions"][:1])
    assert "at least 2" in err.value.field_errors["datasets"][0]


def test_job_submit_two_datasets_of_one_site_refused(world):
    other = DatasetVersionFactory(dataset__site=world["versions"][0].dataset.site)
    GrantFactory(project=world["project"], dataset=other.dataset)
    with pytest.raises(services.JobError) as err:
        submit(world, dataset_versions=[world["versions"][0], other])
    assert err.value.field_errors["datasets"] == ["Choose one dataset per site."]


@pytest.mark.parametrize(
    "change",
    [
        {"status": AccessStatus.PENDING},
        {"status": AccessStatus.REVOKED},
        {"expires_at": timezone.now() - timedelta(minutes=1)},
    ],
)
def test_job_submit_without_valid_grant_refused(world, change):
    grant = world["grants"][1]
    for k, v in change.items():
        setattr(grant, k, v)
    grant.save()
    with pytest.raises(services.JobError) as err:
        submit(world)
    assert "No valid access grant" in err.value.field_errors["datasets"][0]


def test_job_submit_missing_target_names_dataset_and_columns(world):
    with pytest.raises(services.JobError) as err:
        submit(world, target_column="nope")
    (msg,) = err.value.field_errors["target_column"]
    for version in world["versions"]:
        assert str(version.dataset) in msg  # both datasets named once, in one message
    assert "No column 'nope'" in msg and "x1, x2, label" in msg


def test_job_submit_target_as_feature_refused(world):
    with pytest.raises(services.JobError) as err:
        submit(world, feature_columns=["x1", "label"])
    assert err.value.field_errors["feature_columns"] == [
        "The target column cannot also be a feature."
    ]


def test_job_submit_text_feature_is_categorical_and_cannot_be_numeric(world, fake_superlink):
    for v in world["versions"]:
        v.schema = [*v.schema, {"name": "ward", "type": "str"}]
        v.profile = {"columns": [{"name": "x1", "missing": "≤7"}]}
        v.save()
    job = submit(world, feature_columns=["x1", "ward"])
    assert job.task == "classification"  # label is text
    assert job.preprocessing == [
        {"name": "x1", "kind": "numeric", "missing": "median", "indicator": True},  # has missing
        {"name": "ward", "kind": "categorical", "missing": "most_frequent", "indicator": False},
    ]
    with pytest.raises(services.JobError) as err:
        submit(world, feature_columns=["ward"], preprocessing=[contract.FeaturePlan("ward")])
    assert "'ward' (str) cannot be used as numeric" in err.value.field_errors["feature_columns"][0]


def test_job_submit_float_target_is_regression_and_identifiers_are_left_out(world, fake_superlink):
    for v in world["versions"]:
        v.schema = [{"name": "id", "type": "int"}, *v.schema, {"name": "y", "type": "float"}]
        v.save()
    job = submit(world, target_column="y")
    assert job.task == "regression"
    assert job.feature_columns == ["x1", "x2"]  # not the identifier, not the target


def test_job_launch_submits_run_with_spec_and_marks_running(world, fake_superlink, launch):
    job = launch(world)  # on commit → eager task → launch
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert job.flower_run_id == "18446744073709551615"
    cfg = fake_superlink.submitted[0]
    assert cfg["job-id"] == job.pk and cfg["num-rounds"] == 2
    assert set(cfg) == set(contract.RunConfig.keys())  # every key of the contract, no other
    assert contract.RunConfig.from_flower(cfg).job_id == job.pk
    assert cfg["callback-url"].endswith(f"/jobs/callback/{job.pk}/")
    import json

    spec = json.loads(cfg["job-spec"])
    assert set(spec["sites"]) == {v.dataset.site.slug for v in world["versions"]}
    assert spec["target"] == "label" and spec["min_sites"] == 2


def test_job_launch_twice_submits_once(world, fake_superlink, launch):
    job = launch(world)
    services.job_launch(job_id=job.pk)
    assert len(fake_superlink.submitted) == 1


def test_job_launch_refused_by_superlink_fails_with_reason(world, fake_superlink, launch):
    fake_superlink.fail_submit = "connection refused"
    job = launch(world)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "connection refused" in job.status_detail


def test_job_launch_with_grant_revoked_after_submit_fails(world, fake_superlink, settings):
    job = submit(world)  # not eager: stays queued
    g = world["grants"][0]
    g.status = AccessStatus.REVOKED
    g.save()
    job = services.job_launch(job_id=job.pk)
    assert job.status == JobStatus.FAILED
    assert world["versions"][0].dataset.site.slug in job.status_detail
    assert fake_superlink.submitted == []


def test_job_launch_waits_when_pool_is_full(world, fake_superlink, launch):
    first = launch(world)
    second = launch(world)  # both pools have 1 slot, taken by the first job
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == JobStatus.RUNNING
    assert second.status == JobStatus.QUEUED
    assert second.sched_reason == "Resources"
    assert "waiting for resources on its pools" in second.status_detail
    assert second.est_start is not None
    first.status = JobStatus.COMPLETED
    first.save()
    assert services.job_reconcile(job_id=second.pk).status == JobStatus.RUNNING


def _round_payload(world, rnd, ok=True):
    a, b = (v.dataset.site.slug for v in world["versions"])
    return {
        "event": "round",
        "round": rnd,
        "train_loss": 0.5,
        "eval_loss": 0.4,
        "eval_accuracy": 0.9,
        "train_examples": 80,
        "sites": {
            a: {
                "ok": True,
                "train_examples": 40,
                "eval_examples": 10,
                "eval_accuracy": 0.9,
                "cpu_seconds": 0.1,
                "wall_seconds": 0.2,
            },
            b: {"ok": ok, "train_examples": 40 if ok else 0, "error": "" if ok else "boom"},
        },
    }


def test_callback_round_is_idempotent(world, fake_superlink, launch):
    job = launch(world)
    for _ in range(2):
        record(job, _round_payload(world, 1))
    assert RoundMetric.objects.filter(job=job).count() == 1
    assert SiteRoundMetric.objects.filter(job_site__job=job).count() == 2
    assert all(js.rounds_completed == 1 for js in job.sites.all())


def test_callback_failed_site_is_dropped_with_its_error(world, fake_superlink, launch):
    job = launch(world)
    record(job, _round_payload(world, 1, ok=False))
    dropped = job.sites.get(site=world["versions"][1].dataset.site)
    assert dropped.status == JobSiteStatus.DROPPED and dropped.last_error == "boom"


def test_callback_answers_sites_whose_grant_was_revoked(world, fake_superlink, launch):
    job = launch(world)
    g = world["grants"][1]
    g.status = AccessStatus.REVOKED
    g.save()
    answer = record(job, _round_payload(world, 1))
    assert answer["drop_sites"] == [world["versions"][1].dataset.site.slug]
    dropped = job.sites.get(site=world["versions"][1].dataset.site)
    assert dropped.status == JobSiteStatus.DROPPED and "round 1" in dropped.last_error


def test_callback_started_refuses_a_node_that_is_not_the_sites_registered_supernode(
    world, fake_superlink, launch
):
    """Issue 9 (node-id ↔ site binding): with node authentication each site's SuperNode is
    registered under one node id; another node answering discovery in that site's name (an
    institution's own SuperNode claiming a second site) fails the site and the answer drops it.
    A site found at its registered node, or with no registration (the embedded default), trains."""
    from federation.models import SiteNode

    job = launch(world)
    a, b = (v.dataset.site for v in world["versions"])
    SiteNode.objects.create(site=a, public_key="ecdsa-sha2-nistp384 AAAA a", node_id="111")
    SiteNode.objects.create(site=b, public_key="ecdsa-sha2-nistp384 AAAA b", node_id="222")

    answer = record(job, {"event": "started", "nodes": {a.slug: "111", b.slug: "111"}})

    assert answer["drop_sites"] == [b.slug]
    impostor = job.sites.get(site=b)
    assert impostor.status == JobSiteStatus.FAILED
    assert "node 111 answered as" in impostor.last_error and "node 222" in impostor.last_error
    assert job.sites.get(site=a).status == JobSiteStatus.TRAINING

    SiteNode.objects.filter(site=b).delete()  # no registration: nothing to hold it against
    answer = record(job, {"event": "started", "nodes": {a.slug: "111", b.slug: "333"}})
    assert answer["drop_sites"] == []
    assert job.sites.get(site=b).status == JobSiteStatus.TRAINING


def test_callback_for_finished_job_refused(world, fake_superlink, launch):
    job = launch(world)
    FederatedJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    with pytest.raises(services.JobError):
        record(job, _round_payload(world, 1))


@pytest.mark.parametrize(
    ("sub_status", "final", "expected"),
    [
        ("completed", {"eval_accuracy": 0.9}, JobStatus.COMPLETED),
        ("completed", {}, JobStatus.FAILED),  # finished without results: not a success
        ("failed", {}, JobStatus.FAILED),
        ("stopped", {}, JobStatus.STOPPED),
    ],
)
def test_reconcile_follows_superlink(world, fake_superlink, launch, sub_status, final, expected):
    job = launch(world)
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics=final)
    fake_superlink.status = superlink.RunStatus("7", "finished", sub_status, "details here", {})
    job = services.job_reconcile(job_id=job.pk)
    assert job.status == expected
    assert job.finished_at is not None
    if expected == JobStatus.FAILED:
        assert job.status_detail  # a readable reason


def test_finished_job_is_handed_on_once_through_job_finished(world, fake_superlink, launch):
    job = launch(world)
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics={"eval_accuracy": 0.9})
    heard = []

    def receiver(sender, *, job, **kwargs):
        heard.append((sender, job.pk, job.status))

    job_finished.connect(receiver)
    try:
        fake_superlink.status = superlink.RunStatus("7", "finished", "completed", "", {})
        services.job_reconcile(job_id=job.pk)
        services.job_reconcile(job_id=job.pk)  # already terminal: not handed on again
    finally:
        job_finished.disconnect(receiver)

    assert heard == [(FederatedJob, job.pk, JobStatus.COMPLETED)]


def test_reconcile_keeps_serverapp_failure_reason(world, fake_superlink, launch):
    job = launch(world)
    record(job, {"event": "failed", "reason": "only 1 of 2 sites"})
    fake_superlink.status = superlink.RunStatus("7", "finished", "failed", "ServerApp exited", {})
    job = services.job_reconcile(job_id=job.pk)
    assert job.status == JobStatus.FAILED and job.status_detail == "Only 1 of 2 sites."


def test_reconcile_requeues_stale_launch(world, fake_superlink):
    job = submit(world)
    FederatedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.LAUNCHING, started_at=timezone.now() - timedelta(minutes=10)
    )
    assert services.job_reconcile(job_id=job.pk).status == JobStatus.QUEUED


def test_stop_queued_job_stops_at_once(world):
    job = submit(world)
    job = services.job_stop(by=world["pi"], job_id=job.pk)
    assert job.status == JobStatus.STOPPED


def test_stop_running_job_asks_superlink(world, fake_superlink, launch):
    job = launch(world)
    services.job_stop(by=world["pi"], job_id=job.pk)
    assert fake_superlink.stopped == ["18446744073709551615"]


def test_stop_by_other_member_refused(world, fake_superlink, launch):
    job = launch(world)
    other = ProjectMemberFactory(project=world["project"]).user
    with pytest.raises(services.JobError):
        services.job_stop(by=other, job_id=job.pk)


def test_reconcile_all_reads_all_runs_with_one_call(world, fake_superlink, launch, monkeypatch):
    from federation import tasks

    first, second = launch(world), launch(world)
    FederatedJob.objects.filter(pk=second.pk).update(
        status=JobStatus.RUNNING, flower_run_id="42"
    )  # both running (pools would otherwise hold the second)
    calls = []

    def runs_status(conn, run_ids, *, newest=None):
        calls.append(sorted(run_ids))
        done = superlink.RunStatus("x", "finished", "stopped", "", {})
        return {rid: done for rid in run_ids}

    monkeypatch.setattr(services.superlink, "runs_status", runs_status)
    tasks.job_reconcile_all_task()
    assert calls == [sorted([first.flower_run_id, "42"])]
    assert set(FederatedJob.objects.values_list("status", flat=True)) == {JobStatus.STOPPED}


# ---------------------------------------------------------------------------------------------
# Metering and contribution events
# ---------------------------------------------------------------------------------------------


def test_callback_round_stores_bytes_received_and_sent(world, fake_superlink, launch):
    job = launch(world)
    payload = _round_payload(world, 1)
    a = world["versions"][0].dataset.site.slug
    payload["sites"][a].update(bytes_received=3422, bytes_sent=1711)

    record(job, payload)

    metric = SiteRoundMetric.objects.get(job_site__site__slug=a, round=1)
    assert (metric.bytes_received, metric.bytes_sent) == (3422, 1711)
    other = SiteRoundMetric.objects.exclude(pk=metric.pk).get()
    assert (other.bytes_received, other.bytes_sent) == (0, 0)  # not reported: 0


def _contribution_payload(world):
    a, b = (v.dataset.site.slug for v in world["versions"])
    return {
        "event": "contribution",
        "players": [a, b],
        "method": "exact",
        "utilities": {"0": {"": 0.5, "0": 0.7, "1": 0.6, "0,1": 0.9}, "1": {"": 0.5}},
        "examples": {a: 10, b: 12},
        "models": 5,
        "sites": {
            a: {
                "examples": 50,
                "cpu_seconds": 0.2,
                "wall_seconds": 0.3,
                "bytes_received": 900,
                "bytes_sent": 0,
            }
        },
        "wall_seconds": 2.5,
    }


def test_callback_contribution_stored_and_final_results_not_replaced(world, fake_superlink, launch):
    job = launch(world)
    finished = {"event": "finished", "rounds": 2, "eval_accuracy": 0.9, "model": [[1.0]]}
    record(job, finished)
    record(job, _contribution_payload(world))
    with pytest.raises(services.JobError, match="final results are recorded"):
        record(job, {**finished, "eval_accuracy": 0.1})  # a second finished event
    with pytest.raises(services.JobError, match="final results are recorded"):
        record(job, _round_payload(world, 1))  # a round after the end
    with pytest.raises(services.JobError, match="cannot be replaced"):
        record(job, _contribution_payload(world))

    job.refresh_from_db()
    stored = job.final_metrics["contribution"]
    assert stored["utilities"]["0"] == {"": 0.5, "0": 0.7, "1": 0.6, "0,1": 0.9}
    assert stored["utilities"]["1"] == {"": 0.5}
    assert stored["wall_seconds"] == 2.5 and stored["models"] == 5
    a = world["versions"][0].dataset.site.slug
    assert stored["sites"][a]["bytes_received"] == 900
    assert job.final_metrics["eval_accuracy"] == 0.9


def test_callback_contribution_naming_a_foreign_site_refused(world, fake_superlink, launch):
    job = launch(world)
    payload = _contribution_payload(world)
    payload["players"] = [payload["players"][0], "elsewhere"]

    with pytest.raises(services.JobError, match="elsewhere"):
        record(job, payload)

    job.refresh_from_db()
    assert "contribution" not in job.final_metrics


def test_callback_contribution_with_non_number_utility_refused(world, fake_superlink, launch):
    job = launch(world)
    payload = _contribution_payload(world)
    payload["utilities"]["0"]["0"] = "NaN"

    with pytest.raises(contract.ContractError, match="expected a number"):
        record(job, payload)


def test_callback_event_number_accepted_once(world, fake_superlink, launch):
    job = launch(world)
    record(job, _round_payload(world, 1), seq=5)

    for replayed in (5, 4, 1):  # the same number again, or any lower one
        with pytest.raises(services.JobError, match="already accepted"):
            record(job, {"event": "failed", "reason": "forged"}, seq=replayed)

    job.refresh_from_db()
    assert job.callback_seq == 5 and job.failure_reason == ""
    record(job, _round_payload(world, 2), seq=6)
    assert RoundMetric.objects.filter(job=job).count() == 2


def test_callback_round_beyond_the_jobs_rounds_refused(world, fake_superlink, launch):
    job = launch(world)
    with pytest.raises(services.JobError, match="beyond the job's 2 rounds"):
        record(job, _round_payload(world, 3))
    assert not RoundMetric.objects.filter(job=job).exists()


def test_reconcile_keeps_flowers_run_figures(world, fake_superlink, launch):
    job = launch(world)
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics={"eval_accuracy": 0.9})
    raw = {
        "elapsed": 12.0,
        "network-traffic": {"inbound-bytes": 100, "outbound-bytes": 200, "total-bytes": 300},
        "compute-time": {
            "serverapp-seconds": 11.0,
            "clientapp-seconds": 2.5,
            "total-seconds": 13.5,
        },
    }
    fake_superlink.status = superlink.RunStatus("7", "finished", "completed", "", raw)

    job = services.job_reconcile(job_id=job.pk)

    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert job.final_metrics["flower"] == {
        "elapsed_seconds": 12.0,
        "bytes_inbound": 100,
        "bytes_outbound": 200,
        "serverapp_seconds": 11.0,
        "clientapp_seconds": 2.5,
    }
    assert job.final_metrics["eval_accuracy"] == 0.9


@pytest.mark.parametrize(
    ("sub_status", "baseline", "subject", "line"),
    [
        (
            "completed",
            {"name": "majority class (benign)", "metric": "accuracy", "value": 0.63, "model": 0.61,
             "better": False},
            "no better than the baseline",
            "Flagged: the final model's accuracy (0.6100) is no better than the majority class "
            "(benign) (0.6300)",
        ),
        (
            "completed",
            {"name": "training mean", "metric": "rmse", "value": 80.0, "model": 54.5,
             "better": True},
            "completed",
            "Final rmse: 54.5000 (baseline training mean: 80.0000).",
        ),
        ("failed", None, "failed", "Reason: Round 2: site hospital-b returned a train loss"),
    ],
)  # fmt: skip
def test_ended_job_notifies_its_submitter_with_the_baseline_flag(
    world, fake_superlink, launch, mailoutbox, django_capture_on_commit_callbacks,
    sub_status, baseline, subject, line,
):  # fmt: skip
    world["pi"].email = "pi@example.org"
    world["pi"].save()
    job = launch(world)
    # The PI stewards every site here, so the mail gives exact scores (a researcher's mail gives
    # them as released: test_metric_disclosure).
    for js in job.sites.select_related("site"):
        Membership.objects.get_or_create(
            user=world["pi"], institution_id=js.site.institution_id, role=Role.DATA_STEWARD
        )
    final = {"eval_accuracy": 0.6, "baseline": baseline} if baseline else {}
    FederatedJob.objects.filter(pk=job.pk).update(
        final_metrics=final,
        failure_reason="round 2: site hospital-b returned a train loss that is not a finite number",
    )
    fake_superlink.status = superlink.RunStatus("7", "finished", sub_status, "", {})
    with django_capture_on_commit_callbacks(execute=True):
        services.job_reconcile(job_id=job.pk)
    (mail,) = mailoutbox
    assert mail.to == ["pi@example.org"]
    assert subject in mail.subject
    assert line in mail.body
    assert f"/jobs/{job.pk}/" in mail.body


# ---------------------------------------------------------------------------------------------
# Faults: a launch that lost its worker, runs no job holds, a SuperLink that stops answering
# ---------------------------------------------------------------------------------------------


def _launching(world, **fields):
    """A job as a worker leaves it when it dies right after starting the run."""
    job = submit(world)
    FederatedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.LAUNCHING, started_at=timezone.now(), launch_nonce="n" * 32, **fields
    )
    return FederatedJob.objects.get(pk=job.pk)


def _run(run_id, job, nonce, status="running"):
    return superlink.RunStatus(
        run_id, status, "", "", {}, {"job-id": job.pk, "launch-nonce": nonce}
    )


def test_launch_commits_a_nonce_and_sends_it_in_the_run_config(world, fake_superlink, launch):
    job = launch(world)
    assert len(job.launch_nonce) == 32
    assert fake_superlink.submitted[0]["launch-nonce"] == job.launch_nonce


def test_reconcile_records_the_run_a_dead_worker_started_instead_of_starting_another(
    world, fake_superlink
):
    job = _launching(world)
    fake_superlink.runs = [_run("99", job, "other"), _run("7", job, job.launch_nonce)]

    job = services.job_reconcile(job_id=job.pk)

    assert (job.status, job.flower_run_id) == (JobStatus.RUNNING, "7")
    assert fake_superlink.submitted == [] and fake_superlink.stopped == []
    event = AuditEvent.objects.get(action="job.launch", target_id=str(job.pk))
    assert event.data == {"run_id": "7", "found_by_nonce": True, "shapley_consent": None}


def test_stale_launch_without_its_run_is_queued_again_with_the_nonce_cleared(
    world, fake_superlink, settings
):
    settings.FRP_STALE_LAUNCH_SECONDS = 60
    job = _launching(world)
    FederatedJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=2))

    job = services.job_reconcile(job_id=job.pk)

    assert (job.status, job.launch_nonce) == (JobStatus.QUEUED, "")


def test_a_run_whose_nonce_no_job_holds_is_stopped_and_audited(world, fake_superlink, launch):
    job = launch(world)
    stale = _run("55", job, "old-nonce")
    fake_superlink.runs = [stale, _run(job.flower_run_id, job, job.launch_nonce)]

    services.jobs_reconcile()

    assert fake_superlink.stopped == ["55"]
    event = AuditEvent.objects.get(action="job.orphan_run_stop")
    assert event.data["run_id"] == "55" and event.target_id == str(job.pk)


def test_a_late_run_of_a_launch_the_job_no_longer_holds_is_stopped(world, fake_superlink):
    job = _launching(world)
    services.job_run_record(job_id=job.pk, run_id="8", nonce="not-the-jobs")
    job.refresh_from_db()
    assert job.flower_run_id == "" and fake_superlink.stopped == ["8"]


def test_unreachable_superlink_is_shown_then_fails_the_job_after_the_bound(
    world, fake_superlink, launch, settings
):
    settings.FRP_SUPERLINK_LOST_SECONDS = 60
    job = launch(world)
    fake_superlink.error = superlink.SuperLinkUnreachable("the SuperLink at x did not answer")

    services.jobs_reconcile()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.superlink_lost_at is not None
    assert job.status_detail.startswith("The SuperLink is unreachable")

    FederatedJob.objects.filter(pk=job.pk).update(
        superlink_lost_at=timezone.now() - timedelta(seconds=61)
    )
    services.jobs_reconcile()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.status_detail.startswith("The SuperLink stopped answering")
    assert set(job.sites.values_list("status", flat=True)) == {JobSiteStatus.FAILED}


def test_superlink_answering_again_clears_the_mark(world, fake_superlink, launch):
    job = launch(world)
    fake_superlink.error = superlink.SuperLinkUnreachable("down")
    services.jobs_reconcile()
    fake_superlink.error = None

    services.jobs_reconcile()

    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.superlink_lost_at is None


def test_a_run_the_superlink_no_longer_knows_fails_the_job(world, fake_superlink, launch):
    job = launch(world)
    fake_superlink.error = superlink.RunUnknown("Run ID not found")

    job = services.job_reconcile(job_id=job.pk)

    assert job.status == JobStatus.FAILED
    assert "no longer knows Flower run" in job.status_detail


def test_submit_to_an_unreachable_superlink_leaves_the_job_launching(
    world, fake_superlink, launch, monkeypatch
):
    def unreachable(conn, run_config):
        raise superlink.SuperLinkUnreachable("the SuperLink at x did not answer")

    monkeypatch.setattr(services.superlink, "run_submit", unreachable)
    job = launch(world)
    assert job.status == JobStatus.LAUNCHING and job.superlink_lost_at is not None


def test_job_submit_xgboost_stores_the_model_and_the_run_config_carries_it(world):
    job = submit(world, model={"kind": "xgboost", "max_depth": 4, "local_rounds": 3})

    assert job.model == "xgboost" and job.model_spec["kind"] == "xgboost"
    assert job.model_spec["max_depth"] == 4 and job.model_spec["eta"] == 0.3  # default
    spec = contract.JobSpec.from_json(services.job_run_config(job).job_spec)
    assert spec.model_kind == "xgboost" and spec.model["local_rounds"] == 3


def test_run_config_carries_the_serverapps_poll_interval_setting(world, settings):
    job = submit(world)
    settings.FRP_SERVERAPP_POLL_SECONDS = 0.75

    config = services.job_run_config(job)

    assert config.poll_interval == 0.75
    assert config.to_flower()["poll-interval"] == 0.75  # what the SuperLink stores and sends


def test_job_submit_without_a_model_is_linear(world):
    job = submit(world)

    assert job.model == "linear" and job.model_spec == {"kind": "linear"}
    assert contract.JobSpec.from_json(services.job_run_config(job).job_spec).model == {
        "kind": "linear"
    }


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"kind": "xgboost", "max_depth": 40}, "model.max_depth: 40 is outside 1..12"),
        ({"kind": "xgboost", "eta": -1.0}, "model.eta: -1.0 is outside"),
        ({"kind": "forest"}, "'forest' is not one of"),
    ],
)
def test_job_submit_refuses_a_bad_model_on_its_field(world, model, message):
    with pytest.raises(services.JobError) as err:
        submit(world, model=model)

    assert message in err.value.field_errors["model_kind"][0]
    assert not FederatedJob.objects.exists()


def test_job_submit_refuses_another_strategy_for_trees_on_the_strategy_field(world):
    with pytest.raises(services.JobError) as err:
        submit(world, model={"kind": "xgboost"}, strategy={"name": "fedprox"})

    assert "FedXgbBagging" in err.value.field_errors["strategy_name"][0]
    assert not FederatedJob.objects.exists()
