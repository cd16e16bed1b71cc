"""Writes of federated jobs: submit, launch, record callbacks, reconcile with the SuperLink, stop,
and the airlock (a finished job's model release).

State machine (``JobStatus``), all transitions here::

    QUEUED ──launch──▶ LAUNCHING ──run submitted──▶ RUNNING ──SuperLink finished──▶ COMPLETED
       ▲                   │                           │                          ├▶ FAILED
       └─ stale, no run ◀──┘── submit refused ──▶ FAILED └── stop ──▶ STOPPED      └▶ STOPPED

The SuperLink is authoritative for a run's end (``job_reconcile``); callbacks from the ServerApp only
add metrics. Every service re-reads state under a row lock first, so a second delivery of a task or
callback changes nothing.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

from celery import signature
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from federation import scheduler, superlink
from federation.models import (
    FederatedJob,
    JobSite,
    JobSiteStatus,
    JobStatus,
    ModelRelease,
    ReleaseDecision,
    ReleaseStatus,
    RoundMetric,
    SiteRoundMetric,
)
from federation.signals import job_finished
from portal.ledger.services import ledger_append
from portal.models import Role
from portal.permissions import can
from portal.services import audit_record
from sandbox import selectors as sandbox_selectors

log = logging.getLogger(__name__)

MIN_SITES = 2
STALE_LAUNCH = timedelta(minutes=3)
#: The Celery task that launches a queued job (``federation.tasks.job_launch_task``), sent by name
#: so that this module does not import the tasks that import it.
JOB_LAUNCH_TASK = "federation.job_launch"


class JobError(Exception):
    """A job request is invalid; ``field_errors`` maps form fields to messages."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.field_errors = field_errors or {}


def superlink_connection() -> superlink.Connection:
    """The SuperLink connection from settings."""
    return superlink.Connection(
        flwr_home=settings.FRP_FLWR_HOME,
        federation=settings.FRP_FEDERATION_NAME,
        app_dir=settings.FRP_FLWR_APP_DIR,
    )


# ---------------------------------------------------------------------------------------------
# Submit
# ---------------------------------------------------------------------------------------------


def _validate_columns(versions, target: str, features: list[str]) -> list[str]:
    """Check target/feature columns against every schema; return the feature list to use."""
    errors: dict[str, list[str]] = {}
    types = [{c["name"]: c["type"] for c in v.schema} for v in versions]
    lacking = [
        str(v.dataset) for v, schema in zip(versions, types, strict=True) if target not in schema
    ]
    if lacking:
        shared = [c for c in types[0] if all(c in t for t in types)]
        common = (
            "The chosen datasets share no column: pick datasets with the same schema."
            if not shared
            else "Columns every chosen dataset has: "
            + ", ".join(shared[:12])
            + (f" and {len(shared) - 12} more." if len(shared) > 12 else ".")
        )
        errors["target_column"] = [f"No column {target!r} in {', '.join(lacking)}. {common}"]
    if not features:
        numeric = [
            {n for n, t in s.items() if t in ("int", "float") and n != target} for s in types
        ]
        common = set.intersection(*numeric) if numeric else set()
        features = [c["name"] for c in versions[0].schema if c["name"] in common]
        if not features:
            errors["feature_columns"] = [
                "The chosen datasets share no numeric column besides the target."
            ]
    else:
        for v, schema in zip(versions, types, strict=True):
            bad = [f for f in features if schema.get(f) not in ("int", "float")]
            if bad:
                errors.setdefault("feature_columns", []).append(
                    f"{v.dataset}: missing or not numeric: {', '.join(map(repr, bad))}."
                )
    if errors:
        raise JobError("the datasets do not fit the job", errors)
    return features


@transaction.atomic
def job_submit(
    *,
    by,
    project,
    dataset_versions: list,
    title: str,
    target_column: str,
    feature_columns: list[str] | None = None,
    num_rounds: int = 5,
    local_epochs: int = 5,
    learning_rate: float = 0.1,
) -> FederatedJob:
    """Validate and queue a job; its launch is queued after the transaction commits.

    Checks: ``by`` may submit in ``project``; at least ``MIN_SITES`` datasets, one per site; every
    dataset under a valid grant for the project; target and feature columns present (features numeric)
    in every schema. Raises ``JobError`` (with per-field messages) otherwise.
    """
    if not can(by, "job.submit", project):
        raise JobError(
            "you are not a member of this project",
            {"project": ["You are not a member of this project."]},
        )
    versions = list(dataset_versions)
    sites = [v.dataset.site for v in versions]
    if len(versions) < MIN_SITES:
        raise JobError(
            "too few sites", {"datasets": [f"Choose datasets from at least {MIN_SITES} sites."]}
        )
    if len({s.pk for s in sites}) != len(sites):
        raise JobError("one dataset per site", {"datasets": ["Choose one dataset per site."]})
    ungranted = [
        str(v.dataset)
        for v in versions
        if not sandbox_selectors.has_valid_grant(project=project, dataset=v.dataset)
    ]
    if ungranted:
        raise JobError(
            "no valid grant",
            {"datasets": [f"No valid access grant for this project: {', '.join(ungranted)}."]},
        )
    features = _validate_columns(versions, target_column, list(feature_columns or []))
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=by,
        title=title,
        target_column=target_column,
        feature_columns=features,
        num_rounds=num_rounds,
        local_epochs=local_epochs,
        learning_rate=learning_rate,
    )
    JobSite.objects.bulk_create(
        [JobSite(job=job, site=v.dataset.site, dataset_version=v) for v in versions]
    )
    audit_record(
        by=by,
        action="job.submit",
        target=job,
        institution=project.institution,
        sites=[s.slug for s in sites],
    )
    # robust: a broker hiccup is logged, not raised; the periodic reconcile launches queued jobs too.
    transaction.on_commit(signature(JOB_LAUNCH_TASK, args=(job.pk,)).delay, robust=True)
    return job


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------


def job_run_config(job: FederatedJob) -> dict:
    """The Flower run config of ``job``: job spec (sites → store keys), callback, hyper-parameters."""
    spec = {
        "sites": {
            js.site.slug: {
                "store_key": js.dataset_version.store_key,
                "dataset": js.dataset_version.dataset.slug,
                "version": js.dataset_version.version,
            }
            for js in job.sites.select_related("site", "dataset_version__dataset")
        },
        "target": job.target_column,
        "features": job.feature_columns,
        "min_sites": MIN_SITES,
    }
    callback = settings.FRP_CALLBACK_BASE_URL.rstrip("/") + reverse(
        "federation:job_callback", args=[job.pk]
    )
    return {
        "job-id": job.pk,
        "job-spec": json.dumps(spec, separators=(",", ":")),
        "callback-url": callback,
        "callback-token": job.callback_token,
        "num-rounds": job.num_rounds,
        "local-epochs": job.local_epochs,
        "learning-rate": float(job.learning_rate),
        "round-timeout": float(settings.FRP_ROUND_TIMEOUT),
        "reply-log": (
            str(Path(settings.FRP_REPLY_LOG_DIR) / f"job-{job.pk}-replies.jsonl")
            if settings.FRP_REPLY_LOG_DIR
            else ""
        ),
    }


def _fail(job: FederatedJob, reason: str) -> None:
    job.status = JobStatus.FAILED
    job.status_detail = reason
    job.finished_at = timezone.now()
    job.save(update_fields=["status", "status_detail", "finished_at"])
    audit_record(
        by=None, action="job.fail", target=job, institution=job.project.institution, reason=reason
    )


def job_launch(*, job_id: int) -> FederatedJob:
    """Admit a QUEUED job and submit its Flower run. Does nothing for a job in any other state.

    Grants are checked again (one may have expired or been revoked since submission). When the
    pools are busy the job stays QUEUED with the reason; the periodic reconcile tries again.
    """
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        if job.status != JobStatus.QUEUED:
            return job
        lost = [
            js.site.slug
            for js in job.sites.select_related("site", "dataset_version__dataset")
            if not sandbox_selectors.has_valid_grant(
                project=job.project, dataset=js.dataset_version.dataset
            )
        ]
        if lost:
            _fail(job, f"access grant no longer valid for site(s): {', '.join(lost)}")
            return job
        admitted, reason = scheduler.admit(job)
        if not admitted:
            if job.status_detail != reason:
                job.status_detail = reason
                job.save(update_fields=["status_detail"])
            return job
        job.status = JobStatus.LAUNCHING
        job.status_detail = "submitting the run to the SuperLink"
        job.started_at = timezone.now()
        job.save(update_fields=["status", "status_detail", "started_at"])
        run_config = job_run_config(job)

    try:
        run_id = superlink.run_submit(superlink_connection(), run_config)
    except superlink.SuperLinkError as exc:
        with transaction.atomic():
            job = FederatedJob.objects.select_for_update().get(pk=job_id)
            if job.status == JobStatus.LAUNCHING:
                _fail(job, f"the SuperLink refused the run: {exc}")
        return job

    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        job.flower_run_id = run_id
        if job.status == JobStatus.LAUNCHING:
            job.status = JobStatus.RUNNING
            job.status_detail = f"Flower run {run_id} started"
        job.save(update_fields=["flower_run_id", "status", "status_detail"])
        audit_record(
            by=None,
            action="job.launch",
            target=job,
            institution=job.project.institution,
            run_id=run_id,
        )
    return job


# ---------------------------------------------------------------------------------------------
# Callbacks from the ServerApp
# ---------------------------------------------------------------------------------------------


def _opt_float(value) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if f != f else f  # NaN → None


def _count(value) -> int:
    """A non-negative integer count (bytes, examples) from a callback value; junk → 0."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


#: ``final_metrics`` keys written by other events, kept when ``finished`` is delivered again.
_KEPT_ON_FINISH = ("contribution", "flower")


def _contribution(payload: dict, sites: dict[str, JobSite]) -> dict:
    """The ``contribution`` event as stored in ``job.final_metrics["contribution"]``.

    Shape: ``{"players": [site ids], "method": "exact"|"gtg", "permutations": int, "seed": int,
    "utilities": {round key: {coalition key: float}}, "examples": {site: int}, "models": int,
    "sites": {site: metering}, "errors": {site: str}, "wall_seconds": float}`` — round key ``"0"``
    is the whole run, coalition keys are ascending player indexes joined by commas. An event
    carrying ``error`` is stored as ``{"players": [...], "error": text}``. Raises ``JobError`` when
    a player is not a site of the job or a utility is not a finite number.
    """
    players = [str(p) for p in payload.get("players") or []]
    unknown = [p for p in players if p not in sites]
    if unknown:
        raise JobError(f"contribution names sites outside the job: {unknown}")
    if payload.get("error"):
        return {"players": players, "error": str(payload["error"])[:2000]}
    utilities: dict[str, dict[str, float]] = {}
    for rnd, table in (payload.get("utilities") or {}).items():
        clean = {}
        for key, value in table.items():
            number = _opt_float(value)
            if number is None or number in (float("inf"), float("-inf")):
                raise JobError(f"utility of coalition {key!r} in round {rnd} is not a number")
            clean[str(key)] = number
        utilities[str(int(rnd))] = clean
    metering_keys = ("examples", "cpu_seconds", "wall_seconds", "bytes_received", "bytes_sent")
    return {
        "players": players,
        "method": str(payload.get("method", "")),
        "permutations": _count(payload.get("permutations")),
        "seed": _count(payload.get("seed")),
        "utility": str(payload.get("utility", ""))[:200],
        "utilities": utilities,
        "examples": {str(k): _count(v) for k, v in (payload.get("examples") or {}).items()},
        "models": _count(payload.get("models")),
        "sites": {
            str(site): {
                k: (_opt_float(info.get(k)) or 0.0) if "seconds" in k else _count(info.get(k))
                for k in metering_keys
            }
            for site, info in (payload.get("sites") or {}).items()
            if site in sites
        },
        "errors": {str(k): str(v)[:500] for k, v in (payload.get("errors") or {}).items()},
        "wall_seconds": _opt_float(payload.get("wall_seconds")),
    }


@transaction.atomic
def job_callback_record(*, job_id: int, payload: dict) -> dict:
    """Record one ServerApp event (``started``, ``round``, ``finished``, ``contribution``,
    ``failed``); idempotent (a second delivery overwrites with the same values).

    ``round`` stores each site's ``SiteRoundMetric`` including its metering (CPU/wall seconds,
    ``bytes_received``/``bytes_sent``: protobuf size of the model ArrayRecords, bytes);
    ``contribution`` stores the coalition utilities in ``job.final_metrics["contribution"]``
    (see ``_contribution``).

    Returns the answer for the ServerApp: ``{"ok": true, "drop_sites": [site ids]}`` — sites whose
    grant is no longer valid, to be dropped from the next round. Raises ``JobError`` for an event on a
    job that is not running.
    """
    job = FederatedJob.objects.select_for_update().get(pk=job_id)
    if job.status not in (JobStatus.LAUNCHING, JobStatus.RUNNING):
        raise JobError(f"job is {job.status}; callbacks are accepted only while it runs")
    sites = {
        js.site.slug: js for js in job.sites.select_related("site", "dataset_version__dataset")
    }
    event = payload.get("event")

    if event == "started":
        for slug, node_id in (payload.get("nodes") or {}).items():
            if slug in sites:
                js = sites[slug]
                js.node_id = str(node_id)
                js.status = JobSiteStatus.TRAINING
                js.save(update_fields=["node_id", "status"])
        for slug, error in (payload.get("errors") or {}).items():
            if slug in sites:
                sites[slug].status = JobSiteStatus.FAILED
                sites[slug].last_error = str(error)[:2000]
                sites[slug].save(update_fields=["status", "last_error"])
    elif event == "round":
        rnd = int(payload["round"])
        for slug, info in (payload.get("sites") or {}).items():
            js = sites.get(slug)
            if js is None:
                continue
            ok = bool(info.get("ok", False))
            SiteRoundMetric.objects.update_or_create(
                job_site=js,
                round=rnd,
                defaults={
                    "ok": ok,
                    "error": str(info.get("error", ""))[:2000],
                    "train_examples": int(info.get("train_examples", 0)),
                    "eval_examples": int(info.get("eval_examples", 0)),
                    "train_loss": _opt_float(info.get("train_loss")),
                    "eval_loss": _opt_float(info.get("eval_loss")),
                    "eval_accuracy": _opt_float(info.get("eval_accuracy")),
                    "cpu_seconds": float(info.get("cpu_seconds", 0.0)),
                    "wall_seconds": float(info.get("wall_seconds", 0.0)),
                    "bytes_received": _count(info.get("bytes_received")),
                    "bytes_sent": _count(info.get("bytes_sent")),
                },
            )
            js.rounds_completed = js.round_metrics.filter(ok=True).count()
            if not ok:
                js.status = JobSiteStatus.DROPPED
                js.last_error = str(info.get("error", ""))[:2000]
            js.save(update_fields=["rounds_completed", "status", "last_error"])
        if not payload.get("partial"):
            RoundMetric.objects.update_or_create(
                job=job,
                round=rnd,
                defaults={
                    "train_loss": _opt_float(payload.get("train_loss")),
                    "eval_loss": _opt_float(payload.get("eval_loss")),
                    "eval_accuracy": _opt_float(payload.get("eval_accuracy")),
                    "num_examples": int(payload.get("train_examples", 0)),
                    "sites_replied": sum(
                        1 for i in payload.get("sites", {}).values() if i.get("ok")
                    ),
                    "wall_seconds": _opt_float(payload.get("wall_seconds")),
                },
            )
    elif event == "finished":
        kept = {k: v for k, v in job.final_metrics.items() if k in _KEPT_ON_FINISH}
        job.final_metrics = {
            **kept,
            "eval_accuracy": _opt_float(payload.get("eval_accuracy")),
            "eval_loss": _opt_float(payload.get("eval_loss")),
            "eval_examples": int(payload.get("eval_examples", 0)),
            "rounds": int(payload.get("rounds", 0)),
            "classes": payload.get("classes", []),
            "model": payload.get("model", []),
        }
        job.save(update_fields=["final_metrics"])
        for slug, info in (payload.get("sites") or {}).items():
            if slug in sites:
                sites[slug].final_metrics = {
                    k: info.get(k) for k in ("eval_accuracy", "eval_loss", "eval_examples")
                }
                sites[slug].save(update_fields=["final_metrics"])
    elif event == "contribution":
        job.final_metrics = {**job.final_metrics, "contribution": _contribution(payload, sites)}
        job.save(update_fields=["final_metrics"])
    elif event == "failed":
        job.failure_reason = str(payload.get("reason", "the ServerApp failed"))[:4000]
        job.status_detail = job.failure_reason
        job.save(update_fields=["failure_reason", "status_detail"])
    else:
        raise JobError(f"unknown event {event!r}")

    drop = [
        slug
        for slug, js in sites.items()
        if not sandbox_selectors.has_valid_grant(
            project=job.project, dataset=js.dataset_version.dataset
        )
    ]
    if event == "round":  # the ServerApp drops these before its next round
        for slug in drop:
            js = sites[slug]
            if js.status not in (JobSiteStatus.DROPPED, JobSiteStatus.FAILED):
                js.status = JobSiteStatus.DROPPED
                js.last_error = f"access grant no longer valid: dropped after round {rnd}"
                js.save(update_fields=["status", "last_error"])
    return {"ok": True, "drop_sites": drop}


# ---------------------------------------------------------------------------------------------
# Reconcile and stop
# ---------------------------------------------------------------------------------------------

_FINAL = {
    "completed": JobStatus.COMPLETED,
    "failed": JobStatus.FAILED,
    "stopped": JobStatus.STOPPED,
}


def job_reconcile(*, job_id: int, run: superlink.RunStatus | None = None) -> FederatedJob:
    """Bring one job in line with the SuperLink (authoritative for a run's end).

    QUEUED → try to launch; LAUNCHING with no run id for longer than ``STALE_LAUNCH`` → back to QUEUED
    (a crash between admission and submission); RUNNING → read ``flwr ls`` and finish the job when the
    run has finished. A SuperLink that cannot be reached leaves the job as it is. ``run`` is the
    run's status when the caller already read it (one ``flwr ls`` for many jobs).
    """
    job = FederatedJob.objects.get(pk=job_id)
    if job.status == JobStatus.QUEUED:
        return job_launch(job_id=job_id)
    if job.status == JobStatus.LAUNCHING and not job.flower_run_id:
        if job.started_at and timezone.now() - job.started_at > STALE_LAUNCH:
            with transaction.atomic():
                job = FederatedJob.objects.select_for_update().get(pk=job_id)
                if job.status == JobStatus.LAUNCHING and not job.flower_run_id:
                    job.status = JobStatus.QUEUED
                    job.status_detail = "launch did not finish; queued again"
                    job.save(update_fields=["status", "status_detail"])
        return job
    if job.status not in (JobStatus.RUNNING, JobStatus.LAUNCHING) or not job.flower_run_id:
        return job
    if run is None:
        try:
            run = superlink.run_status(superlink_connection(), job.flower_run_id)
        except superlink.SuperLinkError as exc:
            log.warning("reconcile job %s: %s", job_id, exc)
            return job
    if not run.is_finished:
        return job
    return _job_finish(job_id=job_id, run=run)


@transaction.atomic
def _job_finish(*, job_id: int, run: superlink.RunStatus) -> FederatedJob:
    job = FederatedJob.objects.select_for_update().get(pk=job_id)
    if job.is_terminal:
        return job
    status = _FINAL.get(run.sub_status, JobStatus.FAILED)
    if status == JobStatus.COMPLETED and not job.final_metrics:
        status = JobStatus.FAILED
        job.status_detail = "the run finished without reporting final results to the portal"
    job.status = status
    job.finished_at = timezone.now()
    if run.usage:  # Flower's own per-run figures, for the usage cross-check
        job.final_metrics = {**job.final_metrics, "flower": run.usage}
    if status == JobStatus.COMPLETED:
        job.status_detail = f"Flower run {run.run_id} completed"
    elif status == JobStatus.FAILED and not job.status_detail.startswith("the run finished"):
        job.status_detail = job.failure_reason or run.details or f"Flower run {run.run_id} failed"
    else:
        job.status_detail = f"Flower run {run.run_id} {run.sub_status}"
    job.save(update_fields=["status", "status_detail", "finished_at", "final_metrics"])
    still_in = job.sites.exclude(status__in=[JobSiteStatus.DROPPED, JobSiteStatus.FAILED])
    if status == JobStatus.COMPLETED:
        still_in.update(status=JobSiteStatus.COMPLETED)
    else:  # the site did nothing wrong: say why it stopped
        still_in.update(
            status=JobSiteStatus.FAILED,
            last_error=f"the job {status}: {job.status_detail}"[:2000],
        )
    audit_record(by=None, action=f"job.{status}", target=job, institution=job.project.institution)
    # The floors above (accounting) take the finished job from here, on commit.
    job_finished.send(sender=FederatedJob, job=job)
    return job


def job_stop(*, by, job_id: int) -> FederatedJob:
    """Stop a job: a queued one at once, a running one through the SuperLink."""
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        if not can(by, "job.stop", job):
            raise JobError("you may not stop this job")
        if job.is_terminal:
            return job
        audit_record(by=by, action="job.stop", target=job, institution=job.project.institution)
        if job.status == JobStatus.QUEUED or not job.flower_run_id:
            job.status = JobStatus.STOPPED
            job.status_detail = f"stopped by {by} before it ran"
            job.finished_at = timezone.now()
            job.save(update_fields=["status", "status_detail", "finished_at"])
            return job
        run_id = job.flower_run_id
    try:
        superlink.run_stop(superlink_connection(), run_id)
    except superlink.SuperLinkError as exc:
        raise JobError(f"the SuperLink could not stop run {run_id}: {exc}") from exc
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        if not job.is_terminal:
            job.status_detail = f"stop requested by {by}"
            job.save(update_fields=["status_detail"])
    return job


# ---------------------------------------------------------------------------------------------
# Airlock: model release
# ---------------------------------------------------------------------------------------------


class ReleaseError(Exception):
    """A model release cannot be requested or decided; the message says why."""


def _ledger(kind: str, **record) -> None:
    """Append a ledger leaf (inside the caller's transaction)."""
    ledger_append(kind=kind, record=record)


def _release_settle(release) -> None:
    """Approve when every participating site approved; refuse on the first refusal."""
    sites = {js.site_id for js in release.job.sites.all()}
    decisions = {d.site_id: d.approve for d in release.decisions.all()}
    if any(approve is False for approve in decisions.values()):
        release.status = ReleaseStatus.REFUSED
    elif sites and sites <= set(decisions):
        release.status = ReleaseStatus.APPROVED
    else:
        return
    release.decided_at = timezone.now()
    release.save(update_fields=["status", "decided_at"])
    audit_record(
        by=None,
        action=f"release.{release.status}",
        target=release,
        institution=release.job.project.institution,
    )
    _ledger(
        "model_release",
        release=release.pk,
        job=release.job_id,
        site=None,
        decision=str(release.status),
        by=None,
        by_rule=False,
        time=release.decided_at.isoformat(),
    )


def _ledger_release_decision(decision) -> None:
    """The ledger leaf of one site's airlock decision (by its steward or by the dataset's rule)."""
    _ledger(
        "model_release",
        release=decision.release_id,
        job=decision.release.job_id,
        site=decision.site.slug,
        decision="approve" if decision.approve else "refuse",
        by=decision.decided_by_id,
        by_rule=decision.by_rule,
        time=decision.decided_at.isoformat(),
    )


@transaction.atomic
def release_request(*, by, job):
    """A project member asks to take a COMPLETED job's model out; sites with an auto-release rule
    on their dataset approve at once, the others wait for their data steward. Idempotent."""
    if not can(by, "project.view", job.project):
        raise ReleaseError("only members of this job's project may ask for its model")
    if job.status != JobStatus.COMPLETED or not job.final_metrics.get("model"):
        raise ReleaseError("only a completed job with a final model can be released")
    release, created = ModelRelease.objects.get_or_create(job=job, defaults={"requested_by": by})
    if not created:
        return release
    audit_record(
        by=by, action="release.request", target=release, institution=job.project.institution
    )
    for js in job.sites.select_related("dataset_version__dataset", "site"):
        if js.dataset_version.dataset.auto_release:
            decision = ReleaseDecision.objects.create(
                release=release,
                site=js.site,
                approve=True,
                by_rule=True,
                reason="the dataset's auto-release rule",
            )
            _ledger_release_decision(decision)
            audit_record(
                by=None,
                action="release.approve_by_rule",
                target=release,
                institution=js.site.institution,
                site=js.site.slug,
            )
    _release_settle(release)
    return release


@transaction.atomic
def release_decide(*, by, release_id: int, site, approve: bool, reason: str = ""):
    """A data steward of ``site``'s institution approves or refuses (with a reason) the release."""
    release = (
        ModelRelease.objects.select_for_update().select_related("job__project").get(pk=release_id)
    )
    if not release.job.sites.filter(site=site).exists():
        raise ReleaseError("this site did not take part in the job")
    if not by.memberships.filter(institution=site.institution, role=Role.DATA_STEWARD).exists():
        raise ReleaseError("only a data steward of the site's institution decides")
    if release.status != ReleaseStatus.PENDING:
        raise ReleaseError(f"the release is already {release.get_status_display().lower()}")
    if not approve and not reason.strip():
        raise ReleaseError("give a reason for the refusal")
    if release.decisions.filter(site=site).exists():
        raise ReleaseError("this site has already decided")
    decision = ReleaseDecision.objects.create(
        release=release, site=site, approve=approve, decided_by=by, reason=reason.strip()
    )
    _ledger_release_decision(decision)
    audit_record(
        by=by,
        action="release.approve" if approve else "release.refuse",
        target=release,
        institution=site.institution,
        site=site.slug,
        reason=reason.strip(),
    )
    _release_settle(release)
    return release
