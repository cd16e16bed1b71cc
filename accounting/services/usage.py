"""Writes of metered usage: one ``UsageRecord`` per (job, site), appended once to the ledger.

Sources: each site's ``SiteRoundMetric`` rows (ClientApp metering of the train and evaluate
messages of every round) plus the site's share of the contribution evaluation
(``job.final_metrics["contribution"]["sites"]``), which is work the site did for this job too.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Q, Sum

from accounting.models import UsageRecord
from federation.models import FederatedJob, SiteRoundMetric
from federation.selectors import site_energy
from portal.ledger.services import ledger_append
from portal.services import audit_record


class UsageError(Exception):
    """Usage cannot be recorded for this job (yet)."""


def _dec(value: float, places: int = 6) -> str:
    """A float (seconds) as a Decimal string with ``places`` decimals, for the ledger leaf."""
    return str(Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-places)))


def _ledger_record(record: UsageRecord, job: FederatedJob) -> dict:
    return {
        "job": job.pk,
        "site": record.site.slug,
        "rounds": record.rounds,
        "cpu_seconds": _dec(record.cpu_seconds),
        "wall_seconds": _dec(record.wall_seconds),
        "examples": record.examples,
        "bytes_received": record.bytes_received,
        "bytes_sent": record.bytes_sent,
        "cores": record.cores,
        "memory_gib": str(Decimal(record.memory_gib).quantize(Decimal("0.001"))),
        "gpus": record.gpus,
        "energy_wh": _dec((record.energy_kwh or 0.0) * 1000, 3),
        "emissions_g": _dec(record.emissions_g or 0.0, 3),
    }


def usage_record_job(*, job: FederatedJob) -> list[UsageRecord]:
    """Sum one finished job's metering into one ``UsageRecord`` per participating site.

    Per site: ``rounds`` = rounds it completed (``ok``); ``cpu_seconds``/``wall_seconds``
    (seconds), ``examples`` (train + evaluation examples), ``bytes_received``/``bytes_sent``
    (bytes of model ArrayRecords, see ``SiteRoundMetric``) summed over every round it replied to,
    plus its part of the contribution evaluation. Sites with no metered round and no contribution
    work get no record. ``flower_*`` stay null: flwr 1.42 reports compute time and traffic only
    per run (kept in ``job.final_metrics["flower"]``), never per site.

    Idempotent (``update_or_create`` under a lock on the job row): each record is appended to the
    ledger (``kind="usage"``, floats as Decimal strings) only when first created; a second call
    returns the same records and appends nothing. Returns the records ordered by site slug.

    Raises ``UsageError`` when the job has not finished (its figures could still change).
    """
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job.pk)
        if not job.is_terminal:
            raise UsageError(f"job {job.pk} is {job.status}; usage is recorded once it has ended")
        extra = (job.final_metrics.get("contribution") or {}).get("sites") or {}
        sums = {
            row["job_site"]: row
            for row in SiteRoundMetric.objects.filter(job_site__job=job)
            .values("job_site")
            .annotate(
                rounds=Count("id", filter=Q(ok=True)),
                cpu=Sum("cpu_seconds"),
                wall=Sum("wall_seconds"),
                train=Sum("train_examples"),
                evaluated=Sum("eval_examples"),
                received=Sum("bytes_received"),
                sent=Sum("bytes_sent"),
            )
        }
        # The scheduler holds a slot of every site's pool from the job's start to its end.
        reserved = (
            (job.finished_at - job.started_at).total_seconds()
            if job.started_at and job.finished_at
            else None
        )
        records = []
        for js in job.sites.select_related("site").order_by("site__slug"):
            row = sums.get(js.pk)
            more = extra.get(js.site.slug) or {}
            if row is None and not more:
                continue
            row = row or {}
            values = {
                "reserved_seconds": reserved,
                "rounds": row.get("rounds") or 0,
                "cpu_seconds": (row.get("cpu") or 0.0) + float(more.get("cpu_seconds", 0.0)),
                "wall_seconds": (row.get("wall") or 0.0) + float(more.get("wall_seconds", 0.0)),
                "examples": (row.get("train") or 0)
                + (row.get("evaluated") or 0)
                + int(more.get("examples", 0)),
                "bytes_received": (row.get("received") or 0) + int(more.get("bytes_received", 0)),
                "bytes_sent": (row.get("sent") or 0) + int(more.get("bytes_sent", 0)),
                "cores": js.cores,
                "memory_gib": js.memory_gib,
                "gpus": js.gpus,
            }
            # Energy and emissions (issue 15): metered CPU seconds at the pool's power draw and
            # the grid's carbon intensity during the run.
            figures = (
                site_energy(
                    site=js.site,
                    cpu_seconds=values["cpu_seconds"],
                    start=job.started_at,
                    end=job.finished_at,
                )
                if job.started_at and job.finished_at
                else None
            )
            if figures is not None:
                values["energy_kwh"], _, values["emissions_g"] = figures
            record, created = UsageRecord.objects.update_or_create(
                job=job, site=js.site, defaults=values
            )
            if created:
                ledger_append(kind="usage", record=_ledger_record(record, job))
                audit_record(
                    by=None,
                    action="usage.record",
                    target=record,
                    institution=js.site.institution,
                    job=job.pk,
                    site=js.site.slug,
                )
            records.append(record)
        return records
