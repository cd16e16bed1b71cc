"""Views of federated jobs: list, submit form, detail with live progress, stop, ServerApp callback,
and the airlock (release request, a steward's decision, the released model)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import DatabaseError
from django.forms.utils import ErrorDict
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from federation import artifacts, callbacks, exporters, method, selectors, services
from federation.forms import JobScheduleForm, JobSubmitForm
from federation.models import FederatedJob, JobStatus, ModelRelease, ReleaseStatus
from federation.pool_selectors import REASONS
from federation.privacy_forms import JobPrivacyForm
from frp_flwr import contract
from frp_flwr.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, SignatureError, verify
from portal import panels
from portal.models import Site
from portal.permissions import can


@login_required
def job_list(request):
    """The user's jobs, 20 per page."""
    page = Paginator(selectors.jobs_for_user(user=request.user), 20).get_page(
        request.GET.get("page")
    )
    page.object_list = selectors.accuracy_shown(page.object_list, user=request.user)
    return render(request, "federation/job_list.html", {"page_obj": page})


def _quiet(form):
    """A bound form shown again without its errors (a refresh of its columns table)."""
    form._errors = ErrorDict()
    form.cleaned_data = {}
    return form


@login_required
def job_create(request):
    """The job submission form; errors from ``job_submit`` appear inline on their fields.

    A post with ``refresh`` (the "Show columns" button), or whose columns table was drawn for
    other datasets than it chose, only redraws the form with the chosen datasets' columns.
    """
    form = JobSubmitForm(request.POST or None, user=request.user)
    sched = JobScheduleForm(request.POST or None)
    pform = JobPrivacyForm(request.POST or None)
    refresh = "refresh" in request.POST or "privacy_preview" in request.POST
    if request.method == "POST" and (refresh or form.table_stale):
        context = {"form": _quiet(form), "sched": _quiet(sched), "pform": _quiet(pform)}
        if "privacy_preview" in request.POST:  # the no-JavaScript path of the ε preview
            context["preview"] = _privacy_preview(request)
        return render(request, "federation/job_form.html", context)
    valid = [f.is_valid() for f in (form, sched, pform)]
    if request.method == "POST" and all(valid):
        data = form.cleaned_data
        try:
            job = services.job_submit(
                by=request.user,
                project=data["project"],
                dataset_versions=list(data["datasets"]),
                title=data["title"],
                target_column=data["target_column"],
                feature_columns=data["feature_columns"],
                preprocessing=data["preprocessing"],
                num_rounds=data["num_rounds"],
                local_epochs=data["local_epochs"],
                learning_rate=data["learning_rate"],
                secure_aggregation=data.get("secure_aggregation", False),
                schedule=sched.cleaned_data,
                model=data["model"],
                strategy=data["strategy"],
                privacy=pform.privacy(),
            )
        except services.JobError as exc:
            for field, errors in exc.field_errors.items():
                for error in errors:
                    target = next((f for f in (form, sched, pform) if field in f.fields), form)
                    target.add_error(field if field in target.fields else None, error)
            if not exc.field_errors:
                form.add_error(None, str(exc))
        else:
            messages.success(request, f"Job #{job.pk} queued.")
            return redirect("federation:job_detail", pk=job.pk)
    context = {"form": form, "sched": sched, "pform": pform}
    if request.method == "POST":  # the ε of the posted settings, shown with the errors
        context["preview"] = _privacy_preview(request)
    return render(request, "federation/job_form.html", context)


def _privacy_preview(request) -> dict:
    """The ε the job form's privacy settings give, and the chosen datasets' budget lines
    (``federation.privacy_budget``); ``error`` when the settings cannot be accounted."""
    from federation import privacy_budget
    from federation.privacy import PrivacyError

    form = JobSubmitForm(request.POST, user=request.user)
    pform = JobPrivacyForm(request.POST)
    form.is_valid()
    if not pform.is_valid():
        return {"error": "Correct the privacy settings to see their ε."}
    privacy = pform.privacy()
    if privacy["dp"] == "off":
        return {"off": True}
    data = form.cleaned_data
    versions = list(data.get("datasets") or [])
    rounds = data.get("num_rounds") or form.fields["num_rounds"].initial
    sites = len(versions) or services.MIN_SITES
    try:
        epsilon = privacy_budget.job_epsilon(privacy, num_rounds=rounds, sites=sites)
    except PrivacyError as exc:
        return {"error": str(exc)}
    figures = []
    if data.get("project") is not None and versions:
        figures = privacy_budget.budget_figures(
            project=data["project"], versions=versions, epsilon=epsilon
        )
    return {
        "epsilon": epsilon,
        "delta": privacy["delta"],
        "text": method.epsilon_text(epsilon, privacy["delta"]),
        "rounds": rounds,
        "sites": sites,
        "sites_chosen": bool(versions),
        "figures": figures,
    }


@login_required
@require_POST
def job_privacy(request):
    """HTMX partial: the ε the job form's privacy settings give, before submission."""
    return render(
        request, "federation/partials/job_privacy.html", {"preview": _privacy_preview(request)}
    )


@login_required
@require_POST
def job_estimate(request):
    """HTMX partial: the estimated start, end, cost and emissions of the job being filled in,
    for each schedule policy, as the scheduler would plan it now (writes nothing)."""
    form = JobSubmitForm(request.POST, user=request.user)
    sched = JobScheduleForm(request.POST)
    form.is_valid()
    sched.is_valid()
    data, when = form.cleaned_data, sched.cleaned_data
    versions = list(data.get("datasets") or [])
    project = data.get("project")
    estimates = None
    if project is not None and versions and sched.is_valid():
        estimates = selectors.job_estimates(
            project=project,
            versions=versions,
            num_rounds=data.get("num_rounds") or 5,
            local_epochs=data.get("local_epochs") or 5,
            schedule=when,
            model=data.get("model_kind") or "linear",
        )
    return render(
        request,
        "federation/partials/job_estimate.html",
        {"estimates": estimates, "chosen": when.get("policy", "asap")},
    )


@login_required
@require_POST
def job_columns(request):
    """The columns table of the job form for the datasets ticked so far (HTMX partial)."""
    form = _quiet(JobSubmitForm(request.POST, user=request.user))
    return render(request, "federation/partials/job_columns.html", {"form": form})


def _job_or_404(request, pk: int) -> FederatedJob:
    try:
        job = selectors.job_detail(user=request.user, pk=pk)
    except FederatedJob.DoesNotExist:
        raise Http404("No such job") from None
    if not can(request.user, "job.view", job):
        raise Http404("No such job")
    return job


def _resume_round(job) -> int:
    """The round a failed job would resume from (its latest checkpoint), 0 when it cannot be
    resumed: not failed, its training finished, no checkpoint, or the model store unreadable."""
    if job.status != "failed" or "rounds" in (job.final_metrics or {}):
        return 0
    try:
        return artifacts.checkpoint_round(job)
    except artifacts.ArtifactError:
        return 0


@login_required
def job_detail(request, pk: int):
    """The job page; the progress panel below refreshes itself (HTMX) while the job is active."""
    job = _job_or_404(request, pk)
    release = getattr(job, "release", None)
    context = {
        "job": job,
        "can_stop": can(request.user, "job.stop", job),
        "can_resume": job.status == "failed" and can(request.user, "job.resume", job),
        "resume_round": _resume_round(job),
        "is_member": can(request.user, "project.view", job.project),
        "has_model": artifacts.has_model(job),
        "release": release,
        "release_waiting": selectors.release_waiting_sites(job=job, release=release),
        "energy": selectors.job_energy(job=job) if job.started_at else [],
        "schedule_reason_text": REASONS.get(job.sched_reason, ""),
        "results": selectors.job_results(job=job, user=request.user),
        "currency": settings.FRP_BILLING_CURRENCY,  # of the schedule card's estimated cost
        # Queued: the sites whose steward has not opted in to Shapley values now (ADR 0036);
        # the next launch records what the run goes by
        "shapley_missing": (
            selectors.shapley_not_opted_in(job=job) if job.status == JobStatus.QUEUED else []
        ),
    }
    context.update(selectors.job_progress(job=job, user=request.user))
    return render(request, "federation/job_detail.html", context)


@login_required
def job_progress(request, pk: int):
    """The progress panel alone (HTMX partial)."""
    job = _job_or_404(request, pk)
    context = {
        "job": job,
        "can_stop": can(request.user, "job.stop", job),
        "results": selectors.job_results(job=job, user=request.user),
    }
    context.update(selectors.job_progress(job=job, user=request.user))
    return render(request, "federation/partials/job_progress.html", context)


@login_required
def job_progress_json(request, pk: int):
    """Progress as JSON (chart series, per-site rows) for scripts and the chart, plus the sections
    the floors above add (``portal.panels`` slot ``job_progress``: accounting's ``accounting``)."""
    job = _job_or_404(request, pk)
    progress = selectors.job_progress(job=job, user=request.user)
    return JsonResponse(
        {
            "id": job.pk,
            "status": job.status,
            "status_detail": job.status_detail,
            "terminal": job.is_terminal,
            "num_rounds": job.num_rounds,
            "rounds_done": len(progress["rounds"]),
            "chart": progress["chart"],
            "sites_lost": progress["lost"],
            "final_metrics": selectors.public_final_metrics(progress["final_metrics"]),
            "results": selectors.job_results(job=job, user=request.user)["chart"],
            **panels.sections("job_progress", request=request, job=job),  # accounting's, …
            "sites": [
                {
                    "site": s.site.slug,
                    "institution": s.site.institution.name,
                    "status": s.status,
                    "rounds_completed": s.rounds_completed,
                    # exact for the site's own stewards, else the disclosure rule ("≈150")
                    "train_examples": s.train_rows if s.last_round else 0,
                    "eval_examples": s.test_rows if s.last_round else 0,
                    # as the viewer may see it (federation.disclosure, issue 9)
                    "eval_accuracy": s.accuracy,
                    "error": s.last_error,
                    "lost_in_round": s.lost_round,
                }
                for s in progress["sites"]
            ],
        }
    )


@login_required
@require_POST
def job_stop(request, pk: int):
    """Stop a job (submitter or the project's PI)."""
    job = _job_or_404(request, pk)
    try:
        services.job_stop(by=request.user, job_id=job.pk)
    except services.JobError as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, "Stop requested.")
    return redirect("federation:job_detail", pk=job.pk)


@login_required
@require_POST
def job_release_request(request, pk: int):
    """Ask the participating sites' stewards to let the final model out (airlock)."""
    job = _job_or_404(request, pk)
    try:
        services.release_request(by=request.user, job=job)
    except services.ReleaseError as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, "Release requested from the participating sites' data stewards.")
    return redirect("federation:job_detail", pk=job.pk)


def _released_job(request, pk: int) -> FederatedJob:
    """The job whose released model ``request.user`` may take: a member of its project, after
    the airlock approved (404 otherwise, before approval too)."""
    job = _job_or_404(request, pk)
    if not can(request.user, "project.view", job.project):  # released to the project only
        raise Http404("The model is released to the job's project")
    release = getattr(job, "release", None)
    if release is None or release.status != ReleaseStatus.APPROVED:
        raise Http404("The model has not been released")
    return job


def _model_payload(job: FederatedJob) -> dict:
    try:
        payload = artifacts.model_payload(job)
    except artifacts.ArtifactError as exc:
        raise Http404(f"The model cannot be read from the model store: {exc}") from None
    if payload is None:
        raise Http404("The job has no final model")
    return payload


@login_required
def job_model_download(request, pk: int):
    """The final model (JSON: classes, features, weights) once the airlock has released it."""
    job = _released_job(request, pk)
    if job.is_trees:  # no booster reaches the portal yet (federation.exporters)
        raise Http404(f"No model file: {exporters.TREES_NOT_EXPORTABLE}")
    payload = _model_payload(job)
    body = {
        "job": job.pk,
        "model": (
            "linear regression, standardised features and target"
            if job.task == "regression"
            else "multinomial logistic regression (softmax), standardised features"
        ),
        "features": job.feature_columns,
        "preprocessing": payload.get("preprocessing") or job.preprocessing,
        "classes": payload.get("classes", []),
        "weights": payload.get("weights", []),
        "federated_test_accuracy": job.final_metrics.get("eval_accuracy"),
    }
    response = JsonResponse(body)
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-model.json"'
    return response


@login_required
def job_model_skops(request, pk: int):
    """The released model as a ``.skops`` file: a scikit-learn Pipeline on the raw columns
    (``federation.exporters``; ADR 0026). 404 before the airlock approved it."""
    job = _released_job(request, pk)
    _model_payload(job)
    try:
        data = artifacts.skops_bytes(job)
    except (artifacts.ExportError, artifacts.ArtifactError) as exc:
        raise Http404(f"The model cannot be exported: {exc}") from None
    response = HttpResponse(data, content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-model.skops"'
    return response


@login_required
def job_model_card(request, pk: int):
    """The model card of a completed job (members of its project; the file itself only after
    the airlock); ``?format=json`` downloads it."""
    job = _job_or_404(request, pk)
    if not can(request.user, "project.view", job.project) or not artifacts.has_model(job):
        raise Http404("No model card")
    card = artifacts.model_card(job)
    if request.GET.get("format") == "json":
        response = JsonResponse(card, json_dumps_params={"indent": 2})
        response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-model-card.json"'
        return response
    release = getattr(job, "release", None)
    released = release is not None and release.status == ReleaseStatus.APPROVED
    rows = (card.get("metrics") or {}).get("eval_examples")
    # the sum of the sites' released counts: shown as approximate, as on the job page
    starts_with_number = str(rows)[:1].isdigit() and rows not in (0, "0")
    examples = f"≈{rows}" if rows is not None and starts_with_number else rows
    return render(
        request,
        "federation/model_card.html",
        {"job": job, "card": card, "released": released, "examples_shown": examples},
    )


@login_required
@require_POST
def job_resume(request, pk: int):
    """Resume a failed job from its latest round checkpoint (the job's submitter)."""
    job = _job_or_404(request, pk)
    try:
        services.job_resume(by=request.user, job_id=job.pk)
    except services.JobError as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, "The job is queued to resume from its latest round checkpoint.")
    return redirect("federation:job_detail", pk=job.pk)


def _refuse(status: int, error: str) -> JsonResponse:
    return JsonResponse(contract.CallbackAnswer(ok=False, error=error).to_json(), status=status)


@csrf_exempt  # authenticated by the run's HMAC signature instead of a session
@require_POST
def job_callback(request, pk: int):
    """Signed events from the job's ServerApp (``frp_flwr.signing``, ``frp_flwr.contract``).

    403 for a bad signature, 413 for a body over ``contract.MAX_EVENT_BYTES``, 400 for a body
    that does not fit the contract (or a value the database cannot hold), 409 for an event the job refuses (not running, replayed,
    replacing final results), 503 while the model store cannot take the final model, or the job's Flower run id is not recorded yet (the
    ServerApp retries). Nothing is written unless the answer is 200.
    """
    job = get_object_or_404(FederatedJob, pk=pk)
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return _refuse(400, "malformed Content-Length")
    if length > contract.MAX_EVENT_BYTES:
        return _refuse(413, f"body larger than {contract.MAX_EVENT_BYTES} bytes")
    if not job.flower_run_id:
        response = _refuse(503, "the portal has not recorded this job's Flower run yet")
        response["Retry-After"] = "1"
        return response
    try:
        key = callbacks.run_key(job_id=job.pk, run_id=job.flower_run_id)
    except callbacks.CallbackKeyError as exc:
        return _refuse(503, f"the portal cannot verify callbacks: {exc}")
    try:
        verify(
            key,
            request.body,
            timestamp=request.headers.get(TIMESTAMP_HEADER),
            signature=request.headers.get(SIGNATURE_HEADER),
        )
    except SignatureError as exc:
        return _refuse(403, str(exc))
    try:
        seq, event = contract.parse_event(request.body)
    except contract.ContractError as exc:
        return _refuse(400, f"malformed event: {exc}")
    try:
        answer = services.job_callback_record(job_id=job.pk, seq=seq, event=event)
    except services.JobError as exc:
        return _refuse(409, str(exc))
    except artifacts.ArtifactError as exc:  # the model store is away: the ServerApp retries
        return _refuse(503, f"the portal cannot store the model yet: {exc}")
    except DatabaseError as exc:  # a value the database cannot hold: rolled back, refused
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return _refuse(400, f"the event does not fit the portal's database: {reason}")
    return JsonResponse(answer.to_json())


@login_required
def supernodes(request):
    """Every SuperNode's state as the SuperLink reports it (platform admins only)."""
    if not request.user.is_staff:
        raise Http404("No such page")
    context = selectors.supernode_states()
    context["federation"] = settings.FRP_FEDERATION_NAME
    return render(request, "federation/supernodes.html", context)


@login_required
@require_POST
def release_decide(request, pk: int):
    """A data steward approves or refuses a model release for one of their sites (airlock)."""
    release = get_object_or_404(ModelRelease, pk=pk)
    site_id = request.POST.get("site", "")
    if not site_id.isdigit():  # a junk id is "no such site", not a 500
        raise Http404("No such site")
    site = get_object_or_404(Site, pk=int(site_id), job_sites__job=release.job)
    if not can(request.user, "access.decide", site):
        raise Http404("No such release")  # only the participating sites' stewards see it
    try:
        services.release_decide(
            by=request.user,
            release_id=pk,
            site=site,
            approve=request.POST.get("decision") == "approve",
            reason=request.POST.get("reason", ""),
        )
    except services.ReleaseError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Airlock decision recorded.")
    return redirect("sandbox:steward_queue")
