"""Billing pages: a pool's price rules (institution admins), an institution's billing overview
with plots and invoices, an invoice's lines, and its CSV export.

Another institution's pages and invoices answer 404 (permission-scoped lookups), like the other
institution admin pages.
"""

from __future__ import annotations

import datetime as dt

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from accounting.billing_forms import PriceRuleForm
from accounting.runs import flower_run_id
from accounting.selectors import billing as selectors
from accounting.services import billing as services
from portal.models import Institution
from portal.permissions import can
from sandbox.export import csv_lines


def _institution_or_404(request, slug: str, action: str) -> Institution:
    institution = get_object_or_404(Institution, slug=slug)
    if not can(request.user, action, institution):
        raise Http404("No such institution")
    return institution


@login_required
def prices(request, slug: str):
    """The institution's pools with their price-rule history, and the form for a new rule."""
    institution = _institution_or_404(request, slug, "institution.admin")
    form = PriceRuleForm(request.POST or None, institution=institution)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        pool = data.pop("pool")
        if not can(request.user, "price.manage", pool):
            raise Http404("No such pool")
        try:
            rule = services.price_rule_create(by=request.user, pool=pool, **data)
        except services.BillingError as exc:
            for field, errors in exc.field_errors.items():
                for error in errors:
                    form.add_error(field if field in form.fields else None, error)
        else:
            messages.success(
                request,
                f"Price rule for {pool.name} from {rule.effective_from:%Y-%m-%d} saved.",
            )
            return redirect("accounting:institution_prices", slug=slug)
    return render(
        request,
        "accounting/billing/prices.html",
        {
            "institution": institution,
            "pools": selectors.institution_pools_with_rules(
                institution=institution, today=timezone.localdate()
            ),
            "form": form,
            "tab": "prices",
        },
    )


@login_required
def billing(request, slug: str):
    """Usage, charges, credits and net per month as plots; the invoices, 12 per page."""
    institution = _institution_or_404(request, slug, "invoice.view")
    today = timezone.localdate()
    invoices = selectors.institution_invoices(user=request.user, institution=institution)
    page = Paginator(invoices, 12).get_page(request.GET.get("page"))
    current = invoices.filter(month=services.month_start(today)).first()
    return render(
        request,
        "accounting/billing/billing.html",
        {
            "institution": institution,
            "series": selectors.institution_billing_series(institution=institution, today=today),
            "page_obj": page,
            "current": current,
            "currency": services.billing_currency(),
            "tab": "billing",
        },
    )


@login_required
def invoice_detail(request, pk: int):
    """One invoice: totals, energy and emissions, status, and its lines per job, site and kind
    (50 per page), each compute line with its time-of-use pieces."""
    invoice = get_object_or_404(selectors.invoices_for_user(user=request.user), pk=pk)
    page = Paginator(selectors.invoice_lines(invoice=invoice), 50).get_page(request.GET.get("page"))
    return render(
        request,
        "accounting/billing/invoice_detail.html",
        {
            "invoice": invoice,
            "institution": invoice.institution,
            "page_obj": page,
            "footprint": selectors.invoice_footprint(invoice=invoice),
            "show_runs": selectors.invoice_runs(invoice=invoice),
        },
    )


CSV_HEADER = [
    "invoice",
    "institution",
    "month",
    "status",
    "entry",
    "job",
    "job_title",
    "project",
    "project_institution",
    "site",
    "site_institution",
    "kind",
    "service_units",
    "price_per_unit",
    "amount",
    "signed_amount",
    "currency",
    "job_finished_at",
    "energy_kwh",
    "emissions_g",
    "run",
    "flower_run",
]


def invoice_csv_rows(invoice):
    """The CSV rows of ``invoice``: one per entry, in ``CSV_HEADER`` order. ``signed_amount`` is
    +amount for charges and −amount for credits, so the column sums to the invoice's total;
    ``run`` / ``flower_run``: the job's run the line belongs to (1 unless the job was resumed,
    ADR 0028) and its Flower run id."""
    for e in selectors.invoice_lines(invoice=invoice):
        charge = e.kind in services.CHARGE_KINDS
        yield [
            invoice.pk,
            invoice.institution.name,
            invoice.month.strftime("%Y-%m"),
            invoice.status,
            e.pk,
            e.job_id,
            e.job.title,
            e.job.project.title,
            e.job.project.institution.name,
            e.site.slug,
            e.site.institution.name,
            e.kind,
            e.service_units,
            e.price_rule.price_per_unit if e.price_rule else None,
            e.amount,
            e.amount if charge else -e.amount,
            e.currency,
            _iso(e.job.finished_at),
            e.energy_kwh,
            e.emissions_g,
            e.run,
            flower_run_id(e.job, e.run),
        ]


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


@login_required
def invoice_csv(request, pk: int):
    """The invoice's lines as CSV (text cells neutralised against formula injection)."""
    invoice = get_object_or_404(selectors.invoices_for_user(user=request.user), pk=pk)
    response = StreamingHttpResponse(
        csv_lines(invoice_csv_rows(invoice), header=CSV_HEADER),
        content_type="text/csv; charset=utf-8",
    )
    name = f"invoice-{invoice.institution.slug}-{invoice.month:%Y-%m}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
