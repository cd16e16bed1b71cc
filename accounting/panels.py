"""What accounting adds to the federation's job page (``portal.panels``): the state of its
accounting steps (for admins), contribution and usage, cost and credit cards, and the
``accounting`` section of the job's ``progress.json``. Registered
in ``AccountingConfig.ready()``; the cards are the template tags' (``{% job_contribution job %}``,
``{% job_cost job user %}``, ``{% job_credit job user %}``) rendered in the page's slot.
"""

from __future__ import annotations

from accounting.selectors import billing as billing_selectors
from accounting.selectors import contribution as contribution_selectors
from accounting.selectors import steps as steps_selectors
from accounting.templatetags import billing_tags, contribution_tags, credit_tags
from portal import panels
from portal.permissions import can


def job_accounting_steps(*, request, job) -> dict | None:
    """The accounting card of a finished ``job``: each step's status, reason and tries, and the
    retry button; only for those who may see it (``job.view_accounting``), else nothing."""
    user = getattr(request, "user", None)
    if not job.is_terminal or not can(user, "job.view_accounting", job):
        return None
    return {
        "job": job,
        "accounting": steps_selectors.job_accounting(job=job),
        "can_retry": can(user, "job.retry_accounting", job),
        "next": request.get_full_path(),
    }


def job_contribution(*, request, job) -> dict:
    """The contribution (Shapley shares, leave-one-out) and usage card of ``job``."""
    return contribution_tags.job_contribution({"request": request}, job)


def job_cost(*, request, job) -> dict:
    """The cost card of ``job`` (empty for users who may not see it)."""
    return billing_tags.job_cost(job, request.user)


def job_credit(*, request, job) -> dict:
    """The CRediT card of ``job`` (empty for users who may not read it)."""
    return credit_tags.job_credit(job, request.user)


def job_accounting_json(*, request, job) -> dict:
    """Contribution shares and cost once the worker has accounted for the job (else empty).

    Shape: ``{"method": "exact"|"gtg"|…|None, "shares": {site slug: share 0..1}, "cost": None |
    {"charged": str (Decimal), "service_units": str, "currency": str, "payer": institution name}}``.
    """
    if not job.is_terminal:  # nothing is accounted before the end: no queries while it runs
        return {"method": None, "shares": {}, "cost": None}
    user = request.user
    contribution = contribution_selectors.job_contribution(user=user, job=job)
    cost = billing_selectors.job_cost(job=job, user=user)
    return {
        "method": contribution.rows[0].method if contribution.rows else None,
        "shares": {r.site.slug: r.share for r in contribution.rows},
        "cost": None
        if not cost or not cost["billed"]
        else {
            "charged": str(cost["charged"]),
            "service_units": str(cost["service_units"]),
            "currency": cost["currency"],
            "payer": cost["payer"].name,
        },
    }


def register() -> None:
    """Fill the job page's slot and its progress JSON."""
    panels.register(
        "job_detail",
        template="accounting/steps/_job.html",
        context=job_accounting_steps,
        order=5,
    )
    panels.register(
        "job_detail",
        template="accounting/contribution/_job.html",
        context=job_contribution,
        order=10,
    )
    panels.register(
        "job_detail", template="accounting/billing/_job_cost.html", context=job_cost, order=20
    )
    panels.register(
        "job_detail", template="accounting/credit/_job.html", context=job_credit, order=30
    )
    panels.register_section("job_progress", "accounting", job_accounting_json)
