"""The e-mail a job's submitter gets when the job ends: its status, its reason if it failed, and,
for a model no better than the trivial baseline, that flag with both scores (issue 10)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.mail import send_mail

from federation.disclosure import baseline_released, site_held_out
from federation.models import FederatedJob, JobStatus
from sandbox.selectors import stewarded_institution_ids

log = logging.getLogger(__name__)


def _figure(value) -> str:
    return "not released" if value is None else f"{value:.4f}"


def job_notice(job: FederatedJob) -> tuple[str, str]:
    """``(subject, body)`` of the notice for an ended ``job``, to its submitter: the scores as
    the submitter may see them on the job page (``federation.disclosure``: exact only for a
    steward of every site; a hostile re-test read 112/114 off the mail's four decimals while the
    page showed 107/109, issue 9)."""
    status = job.get_status_display()
    lines = [f"Your job #{job.pk} “{job.title}” has ended: {status}."]
    subject = f"Job #{job.pk} {status.lower()}"
    if job.status == JobStatus.FAILED:
        lines.append(f"Reason: {job.status_detail or job.failure_reason or 'not given'}")
    baseline = job.final_metrics.get("baseline") or {}
    if baseline:
        sites = list(job.sites.select_related("site"))
        stewarded = stewarded_institution_ids(user=job.submitted_by)
        every = bool(sites) and all(js.site.institution_id in stewarded for js in sites)
        baseline = baseline_released(baseline, rows=site_held_out(sites), exact=every)
    if job.status == JobStatus.COMPLETED and baseline:
        metric = baseline.get("metric", "score")
        model, value = baseline.get("model"), baseline.get("value")
        if job.below_baseline:
            subject += " — no better than the baseline"
            lines.append(
                f"Flagged: the final model's {metric} ({_figure(model)}) is no better than the "
                f"{baseline.get('name')} ({_figure(value)}) on the pooled held-out splits."
            )
        elif model is not None and value is not None:
            lines.append(
                f"Final {metric}: {_figure(model)} (baseline {baseline.get('name')}: "
                f"{_figure(value)})."
            )
    base = settings.FRP_CALLBACK_BASE_URL.rstrip("/")
    lines.append(f"Details: {base}/jobs/{job.pk}/")
    return subject, "\n\n".join(lines) + "\n"


def job_notify(*, job_id: int) -> bool:
    """Send the notice of ended job ``job_id`` to its submitter; ``False`` when there is no
    address or the mail cannot be sent (logged: a notice never fails the job's end)."""
    job = FederatedJob.objects.select_related("submitted_by").get(pk=job_id)
    address = job.submitted_by.email
    if not address or not job.is_terminal:
        return False
    subject, body = job_notice(job)
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [address])
    except Exception as exc:  # noqa: BLE001 — a mail server problem is not the job's
        log.warning("job %s: notice to its submitter not sent: %s", job_id, exc)
        return False
    return True
