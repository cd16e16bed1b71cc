"""Writes of compute pools: settings and calendars by the institution's admins, carbon readings
(CSV upload or a provider's forecast), and health from the SuperLink. Each write is one
transaction with its audit event."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from federation import carbon, superlink
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
    pool = form.save()
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
