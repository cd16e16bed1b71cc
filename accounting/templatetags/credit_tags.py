"""Template tags of credit: ``{% job_credit job user %}``, the compact credit card of the job page."""

from __future__ import annotations

from django import template

from accounting.selectors.credit import credit_for_job
from portal.permissions import can

register = template.Library()


@register.inclusion_tag("accounting/credit/_job.html")
def job_credit(job, user) -> dict:
    """The job's contributors and CRediT roles (stored statement, or the draft it would get),
    with a link to the statement page; renders nothing for users who may not read it."""
    if not can(user, "credit.view", job):
        return {"visible": False}
    return {
        "visible": True,
        "job": job,
        "credit": credit_for_job(job=job),
        "can_edit": can(user, "credit.edit", job),
    }
