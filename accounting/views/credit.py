"""Credit pages: a job's CRediT statement, its JSON and paragraph exports, and the PI's edit page.

Readable by the project's members, platform admins and the admins of the institutions involved
(``can(user, "credit.view", job)``; anybody else gets 404); editable by the project's PIs
(``credit.edit``; other readers get 403).
"""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounting import credit
from accounting.forms import CreditFormSet, credit_initial
from accounting.selectors import credit as selectors
from accounting.services import credit as services
from federation.models import FederatedJob
from portal.permissions import can


def _job_or_404(request, pk: int) -> FederatedJob:
    try:
        job = selectors.credit_job(user=request.user, pk=pk)
    except FederatedJob.DoesNotExist:
        raise Http404("No such job") from None
    if not can(request.user, "credit.view", job):
        raise Http404("No such job")
    return job


@login_required
def statement(request, pk: int):
    """The statement page: contributors, roles, shares, the paper paragraph and the exports."""
    job = _job_or_404(request, pk)
    view = selectors.credit_for_job(job=job)
    return render(
        request,
        "accounting/credit/statement.html",
        {
            "job": job,
            "credit": view,
            "can_edit": can(request.user, "credit.edit", job),
            # Admins of a data-providing institution see the credit, not the project's job page.
            "can_view_job": can(request.user, "job.view", job),
            "standard": credit.STANDARD,
        },
    )


@login_required
def statement_json(request, pk: int):
    """The statement as JSON (schema ``frp-credit/1``, see ``accounting.credit.statement_document``)."""
    job = _job_or_404(request, pk)
    body = json.dumps(selectors.credit_for_job(job=job).document(), ensure_ascii=False, indent=2)
    response = HttpResponse(body + "\n", content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="credit-job-{job.pk}.json"'
    return response


@login_required
def statement_text(request, pk: int):
    """The paper's contribution paragraph, then how the job was trained and credited (model,
    strategy, ε, SecAgg+, contribution method), as text/plain (UTF-8; ``credit.statement_text``)."""
    job = _job_or_404(request, pk)
    response = HttpResponse(
        selectors.credit_for_job(job=job).text, content_type="text/plain; charset=utf-8"
    )
    response["Content-Disposition"] = f'inline; filename="credit-job-{job.pk}.txt"'
    return response


@login_required
@require_POST
def statement_draft(request, pk: int):
    """Store the job's draft so the PI can edit it (PIs only), then go to the edit page."""
    job = _job_or_404(request, pk)
    if not can(request.user, "credit.edit", job):
        raise PermissionDenied("Only a principal investigator of the project edits its credit.")
    services.credit_statement_draft(job=job)
    return redirect("accounting:credit_edit", pk=job.pk)


@login_required
def statement_edit(request, pk: int):
    """The PI's edit page: one row per contributor (name, kind, roles, share in %)."""
    job = _job_or_404(request, pk)
    if not can(request.user, "credit.edit", job):
        raise PermissionDenied("Only a principal investigator of the project edits its credit.")
    view = selectors.credit_for_job(job=job)
    if view.statement is None:
        messages.info(request, "Create the draft first: it is what you will edit.")
        return redirect("accounting:credit_statement", pk=job.pk)
    initial = credit_initial(view.lines)
    formset = CreditFormSet(request.POST or None, initial=initial, prefix="c")
    if request.method == "POST" and formset.is_valid():
        try:
            services.credit_statement_update(
                by=request.user, statement=view.statement, contributors=formset.rows()
            )
        except services.CreditError as exc:
            formset.add_service_errors(exc)
        else:
            messages.success(request, "Credit statement saved.")
            return redirect("accounting:credit_statement", pk=job.pk)
    return render(
        request,
        "accounting/credit/edit.html",
        {"job": job, "credit": view, "formset": formset, "roles": credit.ROLES},
    )
