"""Accounting of a job resumed from its round checkpoint (issue 14 "round checkpoints", ADR 0028).

The job of ``steps_world`` (two sites of two institutions, 1 SU per core-hour at 0.10 EUR, data
credit rate 0.5, no start time so a run's wall seconds are the hours it held) runs 4 rounds:

* run 1 (Flower run 7) trains rounds 1–3 and crashes before round 3's checkpoint is written, so
  it FAILS with its checkpoint after round 2; its accounting runs (the real hand-off);
* the submitter resumes it: the portal deletes round 3 (the new run trains it again);
* run 2 (Flower run 8) trains rounds 3–4 and COMPLETES; its accounting runs.

Every round takes s0 3600 s and s1 7200 s. Round 3 was really run twice (the failed run's slot
was held for it, then the new run's), so both are metered and billed; nothing else twice.
By hand:

* usage: run 1 s0 3 × 3600 = 10800 s (3 SU, 0.30), s1 3 × 7200 = 21600 s (6 SU, 0.60); run 2 s0
  7200 s (2 SU, 0.20), s1 14400 s (4 SU, 0.40); the job: s0 18000 s, s1 36000 s = 5 rounds each;
* compute charges = credits: s0 0.30 + 0.20 = 0.50, s1 0.60 + 0.40 = 1.00;
* data charges (completed end only, on all the job's compute): s0 0.5 × 0.50 = 0.25,
  s1 0.5 × 1.00 = 0.50; total 0.75 split by the exact Shapley shares 1/3, 2/3: s0 0.25, s1 0.50.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.db.models import Sum

from accounting.models import (
    BillingEntry,
    ContributionScore,
    CreditStatement,
    JobAccountingStep,
    StepStatus,
    UsageRecord,
)
from accounting.services import steps
from federation import services, superlink
from federation.models import FederatedJob, JobSite, JobStatus, SiteRoundMetric
from frp_flwr import checkpoints
from portal.ledger.leaves import commitment_matches
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent
from sandbox.storage import store_from_url
from tests.accounting.job_world import utilities_event
from tests.accounting.steps_world import FULL, _metering, build_steps_world, hand_off_lost
from tests.federation.callback_support import record

pytestmark = pytest.mark.django_db

D = Decimal
ROUND_WALL = {"s0": 3600.0, "s1": 7200.0}
STEP_NAMES = ("usage", "contribution", "billing", "credit")


@pytest.fixture
def world(db, settings, tmp_path, eager_celery):
    settings.FRP_MODEL_STORE_URL = (tmp_path / "model-store").as_uri()
    return build_steps_world()


def _post(job, event: str, **payload) -> None:
    record(job, {"event": event, **payload})


def _rounds(job, rounds) -> None:
    for rnd in rounds:
        _post(job, "round", round=rnd, sites={s: _metering(w) for s, w in ROUND_WALL.items()})


def _end(job, run_id: str, status: str, *, capture) -> FederatedJob:
    """End the job's run as the SuperLink reports it; the hand-off to accounting runs (eager)."""
    with capture(execute=True):
        return services.job_reconcile(
            job_id=job.pk, run=superlink.RunStatus(run_id, "finished", status, "", {})
        )


def _failed_run(world, capture, *, hand_off=True, model="logreg") -> FederatedJob:
    """Run 1: rounds 1–3 metered, checkpoint after round 2, FAILED (accounted unless
    ``hand_off`` is false: then the failed end's chain is lost)."""
    job = FederatedJob.objects.create(
        model=model,
        project=world.project,
        submitted_by=world.pi,
        title="resumed job",
        target_column="label",
        num_rounds=4,
        status=JobStatus.RUNNING,
        flower_run_id="7",
    )
    for dv in world.versions:
        JobSite.objects.create(job=job, site=dv.dataset.site, dataset_version=dv)
    _rounds(job, (1, 2, 3))
    zeros = [np.zeros((2, 2)), np.zeros(2)]
    checkpoints.save(
        store_from_url(django_settings.FRP_MODEL_STORE_URL),
        checkpoints.Checkpoint(
            job_id=job.pk,
            round=2,
            weights=zeros,
            initial=zeros,
            history=[],
            players=["s0", "s1"],
            active=["s0", "s1"],
            fitted="{}",
            preparation={},
        ),
    )
    if hand_off:
        return _end(job, "7", "failed", capture=capture)
    with hand_off_lost():
        return _end(job, "7", "failed", capture=capture)


def _resume(world, job, capture) -> FederatedJob:
    """The submitter resumes the job; the launch is not run (its callbacks are dropped)."""
    with capture(execute=False) as queued:
        services.job_resume(by=world.pi, job_id=job.pk)
    assert len(queued) == 1  # the launch task only: accounting queues nothing at a resume
    FederatedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.LAUNCHING, launch_nonce="resumed"
    )
    return services.job_run_record(job_id=job.pk, run_id="8", nonce="resumed")


def _completed_run(world, job, capture) -> FederatedJob:
    """Run 2: rounds 3–4 metered, contribution posted, COMPLETED and accounted."""
    _rounds(job, (3, 4))
    _post(job, "contribution", **utilities_event(["s0", "s1"], {"0": dict(FULL)}))
    _post(job, "finished", rounds=4, eval_accuracy=0.9, eval_loss=0.3, sites={})
    return _end(job, "8", "completed", capture=capture)


def _wall_by_site(job) -> dict[str, float]:
    rows = UsageRecord.objects.filter(job=job).values("site__slug").annotate(w=Sum("wall_seconds"))
    return {r["site__slug"]: r["w"] for r in rows}


def _billed(job, kind: str) -> dict[str, Decimal]:
    rows = (
        BillingEntry.objects.filter(job=job, kind=kind)
        .values("site__slug")
        .annotate(a=Sum("amount"))
    )
    return {r["site__slug"]: r["a"] for r in rows}


def _states(job) -> dict[str, str]:
    return dict(JobAccountingStep.objects.filter(job=job).values_list("step", "status"))


def _leaves() -> list[tuple]:
    return list(
        LedgerEntry.objects.order_by("index").values_list("index", "kind", "data", "leaf_hash")
    )


def _job_leaves(job, leaves) -> Counter:
    kinds = Counter()
    for _, kind, data, _ in leaves:
        leaf = json.loads(data)
        if leaf.get("job") == job.pk:
            kinds[(kind, leaf.get("run"))] += 1
    return kinds


@pytest.fixture
def resumed(world, django_capture_on_commit_callbacks):
    """The job after both accountings, with the state right after the first one."""
    capture = django_capture_on_commit_callbacks
    job = _failed_run(world, capture)
    first = {
        "entries": list(
            BillingEntry.objects.filter(job=job)
            .order_by("pk")
            .values_list("pk", "site__slug", "kind", "amount", "invoice_id")
        ),
        "usage": list(
            UsageRecord.objects.filter(job=job)
            .order_by("pk")
            .values_list("pk", "site__slug", "rounds", "wall_seconds")
        ),
        "leaves": _leaves(),
        "states": _states(job),
    }
    job = _resume(world, job, capture)
    job = _completed_run(world, job, capture)
    return job, first


def test_usage_after_the_resumed_end_sums_every_round_actually_run(resumed):
    job, first = resumed

    assert job.status == JobStatus.COMPLETED
    assert _wall_by_site(job) == {"s0": 18000.0, "s1": 36000.0}  # rounds 1–3 and 3–4
    records = {
        (u.site.slug, u.run): (u.rounds, u.wall_seconds, u.flower_run_id)
        for u in UsageRecord.objects.filter(job=job)
    }
    assert records == {
        ("s0", 1): (3, 10800.0, "7"),
        ("s1", 1): (3, 21600.0, "7"),
        ("s0", 2): (2, 7200.0, "8"),
        ("s1", 2): (2, 14400.0, "8"),
    }
    # the failed run's records are the ones written at its end, unchanged
    assert [
        (pk, slug, rounds, wall)
        for pk, slug, rounds, wall in UsageRecord.objects.filter(job=job, run=1)
        .order_by("pk")
        .values_list("pk", "site__slug", "rounds", "wall_seconds")
    ] == first["usage"]


def test_compute_is_billed_once_per_run_and_data_lines_once_for_the_completed_end(resumed):
    job, first = resumed
    # the failed end, as its accounting left it: compute only (no data lines), rounds 1–3
    assert first["states"] == dict.fromkeys(STEP_NAMES, StepStatus.DONE)
    assert {(slug, kind): amount for _, slug, kind, amount, _ in first["entries"]} == {
        ("s0", "compute_charge"): D("0.30"),
        ("s0", "compute_credit"): D("0.30"),
        ("s1", "compute_charge"): D("0.60"),
        ("s1", "compute_credit"): D("0.60"),
    }

    assert _billed(job, "compute_charge") == {"s0": D("0.50"), "s1": D("1.00")}
    assert _billed(job, "compute_credit") == {"s0": D("0.50"), "s1": D("1.00")}
    assert _billed(job, "data_charge") == {"s0": D("0.25"), "s1": D("0.50")}
    assert _billed(job, "data_credit") == {"s0": D("0.25"), "s1": D("0.50")}
    lines = Counter(BillingEntry.objects.filter(job=job).values_list("kind", "run"))
    assert lines == {
        ("compute_charge", 1): 2,
        ("compute_credit", 1): 2,
        ("compute_charge", 2): 2,
        ("compute_credit", 2): 2,
        ("data_charge", 2): 2,
        ("data_credit", 2): 2,
    }
    # the failed run's lines stay as issued: same rows, amounts and invoices
    kept = list(
        BillingEntry.objects.filter(pk__in=[e[0] for e in first["entries"]])
        .order_by("pk")
        .values_list("pk", "site__slug", "kind", "amount", "invoice_id")
    )
    assert kept == first["entries"]


def test_contribution_and_credit_exist_for_the_completed_end(resumed):
    job, _ = resumed

    assert _states(job) == dict.fromkeys(STEP_NAMES, StepStatus.DONE)
    shares = {
        s.site.slug: s.share
        for s in ContributionScore.objects.filter(job=job, method="exact", round=0)
    }
    assert shares == pytest.approx({"s0": 1 / 3, "s1": 2 / 3})
    statement = CreditStatement.objects.get(job=job)
    institution_shares = sorted(
        c.share for c in statement.contributors.filter(kind="institution") if c.share is not None
    )
    assert institution_shares == pytest.approx([1 / 3, 2 / 3])


def test_second_delivery_of_every_step_after_the_resumed_end_writes_nothing(resumed):
    job, _ = resumed
    assert UsageRecord.objects.filter(job=job).count() == 4  # both runs are accounted
    before = (
        _leaves(),
        AuditEvent.objects.count(),
        sorted(JobAccountingStep.objects.filter(job=job).values_list("step", "status", "attempts")),
        BillingEntry.objects.count(),
        UsageRecord.objects.count(),
    )

    steps.job_accounting_chain(job.pk).apply()
    for step in STEP_NAMES:
        steps.job_step_run(job_id=job.pk, step=step)

    after = (
        _leaves(),
        AuditEvent.objects.count(),
        sorted(JobAccountingStep.objects.filter(job=job).values_list("step", "status", "attempts")),
        BillingEntry.objects.count(),
        UsageRecord.objects.count(),
    )
    assert after == before


def test_ledger_gets_leaves_for_the_new_run_and_none_rewritten(resumed):
    job, first = resumed
    leaves = _leaves()

    assert leaves[: len(first["leaves"])] == first["leaves"]  # the old leaves, byte for byte
    new = _job_leaves(job, leaves[len(first["leaves"]) :])
    assert new[("usage", 2)] == 2
    assert new[("charge", 2)] == 2 + 2  # compute charges, data charges
    assert new[("credit", 2)] == 2 + 2  # compute credits, data credits
    assert not any(run == 1 for _, run in new)  # nothing of the failed run appended again
    assert new[("contribution", None)] > 0


def test_score_measured_again_at_the_completed_end_gets_a_new_leaf_and_the_old_one_stays(
    world, django_capture_on_commit_callbacks
):
    """Bagged trees are credited by data volume (ADR 0023), which the failed end already scored
    from rounds 1–3 (120 training examples a site); the completed end's rounds 1–4 give 160."""
    capture = django_capture_on_commit_callbacks
    job = _failed_run(world, capture, model="xgboost")
    first = {
        s.site.slug: s.raw_value
        for s in ContributionScore.objects.filter(job=job, method="data_volume")
    }
    leaves = _leaves()

    job = _completed_run(world, _resume(world, job, capture), capture)

    assert first == {"s0": 120.0, "s1": 120.0}
    scores = ContributionScore.objects.filter(job=job, method="data_volume")
    assert {s.site.slug: (s.raw_value, s.share) for s in scores} == {
        "s0": (160.0, 0.5),
        "s1": (160.0, 0.5),
    }
    after = _leaves()
    assert after[: len(leaves)] == leaves
    measured = [
        json.loads(data)["raw_value_commitment"]
        for _, kind, data, _ in after
        if kind == "contribution" and json.loads(data)["job"] == job.pk
    ]
    salts = [  # one event per site and measurement, in the order of the leaves
        e.data for e in AuditEvent.objects.filter(action="contribution.data_volume").order_by("pk")
    ]
    assert [e["raw_value"] for e in salts] == ["120.0", "120.0", "160.0", "160.0"]
    assert all(
        commitment_matches(e["raw_value"], commitment_hex=c, salt_hex=e["raw_value_salt"])
        for c, e in zip(measured, salts, strict=True)
    )


def test_chain_of_the_failed_end_delivered_while_the_job_runs_again_writes_nothing(
    world, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    job = _failed_run(world, capture, hand_off=False)  # the failed end's chain is still queued
    job = _resume(world, job, capture)
    usage = list(UsageRecord.objects.filter(job=job).values_list("site__slug", "rounds"))

    steps.job_accounting_chain(job.pk).apply()  # the late delivery, the job RUNNING again

    assert _states(job) == dict.fromkeys(STEP_NAMES, StepStatus.PENDING)
    assert not BillingEntry.objects.filter(job=job).exists()
    assert sorted(usage) == [("s0", 3), ("s1", 3)]  # run 1's, recorded at the resume
    assert UsageRecord.objects.filter(job=job, run=1).count() == 2  # and nothing since


def test_resume_before_the_failed_end_was_accounted_keeps_the_deleted_rounds_metered(
    world, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    job = _failed_run(world, capture, hand_off=False)  # broker lost the failed end's chain
    assert not UsageRecord.objects.filter(job=job).exists()

    job = _resume(world, job, capture)
    assert not SiteRoundMetric.objects.filter(job_site__job=job, round=3).exists()
    job = _completed_run(world, job, capture)

    assert _wall_by_site(job) == {"s0": 18000.0, "s1": 36000.0}
    assert _billed(job, "compute_charge") == {"s0": D("0.50"), "s1": D("1.00")}
    assert _billed(job, "data_charge") == {"s0": D("0.25"), "s1": D("0.50")}
    assert _states(job) == dict.fromkeys(STEP_NAMES, StepStatus.DONE)


def test_resume_reopens_the_steps_and_says_so(world, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = _failed_run(world, capture)

    _resume(world, job, capture)

    assert _states(job) == dict.fromkeys(STEP_NAMES, StepStatus.PENDING)
    detail = JobAccountingStep.objects.get(job=job, step="billing").detail
    assert detail == "reopened: the job resumed (run 1 ended failed after round 2)"
    event = AuditEvent.objects.get(action="accounting.reopen")
    assert event.data["run"] == 1 and event.data["from_round"] == 2
    assert event.data["steps"] == dict.fromkeys(STEP_NAMES, "done")


def test_resume_refused_when_the_failed_runs_usage_cannot_be_recorded(
    world, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    job = _failed_run(world, capture, hand_off=False)
    metrics = {**job.final_metrics, "contribution": {"sites": {"s0": {"bytes_received": -(10**6)}}}}
    FederatedJob.objects.filter(pk=job.pk).update(final_metrics=metrics)  # a corrupt figure

    with pytest.raises(services.JobError, match="usage of the failed run cannot be recorded"):
        services.job_resume(by=world.pi, job_id=job.pk)

    job.refresh_from_db()
    assert (job.status, job.flower_run_id, job.earlier_runs) == (JobStatus.FAILED, "7", [])
    assert SiteRoundMetric.objects.filter(job_site__job=job, round=3).count() == 2  # kept
    assert not AuditEvent.objects.filter(action__in=["job.resume", "accounting.reopen"]).exists()
