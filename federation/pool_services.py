"""Writes of compute pools: settings and calendars by the institution's admins, carbon readings
(CSV upload or a provider's forecast), health from the SuperLink, and capacity and health read by
the pool's adapter (``federation.pool_adapters``). Each write is one transaction with its audit
event (an adapter read audits only a change of health)."""

from __future__ import annotations

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from federation import carbon, pool_adapters, superlink
from federation.models import CarbonReading, ComputePool
from portal.permissions import can
from portal.services import audit_record


class PoolError(Exception):
    """A pool write is refused (permission, bad input)."""


def _check(by, pool: ComputePool) -> None:
    if not can(by, "pool.manage", pool):
        raise PoolError("only the pool's institution admins may change it")


@transaction.atomic
def pool_create(*, by, site, form) -> ComputePool:
    """Save a valid ``PoolCreateForm`` as a new pool of ``site`` (a site may have several, e.g.
    a CPU pool and a GPU pool: the scheduler picks the one that meets each request), with an
    audit event. Raises ``PoolError`` unless ``by`` administers the site's institution."""
    if not can(by, "institution.admin", site.institution):
        raise PoolError("only the site's institution admins may add a pool")
    pool = form.save(commit=False)
    pool.site = site
    pool.save()
    audit_record(
        by=by,
        action="pool.create",
        target=pool,
        institution=site.institution,
        pool=pool.name,
        site=site.slug,
        cores=pool.cores,
        memory_gib=str(pool.memory_gib),
        gpus=pool.gpus,
        gpu_model=pool.gpu_model,
    )
    return pool


@transaction.atomic
def pool_update(*, by, pool: ComputePool, form, formsets: list) -> ComputePool:
    """Save a valid ``ComputePoolForm`` and its inline formsets (windows, price bands,
    exceptions) together, with one audit event listing the changed fields."""
    _check(by, pool)
    pool = form.save(commit=False)
    if {"adapter", "slurm_partition", "slurm_conf"} & set(form.changed_data):
        # a reading of another partition (or of none) must not stand for this one
        pool.health, pool.health_reason, pool.read_at, pool.reading = "", "", None, {}
    pool.save()
    form.save_m2m()
    for formset in formsets:
        formset.instance = pool
        formset.save()
    audit_record(
        by=by,
        action="pool.update",
        target=pool,
        institution=pool.institution,
        fields=sorted(form.changed_data),
        calendars=[fs.prefix for fs in formsets if fs.has_changed()],
    )
    return pool


@transaction.atomic
def carbon_readings_store(
    *, by, pool: ComputePool, readings: list, source: str, forecast: bool = False
) -> int:
    """Insert or replace ``readings`` (``[(aware datetime, g/kWh), …]``) of ``pool``; returns
    how many. ``by=None`` for the periodic provider fetch."""
    if by is not None:
        _check(by, pool)
    for at, value in readings:
        CarbonReading.objects.update_or_create(
            pool=pool,
            at=at,
            defaults={"g_per_kwh": value, "source": source, "forecast": forecast},
        )
    audit_record(
        by=by,
        action="pool.carbon_import",
        target=pool,
        institution=pool.institution,
        source=source,
        readings=len(readings),
    )
    return len(readings)


def carbon_csv_import(*, by, pool: ComputePool, data: bytes) -> int:
    """Parse an uploaded CSV (``carbon.parse_csv``) and store it; raises ``carbon.CarbonError``
    (nothing stored) on a bad file."""
    readings = carbon.parse_csv(data)
    return carbon_readings_store(by=by, pool=pool, readings=readings, source="csv")


def carbon_forecast_fetch(*, pool: ComputePool) -> int:
    """Fetch and store the forecast of a pool whose source is a provider; raises
    ``carbon.CarbonError``."""
    name = pool.carbon_provider.upper()
    points = carbon.forecast(
        pool.carbon_provider,
        pool.carbon_zone,
        base_url=getattr(settings, f"FRP_CARBON_{name}_URL", ""),
        token=getattr(settings, f"FRP_CARBON_{name}_TOKEN", ""),
    )
    return carbon_readings_store(
        by=None, pool=pool, readings=points, source=pool.carbon_provider, forecast=True
    )


def pool_health_refresh(*, conn: superlink.Connection) -> int:
    """Set each pool's ``node_online`` / ``last_seen_at`` from the SuperNodes the SuperLink
    reports (``selectors.supernode_states``: the site a node serves by its registered name, the
    local federation's record, or the latest job that discovered it). Returns the number of pools
    updated; raises ``superlink.SuperLinkError`` when the SuperLink does not answer."""
    from federation.selectors import supernode_states

    states = supernode_states(connection=conn)
    if states["error"]:
        raise superlink.SuperLinkError(states["error"])
    by_site: dict[str, dict] = {}
    for row in states["nodes"]:  # online first: an online node of a site wins
        if row["site"] and row["site"] not in by_site:
            by_site[row["site"]] = row
    updated = 0
    for pool in ComputePool.objects.select_related("site"):
        row = by_site.get(pool.site.slug)
        if row is None:
            continue
        pool.node_online = row["status"] == "online"
        pool.last_seen_at = row["last_seen"] or pool.last_seen_at
        pool.save(update_fields=["node_online", "last_seen_at"])
        updated += 1
    return updated


#: Pools read per periodic refresh, least recently read first (20 × two scontrol calls of at
#: most FRP_SLURM_TIMEOUT_SECONDS stay below the task's soft time limit).
READ_BATCH = 20


def pool_adapter(pool: ComputePool) -> pool_adapters.PoolAdapter:
    """The adapter a pool's settings name (``static`` or ``slurm``); raises
    ``pool_adapters.AdapterError`` for an unusable setting (e.g. a bad partition name)."""
    if pool.adapter == "slurm":
        return pool_adapters.SlurmAdapter(
            partition=pool.slurm_partition,
            conf=pool.slurm_conf,
            timeout=float(getattr(settings, "FRP_SLURM_TIMEOUT_SECONDS", 10.0)),
            scontrol=getattr(settings, "FRP_SLURM_SCONTROL", "scontrol"),
        )
    return pool_adapters.StaticAdapter(
        cores=pool.cores,
        memory_gib=float(pool.memory_gib),
        gpus=pool.gpus,
        gpu_model=pool.gpu_model,
    )


def pool_reading_refresh(*, pool: ComputePool, by=None) -> pool_adapters.Reading | None:
    """Read ``pool``'s capacity and health through its adapter and store them (``health``,
    ``health_reason``, ``read_at``, ``reading``); a failed read is stored as health ``down``
    with the error as its reason and no capacity. Returns the reading (``None`` when it
    failed). Never raises for the batch system's faults; the read runs outside any transaction
    (it may take up to the adapter's timeout) and the store is one short update. ``by``: the
    admin who asked for the read (``PoolError`` unless they manage the pool); ``None`` for the
    periodic refresh."""
    if by is not None:
        _check(by, pool)
    try:
        reading = pool_adapter(pool).read()
    except pool_adapters.AdapterError as exc:
        reading = None
        health, reason, stored, at = "down", str(exc), {}, timezone.now()
    else:
        health, reason, stored, at = (
            reading.health.value,
            reading.reason,
            reading.to_json(),
            reading.read_at,
        )
    with transaction.atomic():
        before = (
            ComputePool.objects.select_for_update()
            .filter(pk=pool.pk)
            .values_list("health", "health_reason")
            .first()
        )
        if before is None:  # deleted meanwhile
            return reading
        ComputePool.objects.filter(pk=pool.pk).update(
            health=health, health_reason=reason, read_at=at, reading=stored
        )
        if before != (health, reason):
            audit_record(
                by=by,
                action="pool.health",
                target=pool,
                institution=pool.institution,
                adapter=pool.adapter,
                health=health,
                reason=reason[:500],
            )
    pool.health, pool.health_reason, pool.read_at, pool.reading = health, reason, at, stored
    return reading


def pool_readings_refresh(*, batch: int = READ_BATCH) -> int:
    """Periodic: read up to ``batch`` pools whose adapter is not static, least recently read
    first; returns how many were read."""
    pools = (
        ComputePool.objects.exclude(adapter="static")
        .select_related("site__institution")
        .order_by(models.F("read_at").asc(nulls_first=True), "pk")[:batch]
    )
    n = 0
    for pool in pools:
        pool_reading_refresh(pool=pool)
        n += 1
    return n
