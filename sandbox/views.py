"""Views of the sandbox: dataset catalogue with profiles, dataset upload, access requests, the
steward's queue (where the floors above add panels: the airlock's pending releases)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.files.uploadhandler import StopUpload, TemporaryFileUploadHandler
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_POST

from portal.middleware import own_body_limit
from portal.models import Role
from portal.permissions import can
from sandbox import selectors, services
from sandbox.forms import (
    AccessRequestForm,
    DatasetRulesForm,
    DatasetUploadForm,
    DecisionForm,
    PrivacyBudgetForm,
)
from sandbox.models import AccessRequest, AccessStatus, Dataset


@login_required
def dataset_list(request):
    """The catalogue: every institution's datasets, metadata only, 25 per page."""
    q = request.GET.get("q", "").strip()
    page = Paginator(selectors.dataset_catalogue(q=q), 25).get_page(request.GET.get("page"))
    stewarded = selectors.stewarded_institution_ids(user=request.user)
    return render(
        request,
        "sandbox/dataset_list.html",
        {"page_obj": page, "q": q, "can_upload": bool(stewarded), "stewarded": stewarded},
    )


@login_required
def dataset_detail(request, pk: int):
    """A dataset's suppressed profile (what researchers see before asking) and the request form."""
    dataset = get_object_or_404(Dataset.objects.select_related("site__institution"), pk=pk)
    form = AccessRequestForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            services.access_request_submit(
                by=request.user,
                dataset=dataset,
                project=form.cleaned_data["project"],
                purpose=form.cleaned_data["purpose"],
            )
        except services.AccessError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, "Request sent to the data steward.")
            return redirect("sandbox:dataset_detail", pk=pk)
    mine = AccessRequest.objects.filter(
        dataset=dataset, project__memberships__user=request.user
    ).select_related("project")
    versions = list(selectors.dataset_versions(dataset=dataset))
    # A schema may have up to FRP_MAX_COLUMNS columns: the profile is shown a page at a time.
    profile_columns = (versions[0].profile or {}).get("columns", []) if versions else []
    columns_page = Paginator(profile_columns, settings.FRP_PROFILE_PAGE_COLUMNS).get_page(
        request.GET.get("columns")
    )
    return render(
        request,
        "sandbox/dataset_detail.html",
        {
            "dataset": dataset,
            "version": versions[0] if versions else None,
            "versions": versions,
            "columns_page": columns_page,
            "form": form,
            "requests": mine,
            # No project, nothing to request for: the form is replaced by a line saying so
            "can_request": form.fields["project"].queryset.exists(),
            "can_upload": selectors.can_upload_to(user=request.user, site=dataset.site),
            # The dataset's own stewards see exact row counts and sizes; everyone else sees them
            # under the profile's disclosure rule (a 3-row dataset is "≤7 rows").
            "exact": dataset.site.institution_id
            in selectors.stewarded_institution_ids(user=request.user),
            "rules_form": DatasetRulesForm(
                initial={
                    "auto_release": dataset.auto_release,
                    "shapley_opt_in": dataset.shapley_opt_in,
                }
            )
            if can(request.user, "access.decide", dataset)
            else None,
        },
    )


@login_required
@require_POST
def dataset_rules(request, pk: int):
    """A data steward saves the dataset's standing rules (airlock auto-release, Shapley opt-in);
    404 for a dataset that does not exist, 403 for anyone but its institution's stewards."""
    dataset = get_object_or_404(Dataset.objects.select_related("site__institution"), pk=pk)
    if not can(request.user, "access.decide", dataset):
        raise PermissionDenied("Only the dataset's data stewards set its rules.")
    form = DatasetRulesForm(request.POST)
    if not form.is_valid():  # a scripted body with a box neither "on" nor absent
        errors = "; ".join(f"{name}: {' '.join(e)}" for name, e in form.errors.items())
        return HttpResponseBadRequest(
            f"Dataset rules not saved: {errors}", content_type="text/plain"
        )
    services.dataset_rules_set(
        by=request.user,
        dataset=dataset,
        auto_release=form.cleaned_data.get("auto_release", False),
        shapley_opt_in=form.cleaned_data.get("shapley_opt_in", False),
    )
    messages.success(request, "Dataset rules saved.")
    return redirect("sandbox:dataset_detail", pk=pk)


class _LimitedUploadHandler(TemporaryFileUploadHandler):
    """Streams the file to a temporary file and stops at ``settings.FRP_MAX_UPLOAD_BYTES``."""

    def __init__(self, request=None):
        super().__init__(request)
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > settings.FRP_MAX_UPLOAD_BYTES:
            self.request.upload_too_large = True
            raise StopUpload(connection_reset=True)
        return super().receive_data_chunk(raw_data, start)


def _upload_limit_message() -> str:
    from django.template.defaultfilters import filesizeformat

    return (
        f"The file is larger than the upload limit of {filesizeformat(settings.FRP_MAX_UPLOAD_BYTES)}"
        " (FRP_MAX_UPLOAD_BYTES); nothing was stored. Ingest larger files on the site's host "
        "with manage.py dataset_ingest."
    )


@login_required
@csrf_exempt  # the CSRF check runs in _dataset_upload, after the upload handler is chosen
@own_body_limit  # refuses a body larger than FRP_MAX_UPLOAD_BYTES itself, with its form
def dataset_upload(request):
    """A data steward uploads a CSV as a new dataset or a new version (site beside the portal).

    The file is streamed to a temporary file on disk (never held in memory whatever its size) and
    stops at ``FRP_MAX_UPLOAD_BYTES``: a body declared larger is refused before it is read, one
    that grows larger is cut off while streaming; either way the form says which limit. Ingested
    and registered by ``services.dataset_ingest`` (which bounds columns and line length); the
    temporary file is deleted at the end of the request. 403 for anyone who is not a data steward.
    """
    if not selectors.is_steward(user=request.user):
        raise PermissionDenied("Only data stewards upload datasets.")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    request.upload_too_large = False
    if request.method == "POST" and declared > settings.FRP_MAX_UPLOAD_BYTES:
        return _upload_refused(request)  # before a byte of the body is read (nothing changes)
    request.upload_handlers = [_LimitedUploadHandler(request)]
    return _dataset_upload(request)


def _upload_refused(request):
    sites = selectors.upload_sites(user=request.user)
    form = DatasetUploadForm(sites=sites, datasets=Dataset.objects.filter(site__in=sites))
    context = {"form": form, "sites": sites, "limit_error": _upload_limit_message()}
    return render(request, "sandbox/dataset_upload.html", context, status=413)


@csrf_protect
def _dataset_upload(request):
    sites = selectors.upload_sites(user=request.user)
    if request.method == "POST" and request.upload_too_large:  # cut off while streaming
        return _upload_refused(request)
    datasets = Dataset.objects.filter(site__in=sites).select_related("site").order_by("title")
    initial = {}
    wanted = request.GET.get("dataset", "") if request.method == "GET" else ""
    if wanted.isascii() and wanted.isdigit() and len(wanted) <= 18:  # a key, or no dataset
        chosen = datasets.filter(pk=int(wanted)).first()
        if chosen is not None:
            initial = {"dataset": chosen.pk, "site": chosen.site_id}
    form = DatasetUploadForm(
        request.POST or None,
        request.FILES or None,
        sites=sites,
        datasets=datasets,
        initial=initial,
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            dv = services.dataset_ingest(
                by=request.user,
                site=data["site"],
                path=data["file"].temporary_file_path(),
                slug=data["slug"],
                title=data["title"],
                description=data["description"],
                encoding=data["encoding"] or None,
                delimiter=data["delimiter"] or None,
                missing_values=data["missing_values"],
                schema_override=data["types"] or None,
            )
        except services.IngestError as exc:
            form.add_error("file", f"{data['file'].name}: {exc}")
        except (services.DatasetError, services.KeyringError, services.StorageError) as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Version {dv.version} of {dv.dataset.title} registered: {dv.row_count} rows.",
            )
            for warning in getattr(dv, "ingest_warnings", ()):
                messages.warning(request, warning)
            change = selectors.schema_change(version=dv)
            if change:
                messages.warning(
                    request,
                    f"Version {dv.version} has a different schema from version {dv.version - 1} "
                    f"({change}): jobs and grants that expect the old columns may not fit it.",
                )
            return redirect("sandbox:dataset_detail", pk=dv.dataset_id)
    return render(request, "sandbox/dataset_upload.html", {"form": form, "sites": sites})


@login_required
def steward_queue(request):
    """The data steward's access requests: pending first, then decided."""
    if not request.user.memberships.filter(role=Role.DATA_STEWARD).exists():
        raise Http404("Only data stewards have a request queue")
    status = request.GET.get("status", AccessStatus.PENDING)
    if status not in AccessStatus.values:
        status = AccessStatus.PENDING
    page = Paginator(selectors.steward_requests(user=request.user, status=status), 25).get_page(
        request.GET.get("page")
    )
    page.object_list = list(page.object_list)  # one query; the rows carry their budgets
    budgets = selectors.budgets_for_requests(page.object_list)
    for access in page.object_list:
        access.epsilon_budget = budgets.get(access.pk)
    return render(
        request,
        "sandbox/steward_queue.html",
        {
            "page_obj": page,
            "status": status,
            "statuses": AccessStatus.choices,
            "form": DecisionForm(),
        },
    )


def _steward_request_or_404(request, pk: int) -> AccessRequest:
    access = get_object_or_404(AccessRequest.objects.select_related("dataset__site"), pk=pk)
    if not can(request.user, "access.decide", access.dataset):
        raise Http404("No such request")
    return access


@login_required
@require_POST
def request_decide(request, pk: int):
    access = _steward_request_or_404(request, pk)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, error)
    else:
        try:
            services.access_request_decide(
                by=request.user,
                request_id=access.pk,
                approve=form.cleaned_data["decision"] == "approve",
                expires_at=form.expires_at,
                reason=form.cleaned_data["reason"],
            )
        except services.AccessError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, "Decision recorded.")
    return redirect("sandbox:steward_queue")


@login_required
@require_POST
def grant_revoke(request, pk: int):
    access = _steward_request_or_404(request, pk)
    try:
        services.access_grant_revoke(
            by=request.user, request_id=access.pk, reason=request.POST.get("reason", "")
        )
    except services.AccessError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Grant revoked; running jobs drop this site at their next round.")
    return redirect(f"{reverse('sandbox:steward_queue')}?status={AccessStatus.APPROVED}")


@login_required
@require_POST
def privacy_budget_set(request, pk: int):
    """Set the ε budget of an approved grant's project and dataset (the steward's queue)."""
    access = _steward_request_or_404(request, pk)
    form = PrivacyBudgetForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, f"ε budget: {error}")
    else:
        try:
            services.privacy_budget_set(
                by=request.user, request_id=access.pk, epsilon=form.cleaned_data["epsilon"]
            )
        except services.AccessError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, "ε budget saved.")
    return redirect(f"{reverse('sandbox:steward_queue')}?status={AccessStatus.APPROVED}")
