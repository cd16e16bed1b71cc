"""Reads of billing: invoices a user may see, an institution's monthly series, a job's cost.

Permission scoping happens here (``portal.permissions.can``): ``invoices_for_user`` returns only
invoices of institutions the user administers, so a view's ``get_object_or_404`` answers 404 for
another institution's invoice. Money stays ``Decimal``; chart series are converted to ``float``
only at the edge (``institution_billing_series``), for Chart.js.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import (
    Count,
    DateField,
    ExpressionWrapper,
    F,
    FloatField,
    OuterRef,
    Prefetch,
    Q,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, TruncMonth
from django.utils import timezone

from accounting.models import BillingEntry, BillingKind, Invoice, PriceRule, UsageRecord
from accounting.runs import flower_run_id, runs_of
from accounting.selectors.contribution import whole_run_shares
from accounting.services.billing import CHARGE_KINDS, month_start, next_month
from federation.models import ComputePool, FederatedJob
from federation.selectors import JOB_WIDE_FIELDS
from portal import selectors as portal_selectors
from portal.models import Project, Site
from portal.permissions import can

SECONDS_PER_HOUR = 3600


def invoices_for_user(*, user):
    """Invoices of the institutions ``user`` administers (all for platform admins), newest
    month first, institution joined, with ``lines`` (entry count) annotated."""
    institutions = portal_selectors.administered_institutions(user=user)
    return (
        Invoice.objects.filter(institution__in=institutions)
        .select_related("institution")
        .annotate(
            lines=Coalesce(
                Subquery(
                    BillingEntry.objects.filter(invoice=OuterRef("pk"))
                    .order_by()
                    .values("invoice")
                    .annotate(n=Count("*"))
                    .values("n")
                ),
                0,
            )
        )
        .order_by("-month", "institution__name")
    )


def institution_invoices(*, user, institution):
    """The institution's invoices (``invoices_for_user`` narrowed); empty when ``user`` may not
    view them."""
    if not can(user, "invoice.view", institution):
        return Invoice.objects.none()
    return invoices_for_user(user=user).filter(institution=institution)


def invoice_runs(*, invoice) -> bool:
    """Whether a line of ``invoice`` belongs to a job with more than one run (its page then
    shows each line's run). One query."""
    runs = (
        FederatedJob.objects.filter(billing_entries__invoice=invoice)
        .order_by()  # DISTINCT over the runs only, not the ordering's columns too
        .values_list("earlier_runs", flat=True)
    )
    return any(runs.distinct())


def invoice_lines(*, invoice):
    """The invoice's entries with job, project, site and price rule joined and the institutions
    (the project's, the site's, the entry's) prefetched, ordered by job, site, kind (four
    queries: PostgreSQL took 10–17 ms to plan the seven joins, 1–2 ms for four; the index on
    invoice and job walks the lines in order, issue 12). The job's wide columns but its runs are
    deferred (the lines show its title, project, finish and run)."""
    return (
        BillingEntry.objects.filter(invoice=invoice)
        .select_related("job__project", "site", "price_rule")
        .prefetch_related("job__project__institution", "site__institution", "institution")
        .defer(*(f"job__{name}" for name in JOB_WIDE_FIELDS if name != "earlier_runs"))
        .order_by("job_id", "site__slug", "kind", "run")
    )


def invoice_footprint(*, invoice) -> dict:
    """Energy and emissions of the invoice's compute lines (issue 15 point 5).

    ``{"used": {...}, "provided": {...}}``: ``used`` sums the ``compute_charge`` lines (the work
    the institution's projects' jobs did, on any pool, its own included), ``provided`` the
    ``compute_credit`` lines (the work its pools did for other institutions' jobs). Each is
    ``{"energy_kwh": float (kWh), "emissions_g": float (gCO2e), "lines": int, "unmeasured":
    int}``, ``unmeasured`` counting lines without figures (left out of the sums). One query.
    """
    out = {}
    rows = (
        invoice.entries.filter(kind__in=[BillingKind.COMPUTE_CHARGE, BillingKind.COMPUTE_CREDIT])
        .order_by()  # summed: no join for the entries' ordering
        .values_list("kind", "energy_kwh", "emissions_g")
    )
    sums = {
        BillingKind.COMPUTE_CHARGE: [0.0, 0.0, 0, 0],
        BillingKind.COMPUTE_CREDIT: [0.0, 0.0, 0, 0],
    }
    for kind, kwh, grams in rows:
        acc = sums[kind]
        acc[2] += 1
        if kwh is None or grams is None:
            acc[3] += 1
            continue
        acc[0] += kwh
        acc[1] += grams
    for name, kind in (
        ("used", BillingKind.COMPUTE_CHARGE),
        ("provided", BillingKind.COMPUTE_CREDIT),
    ):
        kwh, grams, lines, unmeasured = sums[kind]
        out[name] = {
            "energy_kwh": kwh,
            "emissions_g": grams,
            "lines": lines,
            "unmeasured": unmeasured,
        }
    return out


def _months(end: dt.date, count: int) -> list[dt.date]:
    months = [month_start(end)]
    while len(months) < count:
        prev = months[0] - dt.timedelta(days=1)
        months.insert(0, prev.replace(day=1))
    return months


def institution_billing_series(*, institution, today: dt.date, months: int = 12) -> dict:
    """Monthly series for the institution's billing charts, the last ``months`` months to
    ``today``'s month, oldest first.

    Returns ``{"labels": ["2026-01", …], "core_hours_used": […], "core_hours_provided": […],
    "su_used": […], "su_provided": […], "charges": […], "credits": […], "net": […],
    "currency": str}``. Usage is by the job's finish month: *used* = usage records of jobs of
    the institution's projects (any pool), *provided* = usage records at the institution's sites
    (any project); core-hours = reserved cores × slot seconds / 3600 (what is billed, see
    ``accounting.services.billing.service_units``); SU from the compute entries (``used``:
    compute charges to the institution, including own-pool show-back at 0.00; ``provided``:
    compute credits to it plus its own-pool show-back). Charges, credits and net (charges −
    credits, in the invoices' currency) come from the institution's invoices by invoice month.
    Floats, for the chart only.
    """
    axis = _months(today, months)
    first, end = axis[0], next_month(axis[-1])
    index = {m: i for i, m in enumerate(axis)}

    def zeros() -> list[float]:
        return [0.0] * len(axis)

    series = {k: zeros() for k in ("core_hours_used", "core_hours_provided", "su_used")}
    series["su_provided"] = zeros()
    # Summed in the database by the job's finish month (in the portal's zone, as
    # ``month_start``): at most ``months`` rows come back, whatever the number of jobs (issue 12).
    month = TruncMonth("job__finished_at", output_field=DateField())
    # The months' bounds as instants (midnight in the portal's zone, as ``__date`` compares):
    # a plain range on ``finished_at`` the planner can estimate, where ``finished_at::date``
    # made it expect 50 jobs of 10,000 and probe the usage and entries of each (issue 12).
    zone = timezone.get_current_timezone()
    since = dt.datetime.combine(first, dt.time.min, tzinfo=zone)
    until = dt.datetime.combine(end, dt.time.min, tzinfo=zone)
    finished = Q(job__finished_at__gte=since, job__finished_at__lt=until)
    # Keys in subqueries: the aggregates join only the job (for its finish month).
    mine = Q(job__project__in=Project.objects.filter(institution=institution).values("pk"))
    at_mine = Q(site__in=Site.objects.filter(institution=institution).values("pk"))
    hours = ExpressionWrapper(
        F("cores") * Coalesce(F("reserved_seconds"), F("wall_seconds")) / SECONDS_PER_HOUR,
        output_field=FloatField(),
    )
    # Two sums, each over the rows of one side through its own index (the jobs of the
    # institution's projects; the usage at its sites), rather than one pass over every usage
    # record with either condition (issue 12).
    for key, side in (("core_hours_used", mine), ("core_hours_provided", at_mine)):
        usage = (
            UsageRecord.objects.filter(finished, side)
            .annotate(month=month)
            .order_by()
            .values("month")
            .annotate(hours=Sum(hours))
        )
        for u in usage:
            i = index.get(u["month"])
            if i is not None:
                series[key][i] += u["hours"] or 0.0
    # Every sum below is of the institution's own entries (charges to it, credits to it): only
    # those are read, through the index on ``institution`` (issue 12).
    charge = Q(kind=BillingKind.COMPUTE_CHARGE)
    entries = (
        BillingEntry.objects.filter(
            finished,
            institution=institution,
            kind__in=(BillingKind.COMPUTE_CHARGE, BillingKind.COMPUTE_CREDIT),
        )
        .annotate(month=month)
        .order_by()
        .values("month")
        .annotate(
            used=Sum("service_units", filter=charge),
            # own-pool show-back: used and provided
            show_back=Sum("service_units", filter=charge & at_mine),
            credited=Sum("service_units", filter=Q(kind=BillingKind.COMPUTE_CREDIT)),
        )
    )
    for e in entries:
        i = index.get(e["month"])
        if i is None:
            continue
        series["su_used"][i] += float(e["used"] or 0)
        series["su_provided"][i] += float(e["show_back"] or 0) + float(e["credited"] or 0)
    money = {"charges": zeros(), "credits": zeros(), "net": zeros()}
    currency = None
    for inv in (
        Invoice.objects.filter(institution=institution, month__gte=first, month__lt=end)
        .order_by()  # not by the institution's name: no join
        .values("month", "charges", "credits", "total", "currency")
    ):
        i = index[inv["month"]]
        money["charges"][i] = float(inv["charges"])
        money["credits"][i] = float(inv["credits"])
        money["net"][i] = float(inv["total"])
        currency = inv["currency"]
    return {
        "labels": [m.strftime("%Y-%m") for m in axis],
        **{k: [round(v, 3) for v in vals] for k, vals in series.items()},
        **money,
        "currency": currency or "",
    }


def institution_pools_with_rules(*, institution, today: dt.date) -> list:
    """The institution's pools ordered by name, each with ``rules``: its price rules newest
    first (author joined), each marked ``state`` = ``"scheduled"`` (starts after ``today``),
    ``"current"`` (the one in effect ``today``) or ``"superseded"``. Two queries."""
    pools = list(
        ComputePool.objects.filter(site__institution=institution)
        .order_by("name")
        .prefetch_related(
            Prefetch(
                "price_rules",
                queryset=PriceRule.objects.select_related("created_by").order_by("-effective_from"),
                to_attr="rules",
            )
        )
    )
    for pool in pools:
        current_seen = False
        for rule in pool.rules:
            if rule.effective_from > today:
                rule.state = "scheduled"
            elif not current_seen:
                rule.state, current_seen = "current", True
            else:
                rule.state = "superseded"
    return pools


#: How the job page names what a job's data credits were split by (a whole-run score method).
DATA_BASIS = {
    "exact": "Shapley share",
    "gtg": "GTG-Shapley share",
    "data_volume": "data-volume share",
}


def job_cost(*, job, user) -> dict | None:
    """A job's billing for the job page, or ``None`` when ``user`` may not see it
    (``job.view_cost``).

    Returns ``{"compute": [row…], "data": [row…], "charged": Decimal (compute and data charges
    to the project's institution), "service_units": Decimal, "currency": str, "billed": bool,
    "payer": Institution, "runs": int (``accounting.runs.runs_of``), "data_basis": str (what the
    data credits were split by, :data:`DATA_BASIS`; ``""`` without data credits)}``. A compute row is one
    site's compute charge for one run: ``{"site", "payee" (the site's institution),
    "service_units", "amount", "own" (own pool: show-back at 0), "run", "flower_run_id"}``;
    a data row is one data credit: ``{"site", "payee", "amount"}`` (the data charges sum to the
    data credits, see ``accounting.services.billing.job_bill``).
    """
    if not can(user, "job.view_cost", job):
        return None
    entries = list(
        BillingEntry.objects.filter(job=job)
        .select_related("site__institution", "institution")
        .order_by("site__slug", "kind", "run")
    )
    runs = runs_of(job)
    payer = job.project.institution
    compute, data = [], []
    charged = Decimal("0.00")
    units = Decimal("0")
    currency = ""
    for e in entries:
        currency = e.currency
        if e.kind in CHARGE_KINDS:
            charged += e.amount
        if e.kind == BillingKind.COMPUTE_CHARGE:
            units += e.service_units
            compute.append(
                {
                    "site": e.site,
                    "payee": e.site.institution,
                    "service_units": e.service_units,
                    "amount": e.amount,
                    "own": e.site.institution_id == payer.pk,
                    "run": e.run,
                    "flower_run_id": flower_run_id(job, e.run),
                }
            )
        elif e.kind == BillingKind.DATA_CREDIT:
            data.append({"site": e.site, "payee": e.institution, "amount": e.amount})
    return {
        "compute": compute,
        "data": data,
        # what the data credits were split by (``job_bill``: the whole-run scores' method)
        "data_basis": DATA_BASIS.get(whole_run_shares(job=job)[0], "") if data else "",
        "charged": charged,
        "service_units": units,
        "currency": currency,
        "billed": bool(entries),
        "payer": payer,
        "runs": runs,
    }
