"""Writes of federated jobs: submit, launch, record callbacks, reconcile with the SuperLink, stop,
and the airlock (a finished job's model release).

State machine (``JobStatus``), all transitions here::

    QUEUED ──launch──▶ LAUNCHING ──run recorded──▶ RUNNING ──SuperLink finished──▶ COMPLETED
       ▲                   │  (or found by its nonce)  │                          ├▶ FAILED
       └─ stale, no run ◀──┘── submit refused ──▶ FAILED └── stop ──▶ STOPPED      └▶ STOPPED
    LAUNCHING / RUNNING ── SuperLink silent for FRP_SUPERLINK_LOST_SECONDS ──▶ FAILED
    RUNNING ── preempted, its run stopped ──▶ QUEUED (resumes from its checkpoint, ADR 0035)
    FAILED ── resumed by its submitter ──▶ QUEUED (ADR 0026)

The SuperLink is authoritative for a run's end (``job_reconcile``); callbacks from the ServerApp only
add metrics. Every service re-reads state under a row lock first, so a second delivery of a task or
callback changes nothing. Each launch has a nonce, committed before the run is started and sent in
its run config: a run is recorded only for the job holding its nonce, a run no job holds is stopped,
so every Flower run the portal started belongs to exactly one job (ADR 0018).
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from functools import partial
from pathlib import Path

from celery import signature
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from federation import admission, artifacts, columns, notifications, superlink
from federation.models import (
    ComputePool,
    FederatedJob,
    JobSite,
    JobSiteStatus,
    JobStatus,
    ModelRelease,
    ReleaseDecision,
    ReleaseStatus,
    RoundMetric,
    SiteNode,
    SiteNodeStatus,
    SiteRoundMetric,
)
from federation.signals import job_finished, job_resumed
from frp_flwr import contract
from portal.ledger.services import ledger_append
from portal.models import Role
from portal.permissions import can
from portal.services import audit_record
from sandbox import selectors as sandbox_selectors
from sandbox.models import Dataset

log = logging.getLogger(__name__)

MIN_SITES = 2
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


def _validate_columns(
    versions, target: str, features: list[str], plans: list[contract.FeaturePlan]
) -> tuple[str, list[str], list[contract.FeaturePlan]]:
    """Check target, features and plans against every schema (``federation.columns``).

    Returns ``(task, features, plans)``: the task the target's type decides; the features (by
    default every numeric column the datasets share that is not identifier-like); one plan per
    feature (the careful default where none is given). Raises ``JobError`` per field.
    """
    errors: dict[str, list[str]] = {}
    shared = {c.name: c for c in columns.common_columns(versions)}
    task = "classification"
    if target not in shared:
        names = list(shared)
        common = (
            "The chosen datasets share no column: pick datasets with the same schema."
            if not names
            else "Columns every chosen dataset has: "
            + ", ".join(names[:12])
            + (f" and {len(names) - 12} more." if len(names) > 12 else ".")
        )
        lacking = [str(v.dataset) for v in versions if target not in {c["name"] for c in v.schema}]
        errors["target_column"] = [f"No column {target!r} in {', '.join(lacking)}. {common}"]
    else:
        try:
            task = columns.task_for(shared[target])
        except ValueError as exc:
            errors["target_column"] = [f"{exc}."]
    if not features:
        features = [
            c.name
            for c in shared.values()
            if c.name != target and c.preselected and c.default_kind == "numeric"
        ]
        if not features and "target_column" not in errors:
            errors["feature_columns"] = [
                "The chosen datasets share no numeric column besides the target and identifiers."
            ]
    if target in features:
        errors.setdefault("feature_columns", []).append(
            "The target column cannot also be a feature."
        )
        features = [f for f in features if f != target]
    by_name = {p.name: p for p in plans}
    out_plans = []
    for name in features:
        column = shared.get(name)
        if column is None:
            errors.setdefault("feature_columns", []).append(
                f"{name!r} is not a column of every chosen dataset."
            )
            continue
        if not column.kinds:
            errors.setdefault("feature_columns", []).append(f"{name!r} cannot be a feature.")
            continue
        plan = by_name.get(name) or column.default_plan()
        if plan.kind not in column.kinds:
            errors.setdefault("feature_columns", []).append(
                f"{name!r} ({column.type}) cannot be used as {plan.kind}: use "
                + " or ".join(column.kinds)
                + "."
            )
        elif plan.missing not in contract.RULES_FOR_KIND[plan.kind]:
            errors.setdefault("feature_columns", []).append(
                f"{name!r}: {plan.missing!r} does not apply to a {plan.kind} feature."
            )
        out_plans.append(plan)
    unknown = sorted(set(by_name) - set(features))
    if unknown:
        errors.setdefault("feature_columns", []).append(
            f"Rules for columns that are not features: {', '.join(map(repr, unknown))}."
        )
    if errors:
        raise JobError("the datasets do not fit the job", errors)
    return task, features, out_plans


def _validate_training(
    model: dict | None, strategy: dict | None, *, sites: int, secure_aggregation: bool = False
):
    """The complete model and strategy specs (``contract.read_model_choice`` /
    ``read_strategy_choice``); raises ``JobError`` on ``model_kind`` / ``strategy_name`` (also
    for a strategy that needs individual updates in a secure-aggregation job,
    ``strategies.secagg_problem``)."""
    from frp_flwr.strategies import krum_problem, secagg_problem

    try:
        model_spec = contract.read_model_choice(model or {"kind": "linear"})
    except contract.ContractError as exc:
        raise JobError("model", {"model_kind": [str(exc)]}) from None
    try:
        strategy_spec = contract.read_strategy_choice(strategy or {"name": "fedavg"})
    except contract.ContractError as exc:
        raise JobError("strategy", {"strategy_name": [str(exc)]}) from None
    problem = krum_problem(strategy_spec, sites)
    if problem:
        raise JobError("strategy", {"strategy_name": [problem]})
    if model_spec["kind"] == "xgboost" and strategy_spec != {"name": "fedavg"}:
        raise JobError(
            "strategy",
            {
                "strategy_name": [
                    "Gradient-boosted trees are combined by Flower's FedXgbBagging (every site's "
                    "new trees appended); keep the strategy at FedAvg."
                ]
            },
        )
    problem = secagg_problem(strategy_spec) if secure_aggregation else ""
    if problem:
        raise JobError("strategy under secure aggregation", {"strategy_name": [problem]})
    if secure_aggregation and model_spec["kind"] == "xgboost":
        raise JobError(
            "trees under secure aggregation",
            {
                "secure_aggregation": [
                    "SecAgg+ sums weight vectors; gradient-boosted trees send trees, so they "
                    "cannot be aggregated securely. Turn it off or choose the linear model or "
                    "the MLP."
                ]
            },
        )
    return model_spec, strategy_spec


def _check_model_size(
    model_spec: dict, task: str, plans: list[contract.FeaturePlan], versions, target: str
) -> None:
    """Refuse (``JobError`` on ``mlp_hidden``, or ``feature_columns`` for the linear model) a model
    whose final weights cannot reach the portal: more than ``contract.MAX_FINAL_MODEL_VALUES``
    numbers.

    The inputs are the model columns the federated preprocessing builds
    (``frp_flwr.preprocess.FittedFeature.columns``, what every ClientApp trains on), counted with
    the categories the datasets' profiles list (``columns.profile_vocabulary``): a categorical
    feature is one column per listed category plus "(other)", any feature its missing
    indicator. The outputs: 1 for regression, else the target's listed classes (at least 2).
    The count is exact for those lists; the message says "at least" when a list may be
    incomplete (a truncated or free-text category list, rare classes). The federated fit keeps
    only categories held by more than ``small_count`` *training* rows at some site, so it can
    only merge a listed category near that count into "(other)", never add one.
    """
    from frp_flwr.models import parameter_count
    from frp_flwr.preprocess import FittedFeature

    complete = True
    features = []
    for plan in plans:
        vocabulary: list[str] = []
        if plan.kind == "categorical":
            vocabulary, listed = columns.profile_vocabulary(versions, plan.name)
            complete = complete and listed
        features.append(
            FittedFeature(plan.name, plan.kind, plan.missing, plan.indicator, vocabulary=vocabulary)
        )
    inputs = sum(len(f.columns()) for f in features)
    one_hot = sum(len(f.columns()) for f in features if f.kind == "categorical")
    if task == "regression":
        outputs = 1
    else:
        classes, listed = columns.profile_vocabulary(versions, target, every_value=True)
        outputs = max(2, len(classes))
        complete = complete and listed
    count = parameter_count(model_spec, num_features=inputs, num_outputs=outputs)
    cap = contract.MAX_FINAL_MODEL_VALUES
    if count <= cap:
        return
    shape = f"{inputs} inputs"
    if one_hot:
        shape += (
            f" ({one_hot} of them for categorical features, one-hot over the categories in the "
            "datasets' profiles)"
        )
    if model_spec.get("kind") == "mlp":
        hidden = ",".join(str(h) for h in model_spec["hidden"])
        field, advice = "mlp_hidden", "choose fewer or narrower hidden layers"
        shape += f", hidden layers {hidden}, {outputs} outputs"
    else:
        field, advice = "feature_columns", "choose fewer features or categories"
        shape += f", {outputs} outputs"
    raise JobError(
        "the model is too large",
        {
            field: [
                f"This model has {'at least ' if not complete else ''}{count:,} weights "
                f"({shape}); the final model reaches the portal with at most {cap:,} numbers: "
                f"{advice}."
            ]
        },
    )


@transaction.atomic
def job_submit(
    *,
    by,
    project,
    dataset_versions: list,
    title: str,
    target_column: str,
    feature_columns: list[str] | None = None,
    preprocessing: list[contract.FeaturePlan] | None = None,
    num_rounds: int = 5,
    local_epochs: int = 5,
    learning_rate: float = 0.1,
    secure_aggregation: bool = False,
    schedule: dict | None = None,
    model: dict | None = None,
    strategy: dict | None = None,
    privacy: dict | None = None,
) -> FederatedJob:
    """Validate and queue a job; its launch is queued after the transaction commits.

    Checks: ``by`` may submit in ``project``; at least ``MIN_SITES`` datasets, one per site; every
    dataset under a valid grant for the project; target and feature columns present in every
    schema, each feature's plan (``preprocessing``: kind, missing-value rule, indicator) fitting
    its type — a feature without a plan gets the careful default (``federation.columns``); the
    target's type decides the task. Raises ``JobError`` (with per-field messages) otherwise.

    ``secure_aggregation``: train with SecAgg+ (``frp_flwr.secagg``; contribution then by data
    volume, ``final_metrics["updates_hidden"]``); the strategy must then need only the weighted
    mean (FedAvg, FedProx, FedAdam, FedYogi, FedAdagrad), else ``JobError`` on ``strategy_name``.

    ``schedule`` (optional): ``policy`` (``SchedulePolicy`` value), ``deadline`` (aware datetime),
    ``budget_cap`` (``Decimal``), ``qos``, ``preemptible``, ``cores`` / ``memory_gib`` / ``gpus``
    per site (the same request at every site). The run time is estimated here
    (``admission.duration_estimate``).

    ``model`` (``{"kind": "linear"|"mlp"|"xgboost", …}``) and ``strategy`` (``{"name":
    "fedavg"|…, …}``): validated by the contract (``frp_flwr.models`` / ``frp_flwr.strategies``)
    and stored complete (``job.model`` is the kind, ``job.model_spec`` the spec); ``None`` means
    linear + FedAvg. Krum's ``num_malicious_nodes`` must leave more than ``2f + 2`` sites; an
    ``xgboost`` model is bagged with Flower's FedXgbBagging, so its strategy must be the default
    (FedAvg). A bad value raises ``JobError`` on ``model_kind`` or ``strategy_name``.

    ``privacy`` (optional): the ``frp_flwr.contract.Privacy`` dict (``dp`` off when absent). With
    dp on, the job's ε is computed (``federation.privacy_budget``) and stored on the job and in a
    ledger leaf; a job whose ε would exceed any chosen dataset's budget for the project is
    refused with the figures (spent, this job, budget); so is a job with dp off on a dataset
    that has a budget for the project (its ε would be unbounded).
    """
    schedule = dict(schedule or {})
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
    model_spec, strategy_spec = _validate_training(
        model, strategy, sites=len(versions), secure_aggregation=secure_aggregation
    )
    task, features, plans = _validate_columns(
        versions, target_column, list(feature_columns or []), list(preprocessing or [])
    )
    _check_model_size(model_spec, task, plans, versions, target_column)
    deadline = schedule.get("deadline")
    if deadline is not None and deadline <= timezone.now():
        raise JobError("deadline in the past", {"deadline": ["The deadline has passed."]})
    cap = schedule.get("budget_cap")
    if cap is not None and cap <= 0:
        raise JobError("budget cap", {"budget_cap": ["A budget cap must be above zero."]})
    privacy_settings, epsilon = _privacy_check(project, versions, privacy, num_rounds)
    if privacy_settings and secure_aggregation:
        raise JobError(
            "differential privacy with secure aggregation",
            {
                "dp": [
                    "Differential privacy clips each site's update before it is combined; with "
                    "secure aggregation the server has only the sum. Choose one of the two."
                ]
            },
        )
    if privacy_settings and model_spec.get("kind") == "xgboost":
        raise JobError(
            "differential privacy with trees",
            {
                "dp": [
                    "Differential privacy clips and noises weight updates; gradient-boosted "
                    "trees send trees, so it cannot protect them. Turn it off or choose the "
                    "linear model or the MLP."
                ]
            },
        )
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=by,
        privacy=privacy_settings,
        epsilon=epsilon,
        title=title,
        target_column=target_column,
        feature_columns=features,
        task=task,
        preprocessing=[p.to_json() for p in plans],
        num_rounds=num_rounds,
        local_epochs=local_epochs,
        learning_rate=learning_rate,
        secure_aggregation=secure_aggregation,
        model=model_spec["kind"],
        model_spec=model_spec,
        strategy=strategy_spec["name"],
        strategy_spec=strategy_spec,
        policy=schedule.get("policy") or "asap",
        deadline=schedule.get("deadline"),
        budget_cap=schedule.get("budget_cap"),
        qos=schedule.get("qos") or "normal",
        preemptible=bool(schedule.get("preemptible", False)),
        estimated_seconds=admission.job_duration_estimate(
            model=model_spec["kind"],
            num_rounds=num_rounds,
            local_epochs=local_epochs,
            versions=versions,
        ),
    )
    request = {
        k: schedule[k] for k in ("cores", "memory_gib", "gpus") if schedule.get(k) is not None
    }
    JobSite.objects.bulk_create(
        [JobSite(job=job, site=v.dataset.site, dataset_version=v, **request) for v in versions]
    )
    audit_record(
        by=by,
        action="job.submit",
        target=job,
        institution=project.institution,
        sites=[s.slug for s in sites],
    )
    if epsilon is not None:
        _ledger(
            "privacy",
            job=job.pk,
            project=project.pk,
            datasets=sorted(v.dataset_id for v in versions),
            epsilon=repr(epsilon),
            delta=repr(float(privacy_settings["delta"])),
            noise_multiplier=repr(float(privacy_settings["noise_multiplier"])),
            rounds=num_rounds,
            sampling_rate="1.0",
        )
    # robust: a broker hiccup is logged, not raised; the periodic reconcile launches queued jobs too.
    transaction.on_commit(signature(JOB_LAUNCH_TASK, args=(job.pk,)).delay, robust=True)
    return job


def _privacy_check(project, versions, privacy: dict | None, num_rounds: int):
    """``(settings, ε)`` of a job's privacy (``({}, None)`` with dp off). Raises ``JobError``
    for settings the contract refuses, for a job over a steward's ε budget, with the figures, and
    for a job without dp on a dataset that has a budget (its ε would be unbounded).
    The budget rows are locked so two submissions cannot both spend the last of a budget."""
    from federation import privacy_budget
    from federation.privacy import PrivacyError
    from sandbox.models import PrivacyBudget

    if not privacy or privacy.get("dp", "off") == "off":
        # Without dp a job's ε is unbounded: a steward's budget on a chosen dataset needs dp on.
        budgets = sandbox_selectors.privacy_budgets(
            project=project, dataset_ids=[v.dataset_id for v in versions]
        )
        if budgets:
            names = {v.dataset_id: str(v.dataset) for v in versions}
            raise JobError(
                "a privacy budget needs differential privacy",
                {
                    "dp": [
                        f"{names[d]}: the data steward set this project a privacy budget "
                        f"(budget {eps:.3g}); a job on it must use differential privacy, "
                        "whose ε is counted against it."
                        for d, eps in sorted(budgets.items())
                    ]
                },
            )
        return {}, None
    try:
        settings_ = {  # the differential-privacy settings (SecAgg+ is the job's own field)
            k: v
            for k, v in contract.Privacy.from_json(dict(privacy)).to_json().items()
            if not k.startswith("secagg")
        }
        epsilon = privacy_budget.job_epsilon(settings_, num_rounds=num_rounds, sites=len(versions))
    except (contract.ContractError, PrivacyError) as exc:
        raise JobError(str(exc), {"dp": [str(exc)]}) from None
    list(
        PrivacyBudget.objects.select_for_update()
        .filter(project=project, dataset_id__in=[v.dataset_id for v in versions])
        .order_by("pk")  # one lock order for every submission: no deadlock between two
    )
    problems = privacy_budget.refusal(
        privacy_budget.budget_figures(project=project, versions=versions, epsilon=epsilon)
    )
    if problems:
        raise JobError("over the privacy budget", {"dp": problems})
    return settings_, epsilon


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------


def _shapley_not_opted_in(job: FederatedJob) -> list[str]:
    return sandbox_selectors.shapley_not_opted_in(
        version_ids=job.sites.values("dataset_version_id")
    )


def job_run_config(job: FederatedJob) -> contract.RunConfig:
    """The Flower run config of ``job`` (``frp_flwr.contract.RunConfig``): job spec (sites →
    store keys), callback URL, hyper-parameters, the launch nonce. It reaches every SuperNode: no
    secret in it."""
    spec = contract.JobSpec(
        sites={
            js.site.slug: contract.SitePointer(
                store_key=js.dataset_version.store_key,
                dataset=js.dataset_version.dataset.slug,
                version=js.dataset_version.version,
            )
            for js in job.sites.select_related("site", "dataset_version__dataset")
        },
        target=job.target_column,
        features=list(job.feature_columns),
        min_sites=MIN_SITES,
        task=job.task,
        plans=[contract.FeaturePlan(**p) for p in job.preprocessing],
        model=dict(job.model_spec or {"kind": "linear"}),
        strategy=dict(job.strategy_spec or {"name": "fedavg"}),
        privacy=contract.Privacy.from_json(
            {**(job.privacy or {}), **({"secagg": True} if job.secure_aggregation else {})}
        ),
    )
    callback = settings.FRP_CALLBACK_BASE_URL.rstrip("/") + reverse(
        "federation:job_callback", args=[job.pk]
    )
    return contract.RunConfig(
        job_id=job.pk,
        job_spec=spec.to_text(),
        callback_url=callback,
        num_rounds=job.num_rounds,
        local_epochs=job.local_epochs,
        learning_rate=float(job.learning_rate),
        round_timeout=float(settings.FRP_ROUND_TIMEOUT),
        poll_interval=float(settings.FRP_SERVERAPP_POLL_SECONDS),
        reply_log=(
            str(Path(settings.FRP_REPLY_LOG_DIR) / f"job-{job.pk}-replies.jsonl")
            if settings.FRP_REPLY_LOG_DIR
            else ""
        ),
        launch_nonce=job.launch_nonce,
        resume_round=job.resume_round,
        # Coalition models reach every site (ADR 0036): only when every steward opted in, as
        # recorded at launch (a job not launched yet: the datasets' settings now).
        contribution=(
            job.shapley_consent
            if job.shapley_consent is not None
            else not _shapley_not_opted_in(job)
        ),
    )


def job_refuse(*, job: FederatedJob, reason: str) -> None:
    """Fail a QUEUED job the scheduler refuses (budget cap, resources no pool has), with the
    reason and an audit event. Called inside the scheduler pass's transaction."""
    if job.status != JobStatus.QUEUED:
        return
    _fail(job, f"refused by the scheduler: {reason}")


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

    Idempotent across crashes: a fresh launch nonce is committed with the LAUNCHING state before
    the run is started and travels in the run config, so when this process dies after the
    SuperLink started the run but before the run id was recorded, ``job_reconcile`` finds the run
    by its nonce and records it instead of starting another. A SuperLink that does not answer
    leaves the job LAUNCHING for the reconcile (which fails it after
    ``FRP_SUPERLINK_LOST_SECONDS``); a SuperLink that refuses the run fails the job.
    """
    with transaction.atomic():
        # Pools first, then the job: a pass writes other queued jobs' rows while it holds the pools.
        list(ComputePool.objects.select_for_update().order_by("pk").values_list("pk", flat=True))
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
        decisions = admission.schedule_pass()
        for pk, d in decisions.items():  # the pass refuses jobs that can never run
            if d.action == "refuse":
                refused = FederatedJob.objects.filter(pk=pk, status=JobStatus.QUEUED).first()
                if refused is not None:
                    job_refuse(job=refused, reason=f"{d.reason}: {d.detail}")
        for pk, run_id in _jobs_preempt(decisions):  # stop each run once the marks commit
            transaction.on_commit(partial(preempt_stop_send, job_id=pk, run_id=run_id), robust=True)
        others = [pk for pk, d in decisions.items() if d.action == "start" and pk != job.pk]
        for pk in others:  # jobs the same pass admitted: each launches in its own task
            transaction.on_commit(signature(JOB_LAUNCH_TASK, args=(pk,)).delay, robust=True)
        job.refresh_from_db()
        decision = decisions.get(job.pk)
        if job.status != JobStatus.QUEUED or decision is None or decision.action != "start":
            return job
        # The pool of each site the pass chose for the job's request (several pools per site).
        for site_id, pool_id in admission.pool_of_sites(decision).items():
            JobSite.objects.filter(job=job, site_id=site_id).update(pool_id=pool_id)
        job.status = JobStatus.LAUNCHING
        job.status_detail = "submitting the run to the SuperLink"
        job.started_at = timezone.now()
        job.launch_nonce = secrets.token_hex(16)
        job.preempted_by = None  # it runs again: no longer shown as preempted
        # The stewards' Shapley consent in force now is the one this run runs under (ADR 0036):
        # the datasets' rows locked first, so a steward's change commits before or after this
        # launch, never beside it; a ledger leaf records it with the launch.
        list(
            Dataset.objects.select_for_update()
            .filter(pk__in=job.sites.values("dataset_version__dataset_id"))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        job.shapley_consent = not _shapley_not_opted_in(job)
        job.save(
            update_fields=[
                "status",
                "status_detail",
                "started_at",
                "launch_nonce",
                "preempted_by",
                "shapley_consent",
            ]
        )
        nonce = job.launch_nonce
        run_config = job_run_config(job).to_flower()
        ledger_append(
            kind="job.launch",
            record={
                "job": job.pk,
                "launch_nonce": nonce,
                "shapley_consent": job.shapley_consent,
                "dataset_versions": sorted(job.sites.values_list("dataset_version_id", flat=True)),
                "at": job.started_at.isoformat(),
            },
        )

    try:
        run_id = superlink.run_submit(superlink_connection(), run_config)
    except superlink.SuperLinkUnreachable as exc:
        superlink_unreachable(job_ids=[job_id], error=str(exc))
        return FederatedJob.objects.get(pk=job_id)
    except superlink.SuperLinkError as exc:
        with transaction.atomic():
            job = FederatedJob.objects.select_for_update().get(pk=job_id)
            if job.status == JobStatus.LAUNCHING and job.launch_nonce == nonce:
                _fail(job, f"the SuperLink refused the run: {exc}")
        return job
    return job_run_record(job_id=job_id, run_id=run_id, nonce=nonce)


def job_run_record(*, job_id: int, run_id: str, nonce: str, found: bool = False) -> FederatedJob:
    """Record Flower run ``run_id``, started with launch ``nonce``, as ``job_id``'s run.

    Idempotent (recording the same run twice changes nothing). A run whose nonce is no longer the
    job's (the job was queued again, stopped or failed meanwhile) belongs to no job: it is stopped
    (``run_orphan_stop``) and the job is left as it is. ``found``: the reconcile found the run by
    its nonce (the launching worker died before recording it); said in the audit event.
    """
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        if job.flower_run_id == run_id:
            return job
        mine = (
            job.launch_nonce == nonce
            and not job.flower_run_id
            and job.status in (JobStatus.LAUNCHING, JobStatus.RUNNING)
        )
        if mine:
            job.flower_run_id = run_id
            job.status = JobStatus.RUNNING
            job.status_detail = f"Flower run {run_id} started" + (
                " (found on the SuperLink by its launch nonce)" if found else ""
            )
            job.save(update_fields=["flower_run_id", "status", "status_detail"])
            audit_record(
                by=None,
                action="job.launch",
                target=job,
                institution=job.project.institution,
                run_id=run_id,
                found_by_nonce=found,
                shapley_consent=job.shapley_consent,
            )
            return job
    run_orphan_stop(run_id=run_id, job_id=job_id, why="its launch is no longer the job's")
    return FederatedJob.objects.get(pk=job_id)


def run_orphan_stop(*, run_id: str, job_id: int | None, why: str) -> None:
    """Stop a Flower run that belongs to no job (its launch nonce is no job's current one), so
    every run on the SuperLink belongs to exactly one job; audited on the job it names."""
    try:
        superlink.run_stop(superlink_connection(), run_id)
        outcome = "stopped"
    except superlink.SuperLinkError as exc:
        outcome = f"stop failed: {exc}"
    log.warning("Flower run %s belongs to no job (%s): %s", run_id, why, outcome)
    job = FederatedJob.objects.filter(pk=job_id).select_related("project").first()
    if job is not None:
        with transaction.atomic():
            audit_record(
                by=None,
                action="job.orphan_run_stop",
                target=job,
                institution=job.project.institution,
                run_id=run_id,
                why=why,
                outcome=outcome,
            )


# ---------------------------------------------------------------------------------------------
# Preemption (ADR 0035)
# ---------------------------------------------------------------------------------------------


def _jobs_preempt(decisions: dict) -> list[tuple[int, str]]:
    """Mark the running jobs a pass decided to PREEMPT; returns ``(job id, Flower run id)`` of
    each marked now, whose run the caller stops after commit (``preempt_stop_send``).

    Called inside the pass's transaction (pools locked, then each job's row). A job is marked
    once: ``preempt_requested_at`` (the mark the reconcile reads when the run ends),
    ``preempted_by`` (the job it is stopped for), reason ``Preempted``, a status detail, and the
    audit event ``job.preempt`` by the system. The mark is committed before the stop is sent,
    so a worker that dies in between leaves a marked job whose run the reconcile stops
    (``job_reconcile``); a run stopped without its mark cannot happen. Skipped: a job no
    longer RUNNING, without a run id yet (LAUNCHING: the pass asks again once it runs), not
    preemptible, or already marked (a second delivery of the task).
    """
    marked = []
    for pk, d in decisions.items():
        if d.action != "preempt":
            continue
        job = FederatedJob.objects.select_for_update().filter(pk=pk).first()
        if (
            job is None
            or job.status != JobStatus.RUNNING
            or not job.flower_run_id
            or not job.preemptible
            or job.preempt_requested_at is not None
        ):
            continue
        job.preempt_requested_at = timezone.now()
        job.preempted_by_id = d.for_job
        job.sched_reason = str(d.reason)
        job.status_detail = (
            f"Preempted for job #{d.for_job} (higher QoS): its Flower run {job.flower_run_id} is "
            "being stopped; the job will be queued again to resume from its latest round "
            "checkpoint."
        )
        job.save(
            update_fields=["preempt_requested_at", "preempted_by", "sched_reason", "status_detail"]
        )
        audit_record(
            by=None,
            action="job.preempt",
            target=job,
            institution=job.project.institution,
            run_id=job.flower_run_id,
            preempted_for=d.for_job,
            reason=str(d.reason),
        )
        marked.append((job.pk, job.flower_run_id))
    return marked


def preempt_stop_send(*, job_id: int, run_id: str) -> bool:
    """Ask the SuperLink to stop a preempted job's run; ``True`` when it accepted.

    A SuperLink that does not answer or refuses (the run already ended on its own) is logged:
    the job keeps its mark, and the reconcile stops the run while it still runs, or queues the
    job again (or ends it, when it completed) once the run has ended."""
    try:
        superlink.run_stop(superlink_connection(), run_id)
    except superlink.SuperLinkError as exc:
        log.warning("preempted job %s: stopping Flower run %s failed: %s", job_id, run_id, exc)
        return False
    return True


def _job_preempted_requeue(*, job_id: int, run: superlink.RunStatus) -> FederatedJob:
    """The run of a job marked for preemption has ended (not completed): queue the job again to
    resume from its latest round checkpoint (round 0 when none exists) through the path
    ``job_resume`` takes (``_job_requeue``).

    In one transaction (the job's row locked, and re-checked: a second delivery finds the job
    QUEUED or its mark cleared and does nothing): the stopped run's end is written first
    (``STOPPED``, ``finished_at``, Flower's run figures), as a resume expects of a job whose
    run has ended — the accounting receiver of ``job_resumed`` records that run's usage
    against it (ADR 0028) —, then the job is queued again. If the resume is refused (a DP
    job's ε budget, a usage that cannot be recorded) or the checkpoints cannot be read, nothing
    of it is kept and the job ends FAILED with the reason, for its submitter to resume later.
    """
    job = FederatedJob.objects.select_related("project").get(pk=job_id)
    try:
        rnd = artifacts.checkpoint_round(job)
        active = artifacts.checkpoint_active_sites(job, rnd) if rnd else None
    except artifacts.ArtifactError as exc:
        refused = f"its round checkpoints cannot be read: {exc}"
    else:
        refused = ""
    failed = superlink.RunStatus(run.run_id, "finished", "failed", run.details, run.raw)
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        mine = (
            job.status == JobStatus.RUNNING
            and job.preempt_requested_at is not None
            and job.flower_run_id == run.run_id
        )
        if not mine:
            return job
        by_job = job.preempted_by_id
        if "rounds" in job.final_metrics:  # training had finished: nothing to resume
            job.preempt_requested_at = None
            job.save(update_fields=["preempt_requested_at"])
            return _job_finish(job_id=job_id, run=run)
        if not refused:
            try:
                with transaction.atomic():
                    job.status = JobStatus.STOPPED
                    job.finished_at = timezone.now()
                    if run.usage:
                        job.final_metrics = {**job.final_metrics, "flower": run.usage}
                    job.save(update_fields=["status", "finished_at", "final_metrics"])
                    where = (
                        f"the checkpoint after round {rnd}" if rnd else "round 0 (no checkpoint)"
                    )
                    _job_requeue(
                        job,
                        rnd=rnd,
                        active=active,
                        by=None,
                        detail=f"Preempted for job #{by_job} (higher QoS): Flower run "
                        f"{run.run_id} stopped; queued to resume from {where}.",
                        preempted_for=by_job,
                    )
                    job.sched_reason = "Preempted"
                    job.save(update_fields=["sched_reason"])
                    return job
            except JobError as exc:
                refused = str(exc)
        job.preempt_requested_at = None
        job.save(update_fields=["preempt_requested_at"])
        return _job_finish(
            job_id=job_id,
            run=failed,
            reason=f"Preempted for job #{by_job} (higher QoS), but it could not be queued again: "
            f"{refused}.",
        )


# ---------------------------------------------------------------------------------------------
# Callbacks from the ServerApp
# ---------------------------------------------------------------------------------------------


def _unknown_sites(names, sites: dict[str, JobSite], what: str) -> None:
    unknown = sorted(set(names) - set(sites))
    if unknown:
        raise JobError(f"{what} names sites outside the job: {', '.join(unknown)}")


def _results_final(job: FederatedJob, what: str) -> None:
    """Refuse an event that would change results already recorded as final."""
    if "rounds" in job.final_metrics:
        raise JobError(f"the job's final results are recorded; {what} cannot change them")


def _record_started(job: FederatedJob, sites: dict[str, JobSite], event: contract.Started):
    """Discovery: each found site's node id (it trains from now on); sites that erred fail.

    A site with a registered SuperNode (``SiteNode``, node authentication) must have been found
    at that node: any other node that answered in its name fails it (the answer drops it)."""
    _unknown_sites([*event.nodes, *event.errors, *event.missing], sites, "started")
    registered = dict(
        SiteNode.objects.filter(
            site__slug__in=list(event.nodes), status=SiteNodeStatus.REGISTERED
        ).values_list("site__slug", "node_id")
    )
    for slug, node_id in event.nodes.items():
        js = sites[slug]
        want = registered.get(slug)
        if want is not None and want != node_id:
            js.node_id = node_id
            js.status = JobSiteStatus.FAILED
            js.last_error = (
                f"node {node_id} answered as {slug}, but the SuperNode registered for {slug} is "
                f"node {want}: refused at discovery"
            )
            js.save(update_fields=["node_id", "status", "last_error"])
            continue
        js.node_id = node_id
        js.status = JobSiteStatus.TRAINING
        js.save(update_fields=["node_id", "status"])
    for slug, error in event.errors.items():
        sites[slug].status = JobSiteStatus.FAILED
        sites[slug].last_error = error[:2000]
        sites[slug].save(update_fields=["status", "last_error"])
    if event.preparation is not None:
        _unknown_sites(event.preparation.sites, sites, "started")
        job.preparation = event.preparation.to_json()
        job.save(update_fields=["preparation"])


def site_limits(js: JobSite) -> contract.SiteLimits:
    """What the portal knows of a job's site that the site cannot change: the rows of the
    dataset version registered at ingest and the cores its ClientApp is allocated."""
    return contract.SiteLimits(
        rows=js.dataset_version.row_count, cores=settings.FRP_CLIENTAPP_CORES
    )


def _round_problem(job: FederatedJob, js: JobSite, info: contract.SiteRound, round_wall) -> str:
    """Why a site's part of a round cannot be true ("" when it can), from what the portal knows:
    its examples against the dataset version's rows and the job's split (``test_fraction``), its
    seconds against the round's wall time as the ServerApp measured it (or, for a partial round,
    the time since the job started; not checked when the portal never started it) and its
    allocated cores."""
    limits = site_limits(js)
    fraction = contract.RunConfig.test_fraction
    about = contract.about  # the reason reaches the job page: counts as the profile shows them
    if info.train_examples + info.eval_examples > limits.rows:
        return (
            f"reported {about(info.train_examples)} train + {about(info.eval_examples)} test "
            f"examples; the dataset version registered for this site has {about(limits.rows)} rows"
        )
    if info.eval_examples:
        lo, hi = contract.held_out_bounds(limits.rows, test_fraction=fraction, classes=limits.rows)
        if not lo <= info.eval_examples <= hi:
            return (
                f"reported {about(info.eval_examples)} test examples of {about(limits.rows)} rows"
            )
    if round_wall is None:  # a partial round: the time since the job started bounds it
        if job.started_at is None:
            return ""  # never launched by the portal: no clock of its own to compare with
        round_wall = max((timezone.now() - job.started_at).total_seconds(), 0.0)
    return contract.metering_problem(info.cpu_seconds, info.wall_seconds, round_wall, limits)


def _record_round(job: FederatedJob, sites: dict[str, JobSite], event: contract.Round):
    """One round: each site's ``SiteRoundMetric`` (metrics and metering; a site that did not
    reply ok is dropped with its error) and, unless ``partial``, the round's aggregate.

    A site whose figures cannot be true (:func:`_round_problem`) is refused: its row keeps the
    reason and no figures, and the site is marked failed (the ServerApp drops it). Usage and
    contribution are computed from the stored rows only, so they use bounded values."""
    _results_final(job, f"round {event.round}")
    if event.round > job.num_rounds:
        raise JobError(f"round {event.round} is beyond the job's {job.num_rounds} rounds")
    _unknown_sites(event.sites, sites, f"round {event.round}")
    parts, refused = dict(event.sites), set()
    for slug, info in event.sites.items():
        problem = _round_problem(job, sites[slug], info, event.wall_seconds)
        if problem:
            refused.add(slug)
            parts[slug] = contract.SiteRound(
                node_id=info.node_id, ok=False, error=f"faulty replies, refused: {problem}"
            )
    for slug, info in parts.items():
        js = sites[slug]
        SiteRoundMetric.objects.update_or_create(
            job_site=js,
            round=event.round,
            defaults={
                "ok": info.ok,
                "error": info.error[:2000],
                "train_examples": info.train_examples,
                "eval_examples": info.eval_examples,
                "train_loss": info.train_loss,
                "eval_loss": info.eval_loss,
                "eval_accuracy": info.eval_accuracy,
                "cpu_seconds": info.cpu_seconds,
                "wall_seconds": info.wall_seconds,
                "bytes_received": info.bytes_received,
                "bytes_sent": info.bytes_sent,
            },
        )
        js.rounds_completed = js.round_metrics.filter(ok=True).count()
        if slug in refused:
            js.status = JobSiteStatus.FAILED
            js.last_error = info.error[:2000]
        elif not info.ok:
            js.status = JobSiteStatus.DROPPED
            js.last_error = info.error[:2000]
        js.save(update_fields=["rounds_completed", "status", "last_error"])
    if not event.partial:
        RoundMetric.objects.update_or_create(
            job=job,
            round=event.round,
            defaults={
                "train_loss": event.train_loss,
                "eval_loss": event.eval_loss,
                "eval_accuracy": event.eval_accuracy,
                "num_examples": sum(i.train_examples for i in parts.values() if i.ok),
                "sites_replied": sum(1 for i in parts.values() if i.ok),
                "wall_seconds": event.wall_seconds,
            },
        )


def _record_finished(job: FederatedJob, sites: dict[str, JobSite], event: contract.Finished):
    """The final model and its evaluation, once: a second ``finished`` is refused. The model is
    written to the model store (``federation.artifacts``) and only its key to the row."""
    _results_final(job, "another finished event")
    _unknown_sites(event.sites, sites, "finished")
    # The model goes to the model store, never into the row (ADR 0026). A store that fails raises
    # ArtifactError: nothing is recorded, and the callback view answers 503 so the ServerApp
    # retries the same event.
    job.model_key = artifacts.model_put(
        job=job, weights=event.model, classes=list(event.classes), preprocessing=event.preprocessing
    )
    job.final_metrics = {
        **job.final_metrics,
        "eval_accuracy": event.eval_accuracy,
        "eval_loss": event.eval_loss,
        "eval_examples": event.eval_examples,
        "rounds": event.rounds,
        "classes": list(event.classes),
        "metrics": event.metrics.to_json() if event.metrics else None,
        "baseline": event.baseline.to_json() if event.baseline else None,
        "preprocessing": event.preprocessing,
        # SecAgg+: the ServerApp saw only sums, so contribution is by data volume (accounting)
        "updates_hidden": bool(job.secure_aggregation),
    }
    job.save(update_fields=["final_metrics", "model_key"])
    for slug, info in event.sites.items():
        sites[slug].final_metrics = info.to_json()
        sites[slug].save(update_fields=["final_metrics"])


def _record_contribution(
    job: FederatedJob, sites: dict[str, JobSite], event: contract.Contribution
):
    """Coalition utilities, stored once in ``job.final_metrics["contribution"]``.

    Shape: ``{"players": [site ids], "method": "exact"|"gtg", "permutations": int, "seed": int,
    "utility": text, "utilities": {round key: {coalition key: float}}, "examples": {site: int},
    "models": int, "sites": {site: metering}, "errors": {site: str}, "wall_seconds": float}`` —
    round key ``"0"`` is the whole run, coalition keys are ascending player indexes joined by
    commas. An event carrying ``error`` is stored as ``{"players": [...], "error": text}``.
    """
    if "contribution" in job.final_metrics:
        raise JobError("the job's contribution is recorded; it cannot be replaced")
    if job.shapley_consent is False:  # the run was told not to measure one (ADR 0036)
        raise JobError(
            "contribution refused: the job runs without its data stewards' Shapley opt-in"
        )
    _unknown_sites(
        [*event.players, *event.examples, *event.sites, *event.errors], sites, "contribution"
    )
    if event.error:
        stored = {"players": list(event.players), "error": event.error[:2000]}
    else:
        stored = event.to_json()
        del stored["error"]
        stored["errors"] = {k: v[:500] for k, v in event.errors.items()}
        # A site's metering of the evaluation is bounded like its rounds' (ADR 0024): held-out
        # rows within its dataset version's rows, seconds within the evaluation's wall time.
        for slug, metering in event.sites.items():
            limits = site_limits(sites[slug])
            problem = (
                f"reported {contract.about(metering.examples)} held-out examples of "
                f"{contract.about(limits.rows)} rows"
                if metering.examples > limits.rows
                else contract.metering_problem(
                    metering.cpu_seconds, metering.wall_seconds, event.wall_seconds or 0.0, limits
                )
            )
            if problem:
                stored["sites"].pop(slug, None)
                stored["examples"].pop(slug, None)
                stored["errors"][slug] = f"faulty metering, refused: {problem}"[:500]
    job.final_metrics = {**job.final_metrics, "contribution": stored}
    job.save(update_fields=["final_metrics"])


def _sentence(text: str) -> str:
    """``text`` with a capital first letter and a full stop at the end (``""`` stays ``""``)."""
    text = text.strip()
    if not text:
        return ""
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _record_failed(job: FederatedJob, sites: dict[str, JobSite], event: contract.Failed):
    """The ServerApp's reason for giving up (the SuperLink's status still ends the job); the
    job's status detail says it as a sentence."""
    job.failure_reason = event.reason[:4000]
    job.status_detail = _sentence(job.failure_reason)
    job.save(update_fields=["failure_reason", "status_detail"])


_RECORDERS = {
    contract.Started: _record_started,
    contract.Round: _record_round,
    contract.Finished: _record_finished,
    contract.Contribution: _record_contribution,
    contract.Failed: _record_failed,
}


@transaction.atomic
def job_callback_record(*, job_id: int, seq: int, event: contract.Event) -> contract.CallbackAnswer:
    """Record one ServerApp event (``frp_flwr.contract``: already parsed and validated).

    Each event is accepted once: ``seq`` must exceed the last accepted number
    (``job.callback_seq``), which is stored with the event, so a replay — even inside the
    signature's timestamp window — is refused. Final results are written once: after
    ``finished``, no round or second ``finished`` may change them; the contribution is written once.

    Returns the answer for the ServerApp: ``drop_sites`` — sites whose grant is no longer valid
    or whose figures were refused, to be dropped from the next round; ``limits`` — each site's
    :func:`site_limits`. Raises ``JobError`` (nothing written) for a job that is not
    running, a replayed ``seq``, an event that would replace final results or that names sites
    outside the job.
    """
    job = FederatedJob.objects.select_for_update().get(pk=job_id)
    if job.status not in (JobStatus.LAUNCHING, JobStatus.RUNNING):
        raise JobError(f"job is {job.status}; callbacks are accepted only while it runs")
    if seq <= job.callback_seq:
        raise JobError(
            f"event {seq} refused: event {job.callback_seq} was already accepted (each once)"
        )
    sites = {
        js.site.slug: js for js in job.sites.select_related("site", "dataset_version__dataset")
    }
    _RECORDERS[type(event)](job, sites, event)
    job.callback_seq = seq
    job.save(update_fields=["callback_seq"])
    # What the portal knows of each site bounds what the site may report (ADR 0024). Only the
    # ServerApp reads this answer: no site learns another's exact row count.
    limits = {slug: site_limits(js) for slug, js in sites.items()}

    drop = _revoked_sites(job, sites)
    revoked = list(drop)  # grants no longer valid (impostors and refused figures follow)
    if isinstance(event, contract.Started):  # impostor nodes (``_record_started``)
        drop += [
            slug
            for slug in event.nodes
            if slug not in drop and sites[slug].status == JobSiteStatus.FAILED
        ]
    if isinstance(event, contract.Round):  # the ServerApp drops these before its next round
        _mark_dropped(sites, drop, after_round=event.round)
        drop += [  # sites whose figures this round were refused (``_round_problem``)
            slug
            for slug, js in sites.items()
            if slug not in drop and js.status == JobSiteStatus.FAILED and slug in event.sites
        ]
    return contract.CallbackAnswer(
        drop_sites=drop,
        limits=limits,
        contribution=_shapley_still_allowed(job, sites, revoked=revoked, event=event),
    )


def _shapley_still_allowed(
    job: FederatedJob, sites: dict[str, JobSite], *, revoked, event: contract.Event
) -> bool:
    """Whether the run may still send coalition models (ADR 0036), answered with every event.

    The consent recorded at launch ends for good when, during the run, a site's steward turns
    the dataset's Shapley opt-in off or its grant is revoked (``revoked``): ``shapley_consent``
    becomes false (audited, and a ledger leaf naming the sites), and the answer tells the
    ServerApp, which then builds no coalition model. Once the closing message has gone out it
    cannot be recalled: a withdrawal reaches the closing evaluation only through an event
    answered before it, and the leaf says whether that message may already have gone out
    (``closing_sent``: the event is the last round's or later). A job launched before the rule
    existed (``shapley_consent`` empty) meeting datasets that are not opted in is recorded as
    such (``launched_before_opt_in``), not as a withdrawal. ``sites``: slug → JobSite with
    ``dataset_version__dataset`` loaded."""
    if job.shapley_consent is False:
        return False
    not_in = sorted(
        slug for slug, js in sites.items() if not js.dataset_version.dataset.shapley_opt_in
    )
    if not not_in and not revoked:
        return True
    legacy = job.shapley_consent is None
    rnd = getattr(event, "round", None)
    record = {
        "job": job.pk,
        "event": event.name,
        "round": rnd,
        "closing_sent": event.name in ("finished", "contribution")
        or (rnd is not None and rnd >= job.num_rounds),
        "launched_before_opt_in": legacy,
        "opt_in_withdrawn": [] if legacy else not_in,
        "grant_revoked": sorted(revoked),
        "at": timezone.now().isoformat(),
    }
    job.shapley_consent = False
    job.save(update_fields=["shapley_consent"])
    audit_record(
        by=None,
        action="job.shapley_consent_ended",
        target=job,
        institution=job.project.institution,
        **{k: v for k, v in record.items() if k not in ("job", "at")},
    )
    ledger_append(kind="job.shapley_ended", record=record)
    return False


def _revoked_sites(job: FederatedJob, sites: dict[str, JobSite]) -> list[str]:
    """The job's sites whose dataset's access grant for the job's project is no longer valid."""
    return [
        slug
        for slug, js in sites.items()
        if not sandbox_selectors.has_valid_grant(
            project=job.project, dataset=js.dataset_version.dataset
        )
    ]


def _mark_dropped(sites: dict[str, JobSite], slugs: list[str], *, after_round: int) -> None:
    """Mark the sites ``slugs`` dropped (unless already dropped or failed), with the reason."""
    for slug in slugs:
        js = sites[slug]
        if js.status not in (JobSiteStatus.DROPPED, JobSiteStatus.FAILED):
            js.status = JobSiteStatus.DROPPED
            js.last_error = f"access grant no longer valid: dropped after round {after_round}"
            js.save(update_fields=["status", "last_error"])


# ---------------------------------------------------------------------------------------------
# Reconcile and stop
# ---------------------------------------------------------------------------------------------

_FINAL = {
    "completed": JobStatus.COMPLETED,
    "failed": JobStatus.FAILED,
    "stopped": JobStatus.STOPPED,
}


def _run_of(runs: list[superlink.RunStatus], job: FederatedJob) -> superlink.RunStatus | None:
    """The run in ``runs`` that carries ``job``'s current launch nonce (``None`` when none)."""
    if not job.launch_nonce:
        return None
    for run in runs:
        config = run.run_config
        if config.get("launch-nonce") == job.launch_nonce and config.get("job-id") == job.pk:
            return run
    return None


def job_reconcile(
    *,
    job_id: int,
    run: superlink.RunStatus | None = None,
    runs: list[superlink.RunStatus] | None = None,
) -> FederatedJob:
    """Bring one job in line with the SuperLink (authoritative for a run's end).

    QUEUED → try to launch. LAUNCHING with no run id → look for the run carrying the job's launch
    nonce (among ``runs``, the SuperLink's newest runs, when the caller has them) and record it;
    without one for longer than ``FRP_STALE_LAUNCH_SECONDS`` → back to QUEUED (the worker died
    before it started the run). RUNNING → finish the job when its run has finished; a run the
    SuperLink does not know fails the job. ``run`` is the run's status when the caller already read
    it. A SuperLink that does not answer is recorded (``superlink_unreachable``).
    """
    job = FederatedJob.objects.get(pk=job_id)
    if job.status == JobStatus.QUEUED:
        return job_launch(job_id=job_id)
    conn = superlink_connection()
    if job.status == JobStatus.LAUNCHING and not job.flower_run_id:
        try:
            found = _run_of(runs if runs is not None else superlink.runs_list(conn), job)
        except superlink.SuperLinkUnreachable as exc:
            superlink_unreachable(job_ids=[job_id], error=str(exc))
            return job
        except superlink.SuperLinkError as exc:
            log.warning("reconcile job %s: %s", job_id, exc)
            return job
        if found is not None:
            return job_run_record(
                job_id=job_id, run_id=found.run_id, nonce=job.launch_nonce, found=True
            )
        stale = timedelta(seconds=settings.FRP_STALE_LAUNCH_SECONDS)
        if job.started_at and timezone.now() - job.started_at > stale:
            with transaction.atomic():
                job = FederatedJob.objects.select_for_update().get(pk=job_id)
                if job.status == JobStatus.LAUNCHING and not job.flower_run_id:
                    job.status = JobStatus.QUEUED
                    job.status_detail = "launch did not finish; queued again"
                    job.launch_nonce = ""
                    job.save(update_fields=["status", "status_detail", "launch_nonce"])
        return job
    if job.status not in (JobStatus.RUNNING, JobStatus.LAUNCHING) or not job.flower_run_id:
        return job
    if run is None:
        try:
            run = superlink.run_status(conn, job.flower_run_id)
        except superlink.SuperLinkUnreachable as exc:
            superlink_unreachable(job_ids=[job_id], error=str(exc))
            return job
        except superlink.RunUnknown:
            return _job_finish(
                job_id=job_id,
                run=superlink.RunStatus(job.flower_run_id, "finished", "failed", "", {}),
                reason=f"The SuperLink no longer knows Flower run {job.flower_run_id} (it was "
                "restarted without its database).",
            )
        except superlink.SuperLinkError as exc:
            log.warning("reconcile job %s: %s", job_id, exc)
            return job
    if job.superlink_lost_at is not None:
        superlink_answered(job_ids=[job_id])
    if not run.is_finished:
        if job.preempt_requested_at is not None:  # the stop never reached the SuperLink
            preempt_stop_send(job_id=job_id, run_id=job.flower_run_id)
        return job
    if job.preempt_requested_at is not None and run.sub_status != "completed":
        return _job_preempted_requeue(job_id=job_id, run=run)
    return _job_finish(job_id=job_id, run=run)


def superlink_unreachable(*, job_ids: list[int], error: str) -> None:
    """The SuperLink did not answer: say so on each active job of ``job_ids`` from the first time,
    and fail the jobs it has not answered for longer than ``FRP_SUPERLINK_LOST_SECONDS``.

    The bound: a job ends FAILED at most ``FRP_SUPERLINK_LOST_SECONDS`` plus one reconcile
    interval after the SuperLink stopped answering (QUEUED jobs are not touched: they wait).
    """
    bound = float(settings.FRP_SUPERLINK_LOST_SECONDS)
    now = timezone.now()
    to_fail = []
    with transaction.atomic():
        for job in FederatedJob.objects.select_for_update().filter(
            pk__in=job_ids, status__in=[JobStatus.LAUNCHING, JobStatus.RUNNING]
        ):
            if job.superlink_lost_at is None:
                job.superlink_lost_at = now
                job.status_detail = (
                    f"The SuperLink is unreachable (no answer since {now:%H:%M:%S} UTC). "
                    f"The job fails if it does not answer within {bound:.0f} s."
                )
                job.save(update_fields=["superlink_lost_at", "status_detail"])
                audit_record(
                    by=None,
                    action="job.superlink_unreachable",
                    target=job,
                    institution=job.project.institution,
                    error=error[:500],
                )
            elif (now - job.superlink_lost_at).total_seconds() > bound:
                to_fail.append((job.pk, job.flower_run_id, job.superlink_lost_at))
    for pk, run_id, since in to_fail:
        _job_finish(
            job_id=pk,
            run=superlink.RunStatus(run_id, "finished", "failed", "", {}),
            reason=f"The SuperLink stopped answering at {since:%H:%M:%S} UTC and had not "
            f"answered {bound:.0f} s later, so the job was failed.",
        )


def superlink_answered(*, job_ids: list[int]) -> None:
    """The SuperLink answers again: clear the unreachable mark of ``job_ids`` (one UPDATE)."""
    FederatedJob.objects.filter(pk__in=job_ids, superlink_lost_at__isnull=False).update(
        superlink_lost_at=None, status_detail="the SuperLink answers again"
    )


def jobs_reconcile(*, batch: int = 50) -> int:
    """Reconcile up to ``batch`` active jobs, oldest first, with one listing of the SuperLink's
    newest runs (plus one request per older run still active); stop runs that carry a launch
    nonce no job holds. Returns how many jobs were looked at.

    Cost: one Control API request per tick in the common case (tens of milliseconds; see
    ``benchmarks/reconcile.py``) and a few queries per active job.
    """
    jobs = list(
        FederatedJob.objects.filter(status__in=JobStatus.active())
        .order_by("created_at")
        .values_list("pk", "status", "flower_run_id")[:batch]
    )
    conn = superlink_connection()
    asks = [pk for pk, status, run_id in jobs if run_id or status == JobStatus.LAUNCHING]
    statuses: dict[str, superlink.RunStatus] = {}
    try:
        # Read even with no active job: a run no job holds is stopped in any case.
        newest = superlink.runs_list(conn, limit=max(100, 2 * len(jobs)))
        if asks:
            statuses = superlink.runs_status(
                conn, [run_id for _, _, run_id in jobs if run_id], newest=newest
            )
    except superlink.SuperLinkUnreachable as exc:
        if asks:  # queued jobs wait: none is launched into a SuperLink that does not answer
            log.warning("reconcile: the SuperLink did not answer: %s", exc)
            superlink_unreachable(job_ids=asks, error=str(exc))
        return len(jobs)
    except superlink.SuperLinkError as exc:
        if jobs:
            log.warning("reconcile: the SuperLink refused: %s", exc)
        return len(jobs)
    if asks:
        superlink_answered(job_ids=asks)
    for pk, _, run_id in jobs:
        job_reconcile(job_id=pk, run=statuses.get(run_id), runs=newest)
    runs_orphans_stop(runs=newest)
    return len(jobs)


def runs_orphans_stop(*, runs: list[superlink.RunStatus]) -> list[str]:
    """Stop every unfinished run in ``runs`` that the portal started (it carries a launch nonce)
    but no job holds: not a job's recorded run, nor the run a LAUNCHING job is about to record.
    Returns the run ids stopped."""
    started = [r for r in runs if not r.is_finished and r.run_config.get("launch-nonce")]
    if not started:
        return []
    recorded = set(
        FederatedJob.objects.filter(flower_run_id__in=[r.run_id for r in started]).values_list(
            "flower_run_id", flat=True
        )
    )
    launching = set(
        FederatedJob.objects.filter(
            status=JobStatus.LAUNCHING,
            flower_run_id="",
            launch_nonce__in=[r.run_config["launch-nonce"] for r in started],
        ).values_list("launch_nonce", flat=True)
    )
    stopped = []
    for run in started:
        if run.run_id in recorded or run.run_config["launch-nonce"] in launching:
            continue
        job_id = run.run_config.get("job-id")
        run_orphan_stop(
            run_id=run.run_id,
            job_id=job_id if isinstance(job_id, int) else None,
            why="no job holds its launch nonce",
        )
        stopped.append(run.run_id)
    return stopped


@transaction.atomic
def _job_finish(
    *, job_id: int, run: superlink.RunStatus, reason: str | None = None
) -> FederatedJob:
    """End ``job_id`` as its run ended (``reason``: the portal's own reason for failing it)."""
    job = FederatedJob.objects.select_for_update().get(pk=job_id)
    if job.is_terminal:
        return job
    status = _FINAL.get(run.sub_status, JobStatus.FAILED)
    if status == JobStatus.COMPLETED and not job.final_metrics:
        status = JobStatus.FAILED
        job.status_detail = "the run finished without reporting final results to the portal"
    job.status = status
    job.finished_at = timezone.now()
    job.preempt_requested_at = None
    if run.usage:  # Flower's own per-run figures, for the usage cross-check
        job.final_metrics = {**job.final_metrics, "flower": run.usage}
    if reason:
        job.status_detail = reason
        job.failure_reason = job.failure_reason or reason
    elif status == JobStatus.COMPLETED:
        job.status_detail = f"Flower run {run.run_id} completed"
    elif status == JobStatus.FAILED and not job.status_detail.startswith("the run finished"):
        details = run.details.strip().rstrip(".")
        job.status_detail = _sentence(job.failure_reason) or (
            f"Flower run {run.run_id} failed" + (f": {details}." if details else ".")
        )
    else:
        job.status_detail = f"Flower run {run.run_id} {run.sub_status}"
    job.save(
        update_fields=[
            "status",
            "status_detail",
            "finished_at",
            "final_metrics",
            "failure_reason",
            "preempt_requested_at",
        ]
    )
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
    transaction.on_commit(partial(notifications.job_notify, job_id=job.pk), robust=True)
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
        if job.preempt_requested_at is not None:  # the user's stop wins: the run's end ends it
            job.preempt_requested_at = None
            job.save(update_fields=["preempt_requested_at"])
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


def _resume_privacy_charge(job: FederatedJob, rnd: int) -> None:
    """Charge a DP job (locked) for the rounds after checkpoint ``rnd`` that its failed run
    already released and its resumed run trains again: each was a noisy global model sent to
    every site and reported here, so the new run's rounds are further releases. Their ε
    (``privacy_budget.job_epsilon`` over those rounds) is added to ``job.epsilon`` (basic
    composition, as across jobs) with a ``privacy`` ledger leaf of figures. Raises ``JobError``
    with the figures when that would take a chosen dataset over the project's budget."""
    from django.db.models import Max

    from federation import privacy_budget
    from federation.privacy import PrivacyError
    from sandbox.models import PrivacyBudget

    if job.epsilon is None or (job.privacy or {}).get("dp", "off") == "off":
        return
    last = RoundMetric.objects.filter(job=job).aggregate(last=Max("round"))["last"] or 0
    again = last - rnd
    if again <= 0:
        return
    versions = [js.dataset_version for js in job.sites.select_related("dataset_version__dataset")]
    try:
        extra = privacy_budget.job_epsilon(job.privacy, num_rounds=again, sites=len(versions))
    except PrivacyError as exc:
        raise JobError(f"the job's privacy settings cannot be accounted: {exc}") from None
    list(
        PrivacyBudget.objects.select_for_update()
        .filter(project=job.project, dataset_id__in=[v.dataset_id for v in versions])
        .order_by("pk")
    )
    problems = privacy_budget.refusal(
        privacy_budget.budget_figures(project=job.project, versions=versions, epsilon=extra)
    )
    if problems:
        raise JobError(
            f"resuming trains {again} round(s) again, a further release: " + " ".join(problems)
        )
    job.epsilon = float(job.epsilon) + extra
    job.save(update_fields=["epsilon"])
    _ledger(
        "privacy",
        job=job.pk,
        project=job.project_id,
        datasets=sorted(v.dataset_id for v in versions),
        epsilon=repr(extra),
        delta=repr(float(job.privacy["delta"])),
        noise_multiplier=repr(float(job.privacy["noise_multiplier"])),
        rounds=again,
        sampling_rate="1.0",
        resumed_from_round=rnd,
    )


def _job_requeue(
    job: FederatedJob,
    *,
    rnd: int,
    active: list[str] | None,
    by,
    detail: str,
    **audit,
) -> None:
    """Queue ``job`` (locked, its run ended) again to resume from its round-``rnd`` checkpoint
    (``0``: from the start) with a new Flower run: the part of ``job_resume`` that the
    preemption's requeue (``_job_preempted_requeue``) shares.

    A DP job is charged the ε of the rounds it trains again (``_resume_privacy_charge``); then
    ``federation.signals.job_resumed`` is sent, before the ended run's metering and end are
    changed (accounting records that run's usage then). The earlier run id goes to
    ``earlier_runs``; rounds after ``rnd`` are deleted (the new run trains them again); the
    sites in ``active`` (every site when ``None``) are pending again; ``callback_seq`` starts
    again (the new run signs with its own key, so the old run's events cannot be replayed); the
    preemption mark is cleared. Audited as ``job.resume`` (``by``, plus ``audit``); the launch
    is queued on commit. Raises ``JobError`` (for the caller's transaction to roll back) when
    the ε charge or a receiver of ``job_resumed`` refuses.
    """
    _resume_privacy_charge(job, rnd)
    # Before the ended run's metering and end are changed: the floors above account for it
    # first (a receiver may refuse with JobError; the transaction then writes nothing).
    job_resumed.send(sender=FederatedJob, job=job, from_round=rnd)
    earlier = job.flower_run_id
    job.earlier_runs = [*job.earlier_runs, earlier] if earlier else list(job.earlier_runs)
    job.flower_run_id = ""
    job.launch_nonce = ""
    job.resume_round = rnd
    job.status = JobStatus.QUEUED
    job.status_detail = detail
    job.failure_reason = ""
    job.finished_at = None
    job.superlink_lost_at = None
    job.callback_seq = 0
    job.preempt_requested_at = None
    job.save(
        update_fields=[
            "earlier_runs",
            "flower_run_id",
            "launch_nonce",
            "resume_round",
            "status",
            "status_detail",
            "failure_reason",
            "finished_at",
            "superlink_lost_at",
            "callback_seq",
            "preempt_requested_at",
        ]
    )
    RoundMetric.objects.filter(job=job, round__gt=rnd).delete()
    SiteRoundMetric.objects.filter(job_site__job=job, round__gt=rnd).delete()
    for js in job.sites.select_related("site"):
        if active is None or js.site.slug in active:
            js.status = JobSiteStatus.PENDING
            js.last_error = ""
        js.rounds_completed = js.round_metrics.filter(ok=True).count()
        js.save(update_fields=["status", "last_error", "rounds_completed"])
    audit_record(
        by=by,
        action="job.resume",
        target=job,
        institution=job.project.institution,
        from_round=rnd,
        earlier_run=earlier,
        **audit,
    )
    transaction.on_commit(signature(JOB_LAUNCH_TASK, args=(job.pk,)).delay, robust=True)


def job_resume(*, by, job_id: int) -> FederatedJob:
    """Resume a FAILED job (its ServerApp crashed or was stopped mid-job) from its latest round
    checkpoint with a new Flower run; the job keeps its id, rounds and accounting.

    The checks are this function's; the requeue is ``_job_requeue``, shared with a preempted
    job's (ADR 0035). The job goes back to QUEUED with ``resume_round = k`` (the checkpoint's
    round, sent as the run-config key ``resume-round``: a number, not a secret); its earlier
    run id is kept in ``earlier_runs``; rounds after ``k`` (posted before the checkpoint was
    written) are deleted, as the new run trains them again; the sites still training at the
    checkpoint are pending again; ``callback_seq`` starts again (the new run signs with its own
    key, so the old run's events cannot be replayed). A DP job is charged the ε of the rounds it trains again
    (``_resume_privacy_charge``); then ``federation.signals.job_resumed`` is sent, before the
    failed run's metering and end are changed (accounting records the failed run's usage then).
    Audited as ``job.resume``; the launch is queued on commit. Raises ``JobError`` for a user who
    is not the job's submitter, a job that is not FAILED or has its final results, one with no
    checkpoint (or a model store that cannot be read), a DP job whose rounds trained again would
    exceed a dataset's ε budget (with the figures), or one a receiver of ``job_resumed`` refuses.
    """
    job = FederatedJob.objects.select_related("project").get(pk=job_id)
    if not can(by, "job.resume", job):
        raise JobError("only the job's submitter may resume it")
    try:
        rnd = artifacts.checkpoint_round(job)
        active = artifacts.checkpoint_active_sites(job, rnd) if rnd else []
    except artifacts.ArtifactError as exc:
        raise JobError(f"the job's checkpoints cannot be read: {exc}") from None
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job_id)
        if job.status != JobStatus.FAILED:
            raise JobError(f"only a failed job can be resumed; this one is {job.status}")
        if "rounds" in job.final_metrics:
            raise JobError("the job's training finished (its final results are recorded)")
        if not rnd:
            raise JobError(
                "the job has no round checkpoint to resume from (it failed before its first "
                "round was saved): submit it again"
            )
        _job_requeue(
            job,
            rnd=rnd,
            active=active,
            by=by,
            detail=f"queued to resume from the checkpoint after round {rnd}",
        )
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
    if job.status != JobStatus.COMPLETED or not artifacts.has_model(job):
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
    """A data steward of ``site``'s institution approves or refuses (with a reason) the release.
    A steward who asked for it, submitted the job or is in its project may refuse but not approve
    (``ReleaseError``: another steward of the site decides)."""
    release = (
        ModelRelease.objects.select_for_update().select_related("job__project").get(pk=release_id)
    )
    if not release.job.sites.filter(site=site).exists():
        raise ReleaseError("this site did not take part in the job")
    if not by.memberships.filter(institution=site.institution, role=Role.DATA_STEWARD).exists():
        raise ReleaseError("only a data steward of the site's institution decides")
    if approve and (
        by.pk in {release.requested_by_id, release.job.submitted_by_id}
        or can(by, "project.view", release.job.project)
    ):  # four eyes: nobody approves the output of their own project
        raise ReleaseError(
            "you are in this job's project, so you cannot approve its release: another data "
            "steward of the site decides"
        )
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
