"""Writes of billing: price rules, a job's billing entries, monthly invoices and their closing.

Owns ``PriceRule``, ``BillingEntry`` and ``Invoice`` (``accounting.models``, "Prices and bills").
Every entry written here is also appended to the ledger (``portal.ledger.services``) in the
same transaction, and each write leaves an audit event (``portal.services.audit_record``).

The rules, in one place (the docstrings below give the details):

* **Service units** follow Slurm's ``TRESBillingWeights`` (slurm.conf(5), "TRESBillingWeights";
  priority/multifactor "billing" TRES): *allocated* TRES × elapsed time, i.e. reserved cores,
  memory and GPUs of the ClientApp × its wall-clock hours. Measured CPU seconds are not billed.
* **Time-of-use prices** (ADR 0030): a site's held time is the interval that ends when its run
  ended (``[ended − held, ended)``); it is cut where the pool's time-of-use price bands
  (``federation.models.PriceBand``, weekly, in the pool's time zone) change, and each piece is
  priced at the band price in force during it, or at the price rule's ``price_per_unit`` outside
  every band. Only totals are metered per site, so its usage is taken as spread uniformly over
  that interval: a piece's service units are the SU per hour × its seconds.
* **Money** is ``Decimal``; service units are rounded to 4 decimals per piece and amounts to
  cents per line, both ``ROUND_HALF_UP``, so every invoice line can be re-computed as
  Σ (shown SU × price) of its pieces (one piece when the run stays inside one price).
* **Own-institution use** (the job's project and the site belong to the same institution) is
  recorded as a ``compute_charge`` of 0.00 with its service units (show-back, no money moves)
  and no credit, so every usage record leaves exactly one compute trace.
* **Invoices**: one per institution and calendar month; an entry goes to its institution's open
  invoice of the month its run ended (the job's finish month for a job never resumed), or — when
  that month is already closed — of the next month that is still open (a late entry is never
  added to a closed invoice).
* **Resumed jobs** (ADR 0028): usage and compute lines are per run; a new run adds its own lines
  and never changes the lines already issued for an earlier run.
"""

from __future__ import annotations

import calendar
import datetime as dt
import decimal
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from accounting.models import (
    BillingEntry,
    BillingKind,
    Invoice,
    InvoiceStatus,
    PriceRule,
    UsageRecord,
)
from accounting.selectors.contribution import whole_run_shares
from accounting.services.usage import run_ordinal
from federation.models import FederatedJob, JobStatus
from federation.pool_selectors import pool_price_bands
from federation.scheduling import calendar as tou
from portal.ledger.services import ledger_append
from portal.models import Site
from portal.services import audit_record

CENTS = Decimal("0.01")
SU_PLACES = Decimal("0.0001")
SECONDS_PER_HOUR = Decimal(3600)
CHARGE_KINDS = (BillingKind.COMPUTE_CHARGE, BillingKind.DATA_CHARGE)
CREDIT_KINDS = (BillingKind.COMPUTE_CREDIT, BillingKind.DATA_CREDIT)
DATA_KINDS = (BillingKind.DATA_CHARGE, BillingKind.DATA_CREDIT)
_CONTEXT = decimal.Context(prec=40, rounding=ROUND_HALF_UP)  # room for weights × seconds


class BillingError(Exception):
    """Billing refused: a price rule that cannot be saved, or a job that cannot be billed.

    ``field_errors`` maps form field names to messages (``None`` for a whole-form error)."""

    def __init__(self, message: str, *, field_errors: dict[str | None, list[str]] | None = None):
        super().__init__(message)
        self.field_errors = field_errors or {None: [message]}


def billing_currency() -> str:
    """The federation's one billing currency (ISO 4217), ``settings.FRP_BILLING_CURRENCY``
    (default ``"EUR"``): an invoice has one currency, and any pool may bill any institution."""
    return getattr(settings, "FRP_BILLING_CURRENCY", "EUR")


def month_start(day: dt.date | dt.datetime) -> dt.date:
    """The first day of ``day``'s calendar month (a datetime is taken in the portal's zone)."""
    if isinstance(day, dt.datetime):
        day = timezone.localtime(day).date()
    return day.replace(day=1)


def next_month(month: dt.date) -> dt.date:
    """The first day of the month after ``month``."""
    return month + dt.timedelta(
        days=calendar.monthrange(month.year, month.month)[1] - month.day + 1
    )


# ---------------------------------------------------------------------------------------------
# Price rules
# ---------------------------------------------------------------------------------------------


@transaction.atomic
def price_rule_create(
    *,
    by,
    pool,
    effective_from: dt.date,
    cpu_weight: Decimal,
    memory_weight: Decimal,
    gpu_weight: Decimal,
    price_per_unit: Decimal,
    currency: str,
    data_credit_rate: Decimal = Decimal("0"),
) -> PriceRule:
    """Add a price rule to ``pool`` from ``effective_from`` (a new row; rules are never edited,
    so the history shows what every past job was billed at).

    Weights are service units per core-hour, per GiB-hour of memory and per GPU-hour
    (``Decimal`` ≥ 0, at least one > 0); ``price_per_unit`` is in ``currency`` per service unit
    (≥ 0); ``data_credit_rate`` is the share (0–1) of the compute value paid to data providers.
    Raises ``BillingError`` (with ``field_errors``) when a value is out of range, the date is in
    the past (prices are not changed retroactively), the pool already has a rule starting that
    day, or the currency is not the federation's billing currency.
    """
    errors: dict[str | None, list[str]] = {}
    today = timezone.localdate()
    if effective_from < today:
        errors.setdefault("effective_from", []).append(
            f"Choose today ({today:%Y-%m-%d}) or a later day: prices are not changed retroactively."
        )
    elif PriceRule.objects.filter(pool=pool, effective_from=effective_from).exists():
        errors.setdefault("effective_from", []).append(
            f"Pool {pool.name} already has a price rule starting on {effective_from:%Y-%m-%d}."
        )
    for name, value in (
        ("cpu_weight", cpu_weight),
        ("memory_weight", memory_weight),
        ("gpu_weight", gpu_weight),
        ("price_per_unit", price_per_unit),
    ):
        if value < 0:
            errors.setdefault(name, []).append("Must be zero or more.")
    if cpu_weight <= 0 and memory_weight <= 0 and gpu_weight <= 0:
        errors.setdefault(None, []).append("At least one billing weight must be above zero.")
    if not Decimal(0) <= data_credit_rate <= Decimal(1):
        errors.setdefault("data_credit_rate", []).append("Must be between 0 and 1.")
    if currency != billing_currency():
        errors.setdefault("currency", []).append(
            f"The federation bills in {billing_currency()}; every pool uses that currency."
        )
    if errors:
        raise BillingError("The price rule was not saved.", field_errors=errors)
    rule = PriceRule.objects.create(
        pool=pool,
        effective_from=effective_from,
        cpu_weight=cpu_weight,
        memory_weight=memory_weight,
        gpu_weight=gpu_weight,
        price_per_unit=price_per_unit,
        currency=currency,
        data_credit_rate=data_credit_rate,
        created_by=by,
    )
    audit_record(
        by=by,
        action="price_rule.create",
        target=rule,
        institution=pool.institution,
        pool=pool.name,
        effective_from=effective_from.isoformat(),
        cpu_weight=str(cpu_weight),
        memory_weight=str(memory_weight),
        gpu_weight=str(gpu_weight),
        price_per_unit=str(price_per_unit),
        currency=currency,
        data_credit_rate=str(data_credit_rate),
    )
    return rule


def price_rule_in_effect(*, pool, day: dt.date) -> PriceRule | None:
    """The pool's rule with the latest ``effective_from`` ≤ ``day``, or ``None`` (no price:
    the pool's use is not billed)."""
    return (
        PriceRule.objects.filter(pool=pool, effective_from__lte=day)
        .order_by("-effective_from")
        .first()
    )


# ---------------------------------------------------------------------------------------------
# Arithmetic (pure; the tests check it against hand computation)
# ---------------------------------------------------------------------------------------------


def service_units(*, usage: UsageRecord, rule: PriceRule) -> Decimal:
    """Service units of one usage record under ``rule``, rounded half-up to 4 decimals.

    SU = (cpu_weight × cores + memory_weight × memory_gib + gpu_weight × gpus) × held / 3600,
    i.e. the Slurm ``TRESBillingWeights`` sum of *allocated* TRES × elapsed hours
    (slurm.conf(5)), where ``held`` is ``usage.reserved_seconds`` — the time the site's pool slot
    was held for the job, from its start to its end — or, for a record without it, the
    ClientApp's metered ``wall_seconds``. The measured ``cpu_seconds`` are not billed, because
    the reserved cores, memory and GPUs are held whether the process keeps them busy or not, and
    memory and GPUs have no "used seconds" to bill by. Floats (seconds) enter as their shortest
    decimal repr (``str(float)``).
    """
    return _units(_per_hour(usage, rule), Decimal(str(_held(usage))))


def _held(usage: UsageRecord) -> float:
    """Seconds billed: the slot time held (``reserved_seconds``), else the ClientApp's wall."""
    return usage.reserved_seconds if usage.reserved_seconds is not None else usage.wall_seconds


def _per_hour(usage: UsageRecord, rule: PriceRule) -> Decimal:
    """Service units per hour of ``usage``'s reserved cores, memory and GPUs under ``rule``."""
    return _CONTEXT.add(
        _CONTEXT.add(
            _CONTEXT.multiply(rule.cpu_weight, Decimal(usage.cores)),
            _CONTEXT.multiply(rule.memory_weight, Decimal(usage.memory_gib)),
        ),
        _CONTEXT.multiply(rule.gpu_weight, Decimal(usage.gpus)),
    )


def _units(per_hour: Decimal, seconds: Decimal) -> Decimal:
    units = _CONTEXT.divide(_CONTEXT.multiply(per_hour, seconds), SECONDS_PER_HOUR)
    return units.quantize(SU_PLACES, rounding=ROUND_HALF_UP, context=_CONTEXT)


@dataclass(frozen=True)
class PricedPiece:
    """A part of a site's held time at one time-of-use price: ``[start, end)`` (aware, UTC),
    ``seconds`` (``Decimal``), ``service_units`` (rounded to 4 places) and ``price`` (currency
    per service unit)."""

    start: dt.datetime
    end: dt.datetime
    seconds: Decimal
    service_units: Decimal
    price: Decimal

    def as_dict(self) -> dict:
        """The piece as stored in ``BillingEntry.price_detail`` (strings, ISO 8601 UTC)."""
        return {
            "from": self.start.astimezone(dt.UTC).isoformat(),
            "to": self.end.astimezone(dt.UTC).isoformat(),
            "seconds": format(self.seconds.normalize(), "f"),
            "service_units": str(self.service_units),
            "price": str(self.price.quantize(SU_PLACES)),
        }


def priced_pieces(
    *, usage: UsageRecord, rule: PriceRule, ended_at: dt.datetime, bands=(), tz: str = "UTC"
) -> list[PricedPiece]:
    """``usage`` cut into pieces of one time-of-use price each (the module's rule).

    The held seconds (``reserved_seconds``, else ``wall_seconds``) are the interval
    ``[ended_at − held, ended_at)``; ``bands`` (``federation.scheduling.calendar.PriceBand``
    with ``Decimal`` prices, read in ``tz``) price the hours they cover, ``rule.price_per_unit``
    the others (``calendar.price_segments``). Only totals are metered per site, so the usage is
    spread uniformly over the interval: a piece holds SU per hour × its seconds, rounded half-up
    to 4 places; the last piece takes the seconds left so the pieces sum to the held seconds
    exactly. One piece (the figures of ``service_units``) when the run meets one price only.
    """
    held = Decimal(str(_held(usage)))
    per_hour = _per_hour(usage, rule)
    start = ended_at - dt.timedelta(seconds=float(held))
    schedule = tou.price_segments(bands, rule.price_per_unit, start=start, end=ended_at, tz=tz) or [
        (start, ended_at, rule.price_per_unit)
    ]
    if len(schedule) == 1:
        lo, hi, price = schedule[0]
        return [PricedPiece(lo, hi, held, _units(per_hour, held), Decimal(price))]
    pieces, used = [], Decimal(0)
    for k, (lo, hi, price) in enumerate(schedule):
        if k == len(schedule) - 1:
            seconds = held - used
        else:
            seconds = Decimal(str((hi - lo).total_seconds()))
            used += seconds
        pieces.append(PricedPiece(lo, hi, seconds, _units(per_hour, seconds), Decimal(price)))
    return pieces


def money(value: Decimal) -> Decimal:
    """``value`` rounded half-up to cents (0.005 → 0.01)."""
    return value.quantize(CENTS, rounding=ROUND_HALF_UP, context=_CONTEXT)


def split_exact(total: Decimal, shares: dict[str, Decimal]) -> dict[str, Decimal]:
    """Split ``total`` (cents) by ``shares`` so the parts are whole cents summing exactly to it.

    Largest-remainder (Hamilton) method: every part is first rounded *down* to cents, then the
    cents left over go one each to the keys with the largest remainders, ties broken by key
    (ascending), so the result is deterministic. Shares are normalised by their sum (they need not
    sum to 1); negative shares count as 0. ``shares`` must have a positive sum (else ValueError).
    """
    clean = {k: max(v, Decimal(0)) for k, v in shares.items()}
    whole = sum(clean.values(), Decimal(0))
    if whole <= 0:
        raise ValueError("shares must have a positive sum")
    exact = {k: _CONTEXT.divide(_CONTEXT.multiply(total, v), whole) for k, v in clean.items()}
    parts = {k: v.quantize(CENTS, rounding=ROUND_DOWN, context=_CONTEXT) for k, v in exact.items()}
    left = int(((total - sum(parts.values(), Decimal(0))) / CENTS).to_integral_value())
    order = sorted(exact, key=lambda k: (-(exact[k] - parts[k]), k))
    for k in order[:left]:
        parts[k] += CENTS
    return parts


# ---------------------------------------------------------------------------------------------
# A job's bill
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    site: object
    kind: str
    institution: object
    rule: PriceRule | None
    service_units: Decimal
    amount: Decimal
    currency: str
    run: int
    billed_on: dt.date  # the day that picked the price rule; its month picks the invoice
    pieces: tuple = ()  # PricedPiece of a compute line
    energy_kwh: float | None = None  # a compute line's usage (kWh)
    emissions_g: float | None = None  # … and its gCO2e


def _data_shares(job) -> dict[int, Decimal]:
    """Whole-run shares by site id (``accounting.selectors.contribution.whole_run_shares``), as
    non-negative ``Decimal``; empty when the job has none or they sum to 0."""
    _, rows = whole_run_shares(job=job)
    shares = {site_id: max(Decimal(str(share)), Decimal(0)) for site_id, share in rows.items()}
    return shares if sum(shares.values(), Decimal(0)) > 0 else {}


def _site_pool(site, chosen=None):
    """The compute pool that ran ``site``'s part of a job: ``chosen`` (the pool recorded on the
    job's ``JobSite``, one of the site's pools) when given, else the site's first pool by id
    (jobs launched before pools were chosen), or ``None`` for a site without one."""
    if chosen is not None and chosen.site_id == site.pk:
        return chosen
    return min(site.pools.all(), key=lambda pool: pool.pk, default=None)


#: Job statuses that are billed: in full when completed; compute only, as used, otherwise.
BILLED_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED)


def _usage_day(usage: UsageRecord, finished_on: dt.date) -> dt.date:
    """The day ``usage``'s run ended, in the portal's zone (``finished_on``, the job's finish day,
    for a record written before runs were recorded)."""
    return timezone.localtime(usage.ended_at).date() if usage.ended_at else finished_on


def _job_lines(job, finished_on: dt.date) -> list[_Line]:
    """What ``job`` should be billed in all (pure reads): compute lines for every run's usage
    record, each priced on the day its run ended, then the data lines of a completed job."""
    payer = job.project.institution
    last_run = run_ordinal(job)
    lines: list[_Line] = []
    data_pool: dict[int, list] = {}  # site id -> [site, rule of its last run, data amount]
    usages = (
        UsageRecord.objects.filter(job=job)
        .select_related("site__institution")
        .prefetch_related("site__pools")
    )
    chosen = {js.site_id: js.pool for js in job.sites.select_related("pool")}
    for usage in usages.order_by("site__slug", "run"):
        pool = _site_pool(usage.site, chosen.get(usage.site_id))
        day = _usage_day(usage, finished_on)
        rule = None if pool is None else price_rule_in_effect(pool=pool, day=day)
        if rule is None:
            continue
        pieces = tuple(
            priced_pieces(
                usage=usage,
                rule=rule,
                ended_at=usage.ended_at or job.finished_at,
                bands=pool_price_bands(pool),
                tz=pool.time_zone,
            )
        )
        units = sum((p.service_units for p in pieces), Decimal(0))
        value = money(sum((p.service_units * p.price for p in pieces), Decimal(0)))
        provider = usage.site.institution
        own = provider.pk == payer.pk
        common = {
            "rule": rule,
            "service_units": units,
            "currency": rule.currency,
            "pieces": pieces,
            "energy_kwh": usage.energy_kwh,
            "emissions_g": usage.emissions_g,
        }
        lines.append(
            _Line(
                site=usage.site,
                kind=BillingKind.COMPUTE_CHARGE,
                institution=payer,
                amount=Decimal("0.00") if own else value,
                run=usage.run,
                billed_on=day,
                **common,
            )
        )
        if not own:
            lines.append(
                _Line(
                    site=usage.site,
                    kind=BillingKind.COMPUTE_CREDIT,
                    institution=provider,
                    amount=value,
                    run=usage.run,
                    billed_on=day,
                    **common,
                )
            )
        if rule.data_credit_rate > 0:
            data_amount = money(value * rule.data_credit_rate)
            if data_amount > 0:
                part = data_pool.setdefault(usage.site.pk, [usage.site, rule, Decimal(0)])
                part[1] = rule
                part[2] += data_amount
    already = BillingEntry.objects.filter(job=job, kind__in=DATA_KINDS).exists()
    if job.status != JobStatus.COMPLETED:  # a failed or stopped job earns no data credit
        data_pool = {}
    if data_pool and not already:  # data entries are written together, once
        shares = _data_shares(job)
        if shares:
            currencies = {rule.currency for _, rule, _ in data_pool.values()}
            if len(currencies) > 1:
                raise BillingError(f"Job {job.pk} mixes currencies {sorted(currencies)}.")
            currency = currencies.pop()
            total = sum((amount for _, _, amount in data_pool.values()), Decimal(0))
            data = {"currency": currency, "run": last_run, "billed_on": finished_on}
            for site, rule, amount in data_pool.values():
                lines.append(
                    _Line(
                        site=site,
                        kind=BillingKind.DATA_CHARGE,
                        institution=payer,
                        rule=rule,
                        service_units=Decimal(0),
                        amount=amount,
                        **data,
                    )
                )
            sites = {
                s.slug: s for s in Site.objects.filter(pk__in=shares).select_related("institution")
            }
            parts = split_exact(total, {slug: shares[s.pk] for slug, s in sites.items()})
            for slug, part in sorted(parts.items()):
                site = sites[slug]
                lines.append(
                    _Line(
                        site=site,
                        kind=BillingKind.DATA_CREDIT,
                        institution=site.institution,
                        rule=None,
                        service_units=Decimal(0),
                        amount=part,
                        **data,
                    )
                )
    return lines


def _open_invoice(*, institution, month: dt.date, currency: str) -> Invoice:
    """The institution's open invoice of ``month``, or of the first later month still open
    (created when needed); locked (``SELECT … FOR UPDATE``) until the caller's commit."""
    while True:
        invoice, _ = Invoice.objects.get_or_create(
            institution=institution, month=month, defaults={"currency": currency}
        )
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.status == InvoiceStatus.OPEN:
            if invoice.currency != currency:
                raise BillingError(
                    f"Invoice {invoice} is in {invoice.currency}; an entry in {currency} cannot "
                    "be added to it."
                )
            return invoice
        month = next_month(month)


def invoice_totals(invoice: Invoice) -> tuple[Decimal, Decimal, Decimal]:
    """(charges, credits, total = charges − credits) summed from the invoice's entries."""
    sums = invoice.entries.aggregate(
        charges=Sum("amount", filter=Q(kind__in=CHARGE_KINDS)),
        credits=Sum("amount", filter=Q(kind__in=CREDIT_KINDS)),
    )
    charges = sums["charges"] or Decimal("0.00")
    credits = sums["credits"] or Decimal("0.00")
    return money(charges), money(credits), money(charges - credits)


def _refresh_totals(invoice: Invoice) -> None:
    invoice.charges, invoice.credits, invoice.total = invoice_totals(invoice)
    invoice.save(update_fields=["charges", "credits", "total"])


@transaction.atomic
def job_bill(*, job) -> list[BillingEntry]:
    """Bill one job: write its missing billing entries; return the entries created by this call.

    A ``COMPLETED`` job is billed in full. A ``FAILED`` or ``STOPPED`` job is billed only for the
    compute it actually used — its sites' slot time up to the failure or stop, as metered in its
    usage records — and earns no data credit (no data lines), as Slurm charges a failed or
    cancelled job its allocation for the time it ran (ADR 0019); a job still running is not
    billed (``[]``). ``BillingError`` if an ended job has no ``finished_at``. For each
    ``UsageRecord`` of the job — one per site and run (ADR 0028) — with the price rule of the
    site's pool in effect on the day that run ended (``UsageRecord.ended_at``, else
    ``job.finished_at``, in the portal's time zone; no rule: not billed):

    * ``compute_charge`` to the project's institution and ``compute_credit`` to the site's
      institution, both ``money(Σ SU × price)`` over the line's time-of-use pieces (see
      ``priced_pieces``; stored in ``price_detail``), each carrying the usage record's
      ``energy_kwh`` and ``emissions_g`` (copied, so an issued line never changes), keyed by the
      record's run; own-institution use: a ``compute_charge`` of 0.00 carrying the SU, no credit;
    * when ``data_credit_rate`` > 0 and the job COMPLETED: ``data_charge`` = the sum over the
      compute site's runs of ``money(rate × SU × price)`` (computed on the compute value even
      for own-institution use) to the project's institution, keyed by that compute site; the data
      charges' sum is paid out as ``data_credit`` to the institution of every site with a
      whole-run ``ContributionScore`` (method exact, else gtg, else data_volume), split by share
      with ``split_exact`` so the credits sum to the charges to the cent. The project's own data
      sites are credited too (it pays itself its own share). Data lines carry the job's last run
      and its finish day. No scores yet: no data entries; a later call adds them.

    What is written is the difference between what the job should be billed (the lines above)
    and what is already billed: ``get_or_create`` on (job, site, kind, run) under the
    ``billing_unique_entry_run`` constraint, with the job row locked. An existing entry is never
    re-priced or moved, so running this twice changes nothing, and a job resumed from its
    checkpoint adds only the lines of its new run's usage (the failed run's lines, perhaps on a
    closed invoice, stay as issued). Data entries are only written when the job has none yet, so
    scores arriving later by another method cannot unbalance them. Each new entry is appended to
    the ledger (kind ``charge`` or ``credit``, amounts as strings) and attached to its
    institution's open invoice of its day's month (see ``_open_invoice``), whose running totals
    are updated.
    """
    job = (
        FederatedJob.objects.select_for_update(of=("self",))
        .select_related("project__institution")
        .get(pk=job.pk)
    )
    if job.status not in BILLED_STATUSES:
        return []
    if job.finished_at is None:
        raise BillingError(f"Job {job.pk} has ended but has no finish time.")
    finished_on = timezone.localtime(job.finished_at).date()
    created_entries: list[BillingEntry] = []
    touched: dict[int, Invoice] = {}
    for line in _job_lines(job, finished_on):
        entry, created = BillingEntry.objects.get_or_create(
            job=job,
            site=line.site,
            kind=line.kind,
            run=line.run,
            defaults={
                "institution": line.institution,
                "price_rule": line.rule,
                "service_units": line.service_units,
                "amount": line.amount,
                "price_detail": [p.as_dict() for p in line.pieces],
                "energy_kwh": line.energy_kwh,
                "emissions_g": line.emissions_g,
                "currency": line.currency,
            },
        )
        if not created:
            continue
        invoice = _open_invoice(
            institution=line.institution, month=month_start(line.billed_on), currency=line.currency
        )
        entry.invoice = invoice
        entry.save(update_fields=["invoice"])
        touched[invoice.pk] = invoice
        record = {}
        if line.pieces:  # compute lines: [from, to, SU, price] of each time-of-use piece
            record["priced"] = [
                [d["from"], d["to"], d["service_units"], d["price"]]
                for d in (p.as_dict() for p in line.pieces)
            ]
        ledger_append(
            kind="charge" if line.kind in CHARGE_KINDS else "credit",
            record=record
            | {
                "entry": entry.pk,
                "job": job.pk,
                "site": line.site.slug,
                "billing_kind": line.kind,
                "run": line.run,
                "institution": line.institution.slug,
                "price_rule": line.rule.pk if line.rule else None,
                "service_units": str(line.service_units),
                "amount": str(line.amount),
                "currency": line.currency,
                "invoice": invoice.pk,
                "month": invoice.month.isoformat(),
            },
        )
        created_entries.append(entry)
    for invoice in touched.values():
        _refresh_totals(invoice)
    if created_entries:
        audit_record(
            by=None,
            action="job.bill",
            target=job,
            institution=job.project.institution,
            entries=len(created_entries),
        )
    return created_entries


# ---------------------------------------------------------------------------------------------
# Closing invoices
# ---------------------------------------------------------------------------------------------

CLOSE_BATCH = 200


def invoice_close(*, month: dt.date | None = None, batch: int = CLOSE_BATCH) -> list[Invoice]:
    """Close every open invoice of a month strictly before ``month`` (default: the current
    month in the portal's time zone); return the invoices closed by this call.

    ``month`` is any day of the reference month; a month after the current one raises
    ``ValueError`` (the current month is still being billed). Each invoice is closed in its own
    transaction, locked, re-checked (still open), its ``charges``/``credits``/``total``
    recomputed from its entries, status ``closed`` and ``closed_at`` set, and an audit event
    written. Idempotent: a second call finds nothing open and changes nothing. Works through
    ``batch`` invoices per query until none is left.
    """
    current = month_start(timezone.localdate())
    before = current if month is None else month_start(month)
    if before > current:
        raise ValueError(f"cannot close invoices of {before:%Y-%m} or later: it is {current:%Y-%m}")
    closed: list[Invoice] = []
    last_pk = 0
    while True:
        pks = list(
            Invoice.objects.filter(status=InvoiceStatus.OPEN, month__lt=before, pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", flat=True)[:batch]
        )
        if not pks:
            return closed
        for pk in pks:
            invoice = _invoice_close_one(pk)
            if invoice is not None:
                closed.append(invoice)
        last_pk = pks[-1]


@transaction.atomic
def _invoice_close_one(pk: int) -> Invoice | None:
    invoice = Invoice.objects.select_for_update().select_related("institution").get(pk=pk)
    if invoice.status != InvoiceStatus.OPEN:
        return None
    invoice.charges, invoice.credits, invoice.total = invoice_totals(invoice)
    invoice.status = InvoiceStatus.CLOSED
    invoice.closed_at = timezone.now()
    invoice.save(update_fields=["charges", "credits", "total", "status", "closed_at"])
    audit_record(
        by=None,
        action="invoice.close",
        target=invoice,
        institution=invoice.institution,
        month=invoice.month.isoformat(),
        charges=str(invoice.charges),
        credits=str(invoice.credits),
        total=str(invoice.total),
    )
    return invoice
