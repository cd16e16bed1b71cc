"""Template tags of billing: the job page's cost card (``{% job_cost job user %}``) and number
formats for money, service units and rates."""

from __future__ import annotations

from decimal import Decimal

from django import template

from accounting.selectors import billing as selectors
from accounting.services.billing import CREDIT_KINDS

register = template.Library()


@register.inclusion_tag("accounting/billing/_job_cost.html")
def job_cost(job, user):
    """The job's cost per site (SU, amount, who pays whom) and its total, for members of the
    job's project and admins of the institutions involved; nothing for anyone else."""
    return {"job": job, "cost": selectors.job_cost(job=job, user=user)}


@register.filter
def rate_percent(rate) -> str:
    """A 0–1 rate as a percentage: ``Decimal("0.125")`` → ``"12.5 %"``."""
    value = (Decimal(rate) * 100).normalize()
    return f"{value:f} %"


@register.simple_tag
def signed_amount(entry) -> str:
    """A billing entry's amount with its direction on the institution's invoice: ``+1.60`` for a
    charge, ``−1.60`` (minus sign) for a credit; ``0.00`` for an own-pool show-back line."""
    if entry.amount == 0:
        return "0.00"
    sign = "−" if entry.kind in CREDIT_KINDS else "+"
    return f"{sign}{entry.amount:,.2f}"


@register.filter
def piece_span(piece: dict) -> str:
    """A time-of-use piece's interval (``BillingEntry.price_detail`` item, ISO 8601 UTC) as
    ``"2025-03-12 21:30 → 22:00 UTC"`` (the end's date shown only when it differs)."""
    start, end = str(piece.get("from", "")), str(piece.get("to", ""))
    head = start[:10] + " " + start[11:16]
    tail = end[11:16] if end[:10] == start[:10] else end[:10] + " " + end[11:16]
    return f"{head} → {tail} UTC"
