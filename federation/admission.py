"""Admission of queued jobs: the portal's side of the pure scheduler (``federation.scheduling``).

``snapshot_build`` reads pools (resources, windows, price bands, carbon readings, health), the
running and queued jobs and the projects' allocations into a ``scheduling.Snapshot``;
``schedule_pass`` runs one pass under a lock on every pool row (so two passes never hand out the
same capacity), records each queued job's reason code, priority and estimates, refuses the jobs
the scheduler refuses, and returns the ids to start. ``federation.services.job_launch`` launches a
job only when the pass says START; the periodic reconcile runs a pass and queues the others.

A site may have several pools (e.g. a CPU pool and a GPU pool): a queued job's request at a site
is keyed by the site's first pool (by id) with its other pools as ``alternatives``; the pure
scheduler picks the pool that meets the request (``scheduling.scheduler.pool_choices``) and
``job_launch`` records it on the ``JobSite`` (``pool_of_sites``). A running job holds the pool
recorded on its ``JobSite`` (the site's first pool for a row without one).
A pool read from a batch system (``ComputePool.adapter``, ADR 0034) gives the scheduler its last
stored reading (``pool_capacity``): fewer usable cores when nodes are down or busy, ``NodeDown``
when none is usable, the read failed or is stale.

Preemption (ADR 0035): a running job whose run is being stopped for a preemption is left out of
the snapshot (its resources are promised to the job it was stopped for), a START on a pool it
still holds waits for the next pass, and a preempted job waits out of the pass until the job it
was stopped for has started. ``services.job_launch`` marks and stops the PREEMPT jobs.
Grid: ``FRP_SCHED_STEP_SECONDS`` (default 300 s) over ``FRP_SCHED_HORIZON_HOURS`` (default 168 h).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from federation import scheduling
from federation.models import (
    ComputePool,
    FederatedJob,
    JobStatus,
    PoolQuota,
    ProjectAllocation,
    SchedulePolicy,
)
from federation.scheduling import calendar
from federation.scheduling.priority import decayed_usage

#: Fair-share usage decays with this half-life (Slurm ``PriorityDecayHalfLife``, default 7 days).
USAGE_HALF_LIFE = timedelta(days=7)


def grid() -> tuple[float, int]:
    """``(step seconds, horizon steps)`` of the plan."""
    step = float(getattr(settings, "FRP_SCHED_STEP_SECONDS", 300))
    hours = float(getattr(settings, "FRP_SCHED_HORIZON_HOURS", 168))
    return step, int(hours * 3600 / step)


def _pools_of_site() -> dict[int, list[ComputePool]]:
    """Site id → its pools, by id (the first is the key of a request at the site)."""
    out: dict[int, list[ComputePool]] = {}
    for pool in ComputePool.objects.select_related("site__institution").order_by("pk"):
        out.setdefault(pool.site_id, []).append(pool)
    return out


def site_requests(
    site_demands: dict[int, scheduling.Resources], site_pools: dict[int, list[ComputePool]]
) -> tuple[dict[int, scheduling.Resources], dict[int, tuple[int, ...]]]:
    """``(demands, alternatives)`` of a request per site (site id → resources): each keyed by the
    site's first pool, the site's other pools as alternatives; sites without a pool are left out."""
    demands, alternatives = {}, {}
    for site_id, r in site_demands.items():
        pools = site_pools.get(site_id) or []
        if not pools:
            continue
        demands[pools[0].pk] = r
        if len(pools) > 1:
            alternatives[pools[0].pk] = tuple(p.pk for p in pools[1:])
    return demands, alternatives


def pool_of_sites(
    decision: scheduling.Decision, site_pools: dict[int, list[ComputePool]] | None = None
) -> dict[int, int]:
    """Site id → pool id chosen by ``decision`` (``Decision.pools``' values mapped to sites)."""
    site_pools = _pools_of_site() if site_pools is None else site_pools
    site_of = {p.pk: site_id for site_id, pools in site_pools.items() for p in pools}
    return {site_of[pid]: pid for pid in decision.pools.values() if pid in site_of}


def pool_series(pool: ComputePool, *, start: datetime, steps: int, step_s: float) -> dict:
    """Per-step availability (``available``, ``foreign_available``), price and carbon of a pool."""
    windows = list(pool.windows.all())
    exceptions = [calendar.Exception_(e.start, e.end, e.available) for e in pool.exceptions.all()]

    def spans(foreign: bool):
        return [
            calendar.WeeklySpan(w.weekday, w.start_minute, w.end_minute)
            for w in windows
            if w.foreign_only == foreign
        ]

    kw = {"start": start, "steps": steps, "step_s": step_s, "tz": pool.time_zone}
    available = calendar.availability(spans(False), exceptions, always=pool.always_available, **kw)
    foreign = (
        calendar.availability(spans(True), exceptions, **kw)
        if any(w.foreign_only for w in windows)
        else None
    )
    bands = [
        calendar.PriceBand(
            calendar.WeeklySpan(b.weekday, b.start_minute, b.end_minute), float(b.price)
        )
        for b in pool.price_bands.all()
    ]
    price = calendar.time_of_use(bands, float(pool.base_price), **kw)
    readings = [
        (r.at, r.g_per_kwh)
        for r in pool.carbon_readings.filter(at__lt=start + timedelta(seconds=steps * step_s))
        .order_by("at")
        .only("at", "g_per_kwh")
    ]
    # only the latest reading before the start matters for the first step
    before = [r for r in readings if r[0] <= start]
    readings = before[-1:] + [r for r in readings if r[0] > start]
    carbon = calendar.intensity(
        readings, start=start, steps=steps, step_s=step_s, default=pool.carbon_default
    )
    return {"available": available, "foreign_available": foreign, "price": price, "carbon": carbon}


def reading_max_age() -> timedelta:
    """How old a batch system's reading may be before the pool counts as down
    (``FRP_POOL_READING_MAX_AGE_SECONDS``, default 900 s: three refreshes of the beat task)."""
    return timedelta(seconds=float(getattr(settings, "FRP_POOL_READING_MAX_AGE_SECONDS", 900)))


def pool_capacity(
    pool: ComputePool, *, now: datetime
) -> tuple[scheduling.Resources, scheduling.Resources | None, bool, str]:
    """``(capacity, usable, online, down_reason)`` of a pool for the scheduler.

    Static adapter: the pool's figures, all usable, online unless its SuperNode is offline.
    Slurm adapter: the pool's figures are the most it lends; ``capacity`` is the smaller of them
    and the partition's total (jobs beyond it are refused), ``usable`` the smaller of them and
    what the partition's usable nodes have free (jobs beyond it wait); the pool is down when the
    last read failed or found no usable node (its reason), is older than ``reading_max_age()``,
    or was never made.
    """
    lent = scheduling.Resources(pool.cores, float(pool.memory_gib), pool.gpus)
    online = pool.node_online is not False
    reason = "" if online else "SuperNode offline"
    if pool.adapter != "slurm":
        return lent, None, online, reason
    from federation.pool_adapters import Capacity

    def smaller(c: Capacity) -> scheduling.Resources:
        return scheduling.Resources(
            min(lent.cores, c.cores),
            min(lent.memory_gib, c.memory_gib),
            min(lent.gpus, c.gpu_count(pool.gpu_model)),
        )

    total = Capacity.from_json(pool.reading.get("total") or {})
    free = Capacity.from_json(pool.reading.get("free") or {})
    where = f"Slurm partition {pool.slurm_partition}"
    if pool.read_at is None:
        return lent, scheduling.Resources(), False, f"{where} not read yet"
    if now - pool.read_at > reading_max_age():
        age = int((now - pool.read_at).total_seconds() // 60)
        problem = f"{where} last read {age} min ago"
        return lent, scheduling.Resources(), False, problem
    if pool.health != "up":
        return lent, scheduling.Resources(), False, f"{where} {pool.health}: {pool.health_reason}"
    if not pool.reading.get("total"):
        return lent, scheduling.Resources(), False, f"{where}: no capacity read"
    return smaller(total), smaller(free), online, reason


def _scheduling_pool(pool: ComputePool, series: dict, now: datetime) -> scheduling.Pool:
    capacity, usable, online, down_reason = pool_capacity(pool, now=now)
    return scheduling.Pool(
        id=pool.pk,
        institution=pool.site.institution.slug,
        capacity=capacity,
        usable=usable,
        down_reason=down_reason,
        slots=pool.slots,
        gpu_model=pool.gpu_model,
        available=series["available"],
        foreign_available=series["foreign_available"],
        price=series["price"],
        carbon=series["carbon"],
        cpu_weight=float(pool.cpu_weight),
        memory_weight=float(pool.memory_weight),
        gpu_weight=float(pool.gpu_weight),
        watts_per_core=pool.watts_per_core,
        watts_per_gpu=pool.watts_per_gpu,
        online=online,
        demand_pricing=(
            scheduling.DemandPricing(pool.demand_elasticity, pool.price_floor, pool.price_cap)
            if pool.demand_pricing
            else None
        ),
    )


def _resources(js) -> scheduling.Resources:
    return scheduling.Resources(js.cores, float(js.memory_gib), js.gpus)


def _held(job: FederatedJob, site_pools: dict[int, list[ComputePool]]):
    """A running job's demands: pool id → resources, on the pool recorded per site (else the
    site's first)."""
    out = {}
    for js in job.sites.all():
        pools = site_pools.get(js.site_id) or []
        pool_id = js.pool_id if js.pool_id in {p.pk for p in pools} else None
        if pool_id is None and pools:
            pool_id = pools[0].pk
        if pool_id is not None:
            out[pool_id] = _resources(js)
    return out


def _epoch(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt is not None else None


def job_request(job: FederatedJob, site_pools: dict[int, list[ComputePool]]) -> scheduling.Job:
    """The scheduler's view of a queued job (``site_pools``: site id → its pools by id)."""
    demands, alternatives = site_requests(
        {js.site_id: _resources(js) for js in job.sites.all()}, site_pools
    )
    return scheduling.Job(
        id=job.pk,
        project=job.project.slug,
        submitted_s=job.created_at.timestamp(),
        demands=demands,
        alternatives=alternatives,
        duration_s=float(job.estimated_seconds),
        policy=scheduling.Policy(job.policy),
        deadline_s=_epoch(job.deadline),
        budget_cap=float(job.budget_cap) if job.budget_cap is not None else None,
        qos=job.qos,
        preemptible=job.preemptible,
    )


def _accounts(projects, now: datetime) -> dict[str, scheduling.Account]:
    allocations = {a.project_id: a for a in ProjectAllocation.objects.filter(project__in=projects)}
    quotas: dict[int, dict[int, scheduling.Resources]] = {}
    for q in PoolQuota.objects.filter(project__in=projects):
        quotas.setdefault(q.project_id, {})[q.pool_id] = scheduling.Resources(
            q.cores, float(q.memory_gib), q.gpus
        )
    out = {}
    since = now - 8 * USAGE_HALF_LIFE
    for project in projects:
        # A QUEUED job with a start is a resumed or preempted one waiting to run again: its
        # earlier run's end is no longer on the row, and counting to ``now`` would charge the
        # project for the time it waits (ADR 0035).
        done = (
            FederatedJob.objects.filter(
                project=project, started_at__isnull=False, started_at__gte=since
            )
            .exclude(status=JobStatus.QUEUED)
            .prefetch_related("sites")
        )
        records = []
        for j in done:
            end = j.finished_at or now
            hours = max(0.0, (end - j.started_at).total_seconds()) / 3600
            records.append((end.timestamp(), hours * sum(s.cores for s in j.sites.all())))
        usage = decayed_usage(
            records, now_s=now.timestamp(), half_life_s=USAGE_HALF_LIFE.total_seconds()
        )
        alloc = allocations.get(project.pk)
        remaining = None
        if alloc is not None and alloc.budget is not None:
            spent = FederatedJob.objects.filter(project=project, started_at__isnull=False).exclude(
                status=JobStatus.QUEUED
            ).aggregate(s=Sum("est_cost"))["s"] or Decimal("0")
            remaining = float(alloc.budget - spent)
        out[project.slug] = scheduling.Account(
            institution=project.institution.slug,
            shares=float(alloc.shares) if alloc else 1.0,
            usage=usage,
            budget_remaining=remaining,
            quotas=quotas.get(project.pk, {}),
        )
    return out


def snapshot_build(*, now: datetime | None = None, extra: list[scheduling.Job] = ()):
    """The scheduler's snapshot of the federation now (and ``extra`` hypothetical jobs).

    Left out: running jobs being stopped for a preemption (``preempt_requested_at``), and queued
    preempted jobs whose preemptor (``preempted_by``) is still queued (ADR 0035)."""
    now = now or timezone.now()
    step, steps = grid()
    site_pools = _pools_of_site()
    pools = [
        _scheduling_pool(p, pool_series(p, start=now, steps=steps, step_s=step), now)
        for p in ComputePool.objects.select_related("site__institution").prefetch_related(
            "windows", "exceptions", "price_bands"
        )
    ]
    active = list(
        FederatedJob.objects.filter(status__in=JobStatus.active())
        .select_related("project__institution")
        .prefetch_related("sites")
        .order_by("created_at", "pk")
    )
    running = []
    queued = []
    waiting = {j.pk for j in active if j.status == JobStatus.QUEUED}
    for job in active:
        if job.status == JobStatus.QUEUED:
            if job.preempted_by_id in waiting:
                continue  # preempted: the job it was stopped for takes the resources first
            queued.append(job_request(job, site_pools))
        elif job.preempt_requested_at is not None:
            continue  # its run is being stopped: what it holds is promised to its preemptor
        else:
            started = job.started_at or now
            end = max(
                started + timedelta(seconds=job.estimated_seconds), now + timedelta(seconds=1)
            )
            running.append(
                scheduling.Running(
                    id=job.pk,
                    project=job.project.slug,
                    demands=_held(job, site_pools),
                    started_s=started.timestamp(),
                    end_s=end.timestamp(),
                    qos=job.qos,
                    preemptible=job.preemptible,
                )
            )
    projects = {j.project for j in active}
    from portal.models import Project

    extra = list(extra)
    if extra:
        projects |= set(Project.objects.filter(slug__in={j.project for j in extra}))
    projects = list(
        Project.objects.filter(pk__in=[p.pk for p in projects]).select_related("institution")
    )
    return scheduling.Snapshot(
        now_s=now.timestamp(),
        pools=pools,
        queued=queued + extra,
        running=running,
        accounts=_accounts(projects, now),
        step_s=step,
        horizon_steps=steps,
    )


def _dt(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, tz=UTC) if seconds is not None else None


def _explain(d: scheduling.Decision, policy: str = "") -> str:
    texts = {
        scheduling.Reason.RESOURCES: "waiting for resources on its pools",
        scheduling.Reason.PRIORITY: "resources are held for higher-priority jobs",
        scheduling.Reason.WINDOW: "a pool is not lent at this time (availability window)",
        scheduling.Reason.BUDGET: "over budget",
        scheduling.Reason.NODE_DOWN: "a pool is down (SuperNode offline or its nodes down)",
        scheduling.Reason.DEADLINE: "cannot finish before its deadline",
        scheduling.Reason.TIME_SHIFT: "waiting for the cheapest / lowest-carbon start",
        scheduling.Reason.QUOTA: "the project's quota on a pool is used up",
    }
    text = texts.get(d.reason, "")
    if d.reason is scheduling.Reason.TIME_SHIFT and policy in ("cheapest", "greenest"):
        text = (
            "waiting for the "
            + ("cheapest start" if policy == "cheapest" else "lowest-carbon start")
            + " before the deadline"
        )
    if d.detail:
        text = f"{text}: {d.detail}" if text else d.detail
    if d.start_s is not None and d.action is not scheduling.Action.START:
        text += f"; estimated start {_dt(d.start_s):%Y-%m-%d %H:%M} UTC"
    return text


def stopping_pools() -> dict[int, set[int]]:
    """Running jobs whose Flower run is being stopped for a preemption (``preempt_requested_at``
    set) → the pool ids they still hold until the SuperLink reports the run ended."""
    site_pools = _pools_of_site()
    return {
        job.pk: set(_held(job, site_pools))
        for job in FederatedJob.objects.filter(
            status__in=[JobStatus.LAUNCHING, JobStatus.RUNNING], preempt_requested_at__isnull=False
        ).prefetch_related("sites")
    }


def _hold_until_stopped(
    decisions: dict[int, scheduling.Decision], snap: scheduling.Snapshot
) -> None:
    """Turn each START on a pool that a preempted run still holds into a WAIT (in place).

    The scheduler counts a preempted job's resources as free (PREEMPT decisions of this pass,
    and runs already being stopped, which ``snapshot_build`` leaves out): they are free only
    once the SuperLink reports the run ended, so a job starting there waits for the next pass.
    """
    held = stopping_pools()
    demands = {r.id: set(r.demands) for r in snap.running}
    for d in decisions.values():
        if d.action is scheduling.Action.PREEMPT:
            held[d.job_id] = demands.get(d.job_id, set())
    for job_id, d in list(decisions.items()):
        if d.action is not scheduling.Action.START:
            continue
        waits_for = sorted(pk for pk, pools in held.items() if pools & set(d.pools.values()))
        if waits_for:
            decisions[job_id] = replace(
                d,
                action=scheduling.Action.WAIT,
                reason=scheduling.Reason.RESOURCES,
                detail="the run of preempted job "
                + ", ".join(f"#{pk}" for pk in waits_for)
                + " is being stopped",
            )


def preempted_text(job: FederatedJob) -> str:
    """Why a QUEUED preempted job waits, in one clause (``""`` for a job never preempted)."""
    if job.preempted_by_id is None:
        return ""
    start = (
        f"from its round-{job.resume_round} checkpoint"
        if job.resume_round
        else "from round 0 (no checkpoint had been saved)"
    )
    return f"preempted for job #{job.preempted_by_id} (higher QoS); resumes {start}"


@transaction.atomic
def schedule_pass(*, now: datetime | None = None) -> dict[int, scheduling.Decision]:
    """One scheduler pass over the real queue; returns job id → decision.

    Locks every pool row first (passes are serialised), writes each queued job's reason,
    priority and estimates (a REFUSED job's too: its reason code and, refused for its budget cap,
    the cost of its cheapest start); the caller fails the REFUSED jobs with the reason. START
    jobs are left QUEUED: the caller launches them (``job_launch``); so are PREEMPT decisions
    (running jobs to stop, ``services.job_launch``). A START on a pool a preempted run still
    holds is returned as a WAIT (``_hold_until_stopped``). A queued job that was preempted keeps
    the reason ``Preempted`` until it starts again; one whose preemptor has not started yet is
    not in the pass at all (``snapshot_build``).
    """
    list(ComputePool.objects.select_for_update().order_by("pk").values_list("pk", flat=True))
    now = now or timezone.now()
    snap = snapshot_build(now=now)
    decisions = {d.job_id: d for d in scheduling.schedule(snap)}
    _hold_until_stopped(decisions, snap)
    queued_ids = {j.id for j in snap.queued}
    jobs = FederatedJob.objects.in_bulk(list(queued_ids))
    for job_id, d in decisions.items():
        job = jobs.get(job_id)
        if job is None or d.action is scheduling.Action.PREEMPT:
            continue
        preempted = job.preempted_by_id is not None and d.action is not scheduling.Action.START
        job.sched_reason = "" if d.action is scheduling.Action.START else str(d.reason)
        if preempted:
            job.sched_reason = str(scheduling.Reason.PREEMPTED)
        job.sched_priority = d.priority
        job.est_start = _dt(d.start_s)
        job.est_end = _dt(d.end_s)
        job.est_cost = Decimal(str(round(d.cost, 4))) if d.cost is not None else None
        job.est_energy_kwh = d.energy_kwh
        job.est_emissions_g = d.emissions_g
        fields = ["sched_reason", "sched_priority", "est_start", "est_end", "est_cost"]
        fields += ["est_energy_kwh", "est_emissions_g"]
        if d.action is scheduling.Action.REFUSE:
            # The caller refuses it (``services.job_launch``: admission imports no service); the
            # reason code and the figures (a cap's cheapest cost) stay on the job for its page.
            job.save(update_fields=fields)
            continue
        if d.action is not scheduling.Action.START:
            job.status_detail = _explain(d, job.policy)
            if preempted:
                job.status_detail = f"{preempted_text(job)}; {job.status_detail}"
            fields.append("status_detail")
        job.save(update_fields=fields)
    return decisions


# ---------------------------------------------------------------------------------------------
# Estimates before submission
# ---------------------------------------------------------------------------------------------


#: A job's fixed cost in seconds (launch, the preparation queries, the closing evaluation) and each
#: fused round's (train message with the previous model's evaluation, ADR 0032), before any history:
#: the demo job (5 rounds, 3 sites, 455 rows) posted round 1 at 34.5 s and round 5 at 59.1 s and
#: ended at 65.2 s, i.e. (59.1 − 34.5) / 4 ≈ 6.2 s a round and 65.2 − 5 × 6.2 ≈ 34 s fixed.
FIXED_SECONDS = 34.0
ROUND_SECONDS = 6.2


def duration_estimate(*, model: str, num_rounds: int, local_epochs: int, rows: int) -> float:
    """Estimated run time in seconds of a job of ``num_rounds`` rounds.

    Without history: ``FIXED_SECONDS + rounds × (ROUND_SECONDS + epochs × rows × 2 µs)``, the
    fixed and per-round costs measured here (see the constants) plus training at ~0.5 M
    example-epochs per second. With at least three finished jobs of the same model (the newest
    20): when their round counts differ, the least-squares line ``seconds = a + b × rounds``
    through them (``numpy.polyfit``), used when both ``a`` and ``b`` come out positive; otherwise
    ``FIXED_SECONDS`` plus the median of their seconds per round after the fixed cost.
    """
    history = list(
        FederatedJob.objects.filter(
            model=model,
            status=JobStatus.COMPLETED,
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        .order_by("-finished_at")
        .values_list("started_at", "finished_at", "num_rounds")[:20]
    )
    if len(history) >= 3:
        rounds = [max(1, n) for _, _, n in history]
        seconds = [(f - s).total_seconds() for s, f, _ in history]
        if len(set(rounds)) >= 2:
            slope, intercept = np.polyfit(rounds, seconds, 1)
            if slope > 0 and intercept > 0:
                return float(intercept + slope * num_rounds)
        per_round = sorted(
            max(0.0, t - FIXED_SECONDS) / n for t, n in zip(seconds, rounds, strict=True)
        )
        return FIXED_SECONDS + num_rounds * per_round[len(per_round) // 2]
    return FIXED_SECONDS + num_rounds * (ROUND_SECONDS + local_epochs * rows * 2e-6)


def job_duration_estimate(*, model: str, num_rounds: int, local_epochs: int, versions) -> float:
    """``duration_estimate`` of a job of model kind ``model`` (``FederatedJob.model``: ``linear``,
    ``mlp``, ``xgboost``) on the dataset ``versions`` it trains on, with their rows as released
    (``sandbox.profile.released_count``: the estimate is shown to researchers on the job form and
    the job page, and exact rows in it would give a site's row count back; issue 9, finding 5)."""
    from sandbox.profile import released_count

    rows = max((released_count(int(v.row_count or 0)) for v in versions), default=0)
    return duration_estimate(
        model=model, num_rounds=num_rounds, local_epochs=local_epochs, rows=rows
    )


def policy_estimates(
    *,
    project,
    site_demands: dict[int, scheduling.Resources],
    duration_s: float,
    deadline: datetime | None,
    budget_cap: Decimal | None,
    qos: str = "normal",
) -> dict[str, scheduling.Decision]:
    """For each policy, the decision the scheduler would make for this job if it were submitted
    now (``site_demands``: site id → resources). Reads the live queue; writes nothing."""
    demands, alternatives = site_requests(site_demands, _pools_of_site())
    now = timezone.now()
    probe = scheduling.Job(
        id=-1,
        project=project.slug,
        submitted_s=now.timestamp(),
        demands=demands,
        alternatives=alternatives,
        duration_s=duration_s,
        deadline_s=_epoch(deadline),
        budget_cap=float(budget_cap) if budget_cap is not None else None,
        qos=qos,
    )
    base = snapshot_build(now=now, extra=[probe])
    out = {}
    for policy in SchedulePolicy.values:
        snap = replace(
            base,
            queued=[*base.queued[:-1], replace(probe, policy=scheduling.Policy(policy))],
        )
        out[policy] = next(d for d in scheduling.schedule(snap) if d.job_id == -1)
    return out
