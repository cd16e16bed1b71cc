"""Writes of metered usage: one ``UsageRecord`` per (job, site, run), appended once to the ledger.

Sources: each site's ``SiteRoundMetric`` rows of the run (ClientApp metering of the train and
evaluate messages of every round it trained) plus the site's share of the contribution evaluation
(``job.final_metrics["contribution"]["sites"]``), which is work the site did for this job too.

A job resumed from its round checkpoint (``federation.services.job_resume``) runs again: its
runs are numbered 1, 2, … (:func:`run_ordinal`), and each run's record meters only the rounds
that run trained — those after the round it resumed from (``job.resume_round``) — so the records
of a job sum to all the work done, each piece once (ADR 0028).
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Q, Sum

from accounting.models import UsageRecord
from accounting.runs import runs_of
from federation.models import FederatedJob, SiteRoundMetric
from federation.selectors import site_energy
from portal.ledger.leaves import commitment
from portal.ledger.services import ledger_append
from portal.services import audit_record


class UsageError(Exception):
    """Usage cannot be recorded for this job (yet)."""


def _dec(value: float, places: int = 6) -> str:
    """A float (seconds) as a Decimal string with ``places`` decimals, for the ledger leaf."""
    return str(Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-places)))


def run_ordinal(job: FederatedJob) -> int:
    """The ordinal of ``job``'s current (or last) run: 1 for its first Flower run, + 1 for each
    time it was resumed (``job.earlier_runs`` holds the run ids before the current one)."""
    return runs_of(job)


def _ledger_record(record: UsageRecord, job: FederatedJob, examples_commitment: str) -> dict:
    """The usage leaf. Examples appear only as a salted commitment: every institution reads the
    ledger, and ``examples`` = rounds × (train + test rows) + test rows gives away a site's exact
    row count, which others see only under the profile's disclosure rule (hostile re-test of
    issue 9, finding 5). The exact figure and the salt stay in the usage record and its audit
    event, for the site's stewards and the parties."""
    return {
        "job": job.pk,
        "site": record.site.slug,
        "run": record.run,
        "flower_run": record.flower_run_id,
        "rounds": record.rounds,
        "cpu_seconds": _dec(record.cpu_seconds),
        "wall_seconds": _dec(record.wall_seconds),
        "examples_commitment": examples_commitment,
        "bytes_received": record.bytes_received,
        "bytes_sent": record.bytes_sent,
        "cores": record.cores,
        "memory_gib": str(Decimal(record.memory_gib).quantize(Decimal("0.001"))),
        "gpus": record.gpus,
        "energy_wh": _dec((record.energy_kwh or 0.0) * 1000, 3),
        "emissions_g": _dec(record.emissions_g or 0.0, 3),
    }


def usage_record_job(*, job: FederatedJob) -> list[UsageRecord]:
    """Sum the metering of one finished job's last run into one ``UsageRecord`` per site.

    The run is the job's current one (``run`` = :func:`run_ordinal`, ``flower_run_id`` =
    ``job.flower_run_id``, ``ended_at`` = ``job.finished_at``), and its rounds are those after
    ``job.resume_round`` (all of them for a job never resumed): the rounds up to the checkpoint
    were trained, and recorded, by the earlier runs. Per site: ``rounds`` = rounds of the run it
    completed (``ok``); ``cpu_seconds``/``wall_seconds`` (seconds), ``examples`` (train +
    evaluation examples), ``bytes_received``/``bytes_sent`` (bytes of model ArrayRecords, see
    ``SiteRoundMetric``) summed over every round of the run it replied to, plus its part of the
    contribution evaluation; ``reserved_seconds`` = the run's start to its end; ``energy_kwh`` =
    (CPU seconds × the pool's W per core + reserved GPUs × ``reserved_seconds`` × W per GPU) ÷
    3.6e6 and ``emissions_g`` = that × the pool's mean intensity over the run
    (``federation.selectors.site_energy``). Sites with no
    metered round and no contribution work get no record. ``flower_*`` stay null: flwr 1.42
    reports compute time and traffic only per run (kept in ``job.final_metrics["flower"]``),
    never per site.

    Idempotent (``update_or_create`` on (job, site, run) under a lock on the job row): each
    record is appended to the ledger (``kind="usage"``, floats as Decimal strings) only when
    first created; a second call returns the same records and appends nothing. Returns the
    records ordered by site slug.

    Raises ``UsageError`` when the job has not finished (its figures could still change), or
    when a record of this run number holds another Flower run (nothing is overwritten).
    """
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job.pk)
        if not job.is_terminal:
            raise UsageError(f"job {job.pk} is {job.status}; usage is recorded once it has ended")
        run = run_ordinal(job)
        other = (
            UsageRecord.objects.filter(job=job, run=run)
            .exclude(flower_run_id__in=["", job.flower_run_id])
            .first()
        )
        if other is not None and job.flower_run_id:
            raise UsageError(
                f"job {job.pk}: run {run} is recorded as Flower run {other.flower_run_id}, "
                f"not {job.flower_run_id}"
            )
        extra = (job.final_metrics.get("contribution") or {}).get("sites") or {}
        sums = {
            row["job_site"]: row
            for row in SiteRoundMetric.objects.filter(job_site__job=job, round__gt=job.resume_round)
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
        for js in job.sites.select_related("site", "pool").order_by("site__slug"):
            row = sums.get(js.pk)
            more = extra.get(js.site.slug) or {}
            if row is None and not more:
                continue
            row = row or {}
            values = {
                "flower_run_id": job.flower_run_id,
                "ended_at": job.finished_at,
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
            # Energy and emissions (issue 15): metered CPU seconds at the pool's W per core, and
            # the reserved GPUs for the held time (the ClientApp meters no GPU time; a GPU is
            # held for the whole run) at its W per GPU, times the grid's intensity during the run.
            figures = (
                site_energy(
                    site=js.site,
                    pool=js.pool,
                    cpu_seconds=values["cpu_seconds"],
                    gpu_seconds=js.gpus * (reserved or 0.0),
                    start=job.started_at,
                    end=job.finished_at,
                )
                if job.started_at and job.finished_at
                else None
            )
            if figures is not None:
                values["energy_kwh"], _, values["emissions_g"] = figures
            record, created = UsageRecord.objects.update_or_create(
                job=job, site=js.site, run=run, defaults=values
            )
            if created:
                committed, salt = commitment(str(record.examples))
                ledger_append(kind="usage", record=_ledger_record(record, job, committed))
                audit_record(
                    by=None,
                    action="usage.record",
                    target=record,
                    institution=js.site.institution,
                    job=job.pk,
                    site=js.site.slug,
                    run=run,
                    examples=record.examples,
                    examples_salt=salt,
                )
            records.append(record)
        return records
