"""Accounting-step pages (ADR 0015): the jobs whose accounting failed, for platform admins (all)
and institution admins (their institutions' jobs; also as a tab of the institution's admin
pages), and the retry a POST asks for.

A job the user may not see the accounting of answers 404, like the other admin pages.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from accounting.selectors import steps as selectors
from accounting.services import steps as services
from federation.models import FederatedJob
from portal import selectors as portal_selectors
from portal.models import Institution
from portal.permissions import can

PAGE_SIZE = 25


def _page(request, jobs):
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    for job in page:
        job.steps_in_order = selectors.ordered_steps(job)
    return page


@login_required
def failures(request):
    """Every job whose accounting failed that the user administers (platform admins: all)."""
    if not request.user.is_staff and not (
        portal_selectors.administered_institutions(user=request.user).exists()
    ):
        raise Http404("No such page")
    jobs = selectors.jobs_with_failed_accounting(user=request.user)
    return render(
        request,
        "accounting/steps/failures.html",
        {"page_obj": _page(request, jobs), "institution": None},
    )


@login_required
def institution_failures(request, slug: str):
    """The institution's tab: its projects' and its sites' jobs whose accounting failed."""
    institution = get_object_or_404(Institution, slug=slug)
    if not can(request.user, "institution.admin", institution):
        raise Http404("No such institution")
    jobs = selectors.jobs_with_failed_accounting(user=request.user, institution=institution)
    return render(
        request,
        "accounting/steps/failures.html",
        {"page_obj": _page(request, jobs), "institution": institution, "tab": "accounting"},
    )


@login_required
@require_POST
def retry(request, pk: int):
    """Queue the job's accounting again (``job_accounting_retry``); back to ``next`` (a local
    URL) or the job page, with a message saying what was queued or why nothing was."""
    job = get_object_or_404(FederatedJob.objects.select_related("project"), pk=pk)
    if not can(request.user, "job.view_accounting", job):
        raise Http404("No such job")
    try:
        queued = services.job_accounting_retry(by=request.user, job=job)
    except services.AccountingError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"Accounting of job #{job.pk} queued again: {', '.join(queued)}.",
        )
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect("federation:job_detail", pk=job.pk)
    return redirect(target)
