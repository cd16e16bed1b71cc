"""Benchmark of the scheduler: the portal's own pure function (``federation.scheduling.schedule``)
replayed on generated workloads, against first come, first served on the same input.

Run from the repository root (a few minutes on a 2-CPU machine; no services needed)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scheduler.py [--jobs 10000] [--seed 1]

Sections (every ratio's baseline is run in this process on the same input):

1. **Demo federation**: 50 one-round jobs over the demo's three pools (2 slots, 8 cores each),
   each job on 2 or 3 of the sites (seeded), 60–80 s each (the measured one-round time).
   FCFS (``Config(order="fifo", backfill=False)``: submission order, a job never overtaken on
   a pool it shares with an earlier waiting job — what ``federation/scheduler.py`` did) against
   the multifactor scheduler with EASY backfill, then the same with the pools described by their
   resources (a slot per core, each job 1 core per site): makespan and core utilisation.
2. **Federation of 50 pools, two weeks**: ``--jobs`` jobs (default 10,000) from 10 institutions
   (5 pools each; 32, 64 or 128 cores, a slot per 4 cores; a third lend only nights 18–08 h and
   weekends). Arrivals: Poisson over 12 days with a diurnal rate (peak 14 h, trough 2 h, ratio
   3:1). Each job: 1–4 pools (gang), 2^U(0..4) cores per pool, GiB = 4 × cores, duration
   lognormal (median 1 h, σ = 1.2, capped at 24 h: heavy-tailed), QoS low/normal/high 20/70/10 %,
   deadline = submission + duration + slack, slack U(12 h, 48 h). Price per core-hour per pool:
   base U(0.04, 0.12), ×1.5 from 08 to 20 h on weekdays, ×0.7 at weekends. Carbon intensity per
   institution: base U(150, 550) gCO2e/kWh × (1 − A·cos(2π(h − 13)/24)), A U(0.25, 0.55) — a
   solar midday dip — plus 5 % seeded noise; 10 W per core. Perfect forecasts, actual run time =
   estimate. The simulator steps 15 minutes, calls one scheduler pass per step on a snapshot
   with a 2-day horizon, starts what it says, and ends jobs at their durations.
   Per policy (FIFO baseline, first come first served per pool as above; then priority + backfill with every job ASAP, CHEAPEST, GREENEST):
   utilisation (busy core-hours ÷ open core-hours from the first arrival to the makespan), mean
   and p95 wait (h), deadline misses (%), cost, emissions (t CO2e), Jain's fairness index over
   institutions of their mean bounded slowdown ((wait + run)/max(run, 10 min)), and ratios;
   then a lower bound on emissions (``emissions_alone``: every job alone at its
   lowest-carbon start in its windows before its deadline, ignoring contention), with the
   pools' windows and with every pool always open: the most time shifting could save here.
3. **One pass at 10,000 queued jobs × 50 pools**, 14-day horizon at 15-minute steps, every job
   with an estimated start (``estimate_all``): CPU seconds of one pass (median of 3), per policy mix.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from federation.scheduling import (
    Account,
    Action,
    Config,
    Job,
    Policy,
    Pool,
    Resources,
    Running,
    Snapshot,
    schedule,
)

STEP = 900.0
DAY = 86400.0
FIFO = Config(order="fifo", backfill=False, preemption=False, estimate_all=False)
MULTI = Config(estimate_all=False)


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


class World:
    """Pools with full-length per-step series, jobs with arrival times and true durations."""

    def __init__(self, pools, series, jobs, accounts, steps_total):
        self.pools = pools  # list[Pool] without series
        self.series = series  # pool id → dict(available, price, carbon) arrays over all steps
        self.jobs = jobs  # list[Job] (submitted_s = arrival)
        self.accounts = accounts
        self.steps_total = steps_total


def demo_world(seed: int) -> World:
    rng = np.random.default_rng(seed)
    pools = [Pool(i, f"h{i}", Resources(8, 32, 0), slots=2) for i in (1, 2, 3)]
    jobs = []
    for k in range(50):
        n = rng.choice([2, 3])
        chosen = sorted(rng.choice([1, 2, 3], size=n, replace=False).tolist())
        jobs.append(
            Job(
                k + 1,
                f"proj{k % 3}",
                0.0 + k,  # all submitted at once, in order
                {p: Resources(1, 2, 0) for p in chosen},
                float(rng.uniform(60, 80)),
            )
        )
    accounts = {f"proj{i}": Account(f"h{i + 1}") for i in range(3)}
    steps = 10_000
    series = {p.id: {} for p in pools}
    return World(pools, series, jobs, accounts, steps)


def federation_world(n_jobs: int, seed: int) -> World:
    rng = np.random.default_rng(seed)
    steps_total = int(16 * DAY / STEP)
    hours = (np.arange(steps_total) * STEP / 3600.0) % 24
    weekday = ((np.arange(steps_total) * STEP // DAY).astype(int)) % 7  # day 0 is a Monday
    weekend = weekday >= 5
    pools, series = [], {}
    inst_carbon = {}
    for inst in range(10):
        base = rng.uniform(150, 550)
        amp = rng.uniform(0.25, 0.55)
        noise = 1 + 0.05 * rng.standard_normal(steps_total)
        inst_carbon[inst] = base * (1 - amp * np.cos(2 * np.pi * (hours - 13) / 24)) * noise
    for pid in range(1, 51):
        inst = (pid - 1) // 5
        cores = int(rng.choice([32, 64, 128]))
        nights_only = rng.random() < 1 / 3
        avail = (hours >= 18) | (hours < 8) | weekend if nights_only else np.ones(steps_total, bool)
        base = rng.uniform(0.04, 0.12)
        price = base * np.where(weekend, 0.7, np.where((hours >= 8) & (hours < 20), 1.5, 1.0))
        pools.append(Pool(pid, f"inst{inst}", Resources(cores, 4.0 * cores, 0), slots=cores // 4))
        series[pid] = {"available": avail, "price": price, "carbon": inst_carbon[inst]}
    # Arrivals: Poisson with a diurnal rate, thinned from a homogeneous process.
    span = 12 * DAY
    arrivals = []
    while len(arrivals) < n_jobs:
        t = rng.uniform(0, span, size=n_jobs * 2)
        h = (t / 3600.0) % 24
        rate = (2 + np.cos(2 * np.pi * (h - 14) / 24)) / 3  # 1 at 14 h, 1/3 at 2 h
        keep = rng.random(len(t)) < rate
        arrivals.extend(t[keep].tolist())
    arrivals = sorted(arrivals[:n_jobs])
    accounts = {}
    for inst in range(10):
        for j in range(3):
            accounts[f"i{inst}p{j}"] = Account(f"inst{inst}")
    jobs = []
    for k, t in enumerate(arrivals):
        n = int(rng.integers(1, 5))
        chosen = rng.choice(50, size=n, replace=False) + 1
        demands = {}
        for p in chosen.tolist():
            cores = int(2 ** rng.integers(0, 5))
            demands[p] = Resources(cores, 4.0 * cores, 0)
        dur = float(min(24 * 3600, 3600 * math.exp(rng.normal(0, 1.2))))
        dur = max(dur, 300.0)
        slack = rng.uniform(12, 48) * 3600
        proj = f"i{int(rng.integers(0, 10))}p{int(rng.integers(0, 3))}"
        jobs.append(
            Job(
                k + 1,
                proj,
                float(t),
                demands,
                dur,
                deadline_s=float(t + dur + slack),
                qos=str(rng.choice(["low", "normal", "high"], p=[0.2, 0.7, 0.1])),
            )
        )
    return World(pools, series, jobs, accounts, steps_total)


# --------------------------------------------------------------------------------------------
# Simulator
# --------------------------------------------------------------------------------------------


def simulate(world, config, policy, *, step_s: float, horizon: int, progress: bool = False):
    """Replay ``world`` through ``schedule``; return per-job (start, end) and pass times."""
    jobs = sorted(world.jobs, key=lambda j: j.submitted_s)
    if policy is not None:
        jobs = [replace(j, policy=policy) for j in jobs]
    pending = list(jobs)
    queued: dict[int, Job] = {}
    running: dict[int, Running] = {}
    start: dict[int, float] = {}
    refused: set[int] = set()
    step = 0
    pass_cpu = []
    nxt = 0
    while nxt < len(pending) or queued or running:
        now = step * step_s
        for jid in [j for j, r in running.items() if r.end_s <= now + 1e-6]:
            del running[jid]
        while nxt < len(pending) and pending[nxt].submitted_s <= now:
            queued[pending[nxt].id] = pending[nxt]
            nxt += 1
        if queued:
            snap = Snapshot(
                now_s=now,
                pools=[_with_series(p, world.series[p.id], step, horizon) for p in world.pools],
                queued=list(queued.values()),
                running=list(running.values()),
                accounts=world.accounts,
                step_s=step_s,
                horizon_steps=horizon,
            )
            t0 = time.process_time()
            decisions = schedule(snap, config)
            pass_cpu.append(time.process_time() - t0)
            for d in decisions:
                if d.action is Action.START:
                    j = queued.pop(d.job_id)
                    start[j.id] = now
                    running[j.id] = Running(j.id, j.project, j.demands, now, now + j.duration_s)
                elif d.action is Action.REFUSE:
                    queued.pop(d.job_id)
                    refused.add(d.job_id)
        step += 1
        if progress and step % 96 == 0:
            print(
                f"    … day {step // 96}: {len(queued)} queued, {len(running)} running, "
                f"{sum(pass_cpu):.0f} s in passes",
                file=sys.stderr,
                flush=True,
            )
        if step > 20 * world.steps_total:
            raise RuntimeError("the simulation does not drain")
    return jobs, start, refused, pass_cpu


def _with_series(pool: Pool, series: dict, step: int, horizon: int) -> Pool:
    if not series:
        return pool
    sl = slice(step, step + horizon)
    return replace(
        pool,
        available=series["available"][sl],
        price=series["price"][sl],
        carbon=series["carbon"][sl],
    )


def metrics(world: World, jobs, start, refused, step_s: float):
    pools = {p.id: p for p in world.pools}
    first = min(j.submitted_s for j in jobs)
    ends = [start[j.id] + j.duration_s for j in jobs if j.id in start]
    makespan = max(ends) - first
    busy = sum(r.cores * j.duration_s for j in jobs if j.id in start for r in j.demands.values())
    open_core_s = 0.0
    lo, hi = int(first // step_s), int(math.ceil((first + makespan) / step_s))
    for p in world.pools:
        avail = world.series[p.id].get("available")
        n_open = (hi - lo) if avail is None else int(np.asarray(avail[lo:hi]).sum())
        if avail is not None and hi > len(avail):
            n_open += hi - len(avail)
        open_core_s += p.capacity.cores * n_open * step_s
    waits = np.array([start[j.id] - j.submitted_s for j in jobs if j.id in start]) / 3600
    late = sum(
        1
        for j in jobs
        if j.id in start and j.deadline_s and start[j.id] + j.duration_s > j.deadline_s + 1e-6
    )
    cost = emissions = 0.0
    for j in jobs:
        if j.id not in start:
            continue
        a = int(round(start[j.id] / step_s))
        n = max(1, math.ceil(j.duration_s / step_s))
        frac = j.duration_s / (n * step_s)
        for pid, r in j.demands.items():
            s = world.series[pid]
            if not s:
                continue
            hours = step_s / 3600 * frac
            cost += r.cores * float(np.sum(s["price"][a : a + n])) * hours
            kw = r.cores * pools[pid].watts_per_core / 1000
            emissions += kw * float(np.sum(s["carbon"][a : a + n])) * hours
    slow: dict[str, list[float]] = {}
    for j in jobs:
        if j.id in start:
            inst = world.accounts[j.project].institution
            run = j.duration_s
            slow.setdefault(inst, []).append((start[j.id] - j.submitted_s + run) / max(run, 600.0))
    x = np.array([statistics.fmean(v) for v in slow.values()])
    jain = float(x.sum() ** 2 / (len(x) * (x**2).sum()))
    return {
        "makespan_h": makespan / 3600,
        "util": busy / open_core_s if open_core_s else 0.0,
        "wait_mean_h": float(waits.mean()),
        "wait_p95_h": float(np.percentile(waits, 95)),
        "late_pct": 100.0 * late / max(1, len(start)),
        "cost": cost,
        "co2_t": emissions / 1e6,
        "jain": jain,
        "refused": len(refused),
    }


def emissions_alone(
    world: World, step_s: float, *, earliest: bool = False, all_open: bool = False
) -> float:
    """Emissions (t CO2e) of ``world``'s jobs each run alone (no contention for capacity).

    Default: a lower bound on the emissions of any schedule that meets every deadline that can
    be met — each job at its lowest-carbon start on the grid at or after its arrival, inside its
    pools' windows for the whole run and ending by its deadline; a job that has no such start
    counts at its lowest-carbon start in its windows, deadline ignored (time shifting's optimum
    without contention, after Wiesner et al., Middleware 2021, section 4). ``earliest``: each
    job at its earliest start in its windows instead (ASAP without contention, the reference
    for a world no run simulates). ``all_open``: every pool lent at every step (what the windows
    cost time shifting). A run's emissions are reckoned as in ``metrics`` (power × intensity per
    step × the share of the last step used); starts are searched within the simulated weeks
    (``world.steps_total`` steps); a job with no start there counts 0.
    """
    pools = {p.id: p for p in world.pools}
    cum_carbon, cum_closed = {}, {}
    for pid, s in world.series.items():
        carbon = np.asarray(s["carbon"], dtype=float)
        closed = np.zeros(len(carbon)) if all_open else ~np.asarray(s["available"], dtype=bool)
        cum_carbon[pid] = np.concatenate([[0.0], np.cumsum(carbon)])
        cum_closed[pid] = np.concatenate([[0], np.cumsum(closed)])
    total = 0.0
    for j in world.jobs:
        n = max(1, math.ceil(j.duration_s / step_s))
        hours = step_s / 3600 * j.duration_s / (n * step_s)
        first = math.ceil(j.submitted_s / step_s - 1e-9)
        starts = np.arange(first, world.steps_total - n + 1)
        ok = np.ones(len(starts), dtype=bool)
        grams = np.zeros(len(starts))
        for pid, r in j.demands.items():
            kw = r.cores * pools[pid].watts_per_core / 1000
            ok &= cum_closed[pid][starts + n] == cum_closed[pid][starts]
            grams += kw * (cum_carbon[pid][starts + n] - cum_carbon[pid][starts]) * hours
        timely = ok & (starts * step_s + j.duration_s <= (j.deadline_s or math.inf) + 1e-6)
        pick = ok if earliest or not timely.any() else timely
        if pick.any():
            total += float(grams[pick.argmax()] if earliest else grams[pick].min())
    return total / 1e6


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def section_demo(seed: int) -> None:
    print("== 1. Demo federation: 50 one-round jobs over 3 pools (2 slots each) ==")
    w = demo_world(seed)
    out = {}
    by_cores = World(
        [replace(p, slots=p.capacity.cores) for p in w.pools],
        w.series,
        w.jobs,
        w.accounts,
        w.steps_total,
    )
    arms = (
        ("FCFS", FIFO, w),
        ("multifactor+EASY", MULTI, w),
        ("… by cores", MULTI, by_cores),
    )
    for name, cfg, world in arms:
        jobs, start, refused, _ = simulate(world, cfg, None, step_s=5.0, horizon=240)
        ends = [start[j.id] + j.duration_s for j in jobs]
        makespan = max(ends)
        core_s = sum(j.duration_s * r.cores for j in jobs for r in j.demands.values())
        util = core_s / (makespan * sum(p.capacity.cores for p in world.pools))
        out[name] = (makespan, util)
        print(f"  {name:18s} makespan {makespan / 60:6.1f} min   core utilisation {util:6.1%}")
    m0, u0 = out["FCFS"]
    for name in ("multifactor+EASY", "… by cores"):
        m1, u1 = out[name]
        print(f"  {name}: makespan {m1 / m0:.3f}× FCFS, utilisation {u1 / u0:.3f}× FCFS")


def section_federation(n_jobs: int, seed: int) -> None:
    print(f"\n== 2. {n_jobs} jobs over 50 pools, two weeks (simulated, 15-min steps) ==")
    w = federation_world(n_jobs, seed)
    rows = {}
    runs = (
        ("FIFO", FIFO, Policy.ASAP),
        ("ASAP", MULTI, Policy.ASAP),
        ("CHEAPEST", MULTI, Policy.CHEAPEST),
        ("GREENEST", MULTI, Policy.GREENEST),
    )
    head = (
        f"  {'policy':9s} {'util':>6s} {'wait mean h':>11s} {'p95 h':>7s} {'late %':>7s} "
        f"{'cost':>9s} {'t CO2e':>7s} {'Jain':>5s} {'pass ms (mean/max)':>19s}"
    )
    print(head)
    for name, cfg, pol in runs:
        jobs, start, refused, cpu = simulate(w, cfg, pol, step_s=STEP, horizon=192, progress=True)
        m = metrics(w, jobs, start, refused, STEP)
        m["pass_ms"] = (1000 * statistics.fmean(cpu), 1000 * max(cpu))
        rows[name] = m
        print(
            f"  {name:9s} {m['util']:6.1%} {m['wait_mean_h']:11.2f} {m['wait_p95_h']:7.2f} "
            f"{m['late_pct']:7.2f} {m['cost']:9.0f} {m['co2_t']:7.3f} {m['jain']:5.3f} "
            f"{m['pass_ms'][0]:9.1f}/{m['pass_ms'][1]:.0f}",
            flush=True,
        )
    f, a = rows["FIFO"], rows["ASAP"]
    print(
        f"  utilisation ASAP/FIFO {a['util'] / f['util']:.3f}× "
        f"({100 * (a['util'] / f['util'] - 1):+.1f} %), mean wait {a['wait_mean_h'] / f['wait_mean_h']:.3f}×"
    )
    for name in ("CHEAPEST", "GREENEST"):
        r = rows[name]
        print(
            f"  {name} vs ASAP: cost {100 * (r['cost'] / a['cost'] - 1):+.1f} %, "
            f"emissions {100 * (r['co2_t'] / a['co2_t'] - 1):+.1f} %, "
            f"deadline misses {r['late_pct']:.2f} %"
        )
    bound, alone = emissions_alone(w, STEP), emissions_alone(w, STEP, earliest=True)
    bound_open = emissions_alone(w, STEP, all_open=True)
    alone_open = emissions_alone(w, STEP, earliest=True, all_open=True)
    print(
        f"  GREENEST lower bound (a bound, not a run): {bound:.3f} t CO2e, "
        f"{100 * (bound / a['co2_t'] - 1):+.1f} % vs ASAP "
        f"({100 * (bound / alone - 1):+.1f} % vs each job alone at its earliest start); "
        f"with every pool always open {bound_open:.3f} t, "
        f"{100 * (bound_open / alone_open - 1):+.1f} % vs each job alone at its earliest start\n"
        "    (bound: each job alone at its lowest-carbon start in its pools' windows before its "
        "deadline, ignoring contention; no schedule meeting the deadlines emits less)"
    )


def section_pass(n_jobs: int, seed: int) -> None:
    print(f"\n== 3. One pass: {n_jobs} queued jobs × 50 pools, 14-day horizon, all estimated ==")
    w = federation_world(n_jobs, seed)
    horizon = int(14 * DAY / STEP)
    pools = [_with_series(p, w.series[p.id], 0, horizon) for p in w.pools]
    for name, pol in (("ASAP", Policy.ASAP), ("GREENEST", Policy.GREENEST), ("mixed", None)):
        queued = [
            replace(
                j,
                submitted_s=-j.submitted_s,
                deadline_s=(j.deadline_s or 0) - j.submitted_s,
                policy=pol if pol is not None else list(Policy)[j.id % 3],
            )
            for j in w.jobs
        ]
        snap = Snapshot(
            now_s=0.0,
            pools=pools,
            queued=queued,
            accounts=w.accounts,
            step_s=STEP,
            horizon_steps=horizon,
        )
        times = []
        for _ in range(3):
            t0 = time.process_time()
            decisions = schedule(snap, Config())
            times.append(time.process_time() - t0)
        started = sum(d.action is Action.START for d in decisions)
        print(
            f"  {name:9s} one pass {statistics.median(times):.3f} s CPU "
            f"(median of 3; {started} started, {len(decisions)} decisions)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sections", default="123")
    args = parser.parse_args()
    if "1" in args.sections:
        section_demo(args.seed)
    if "2" in args.sections:
        section_federation(args.jobs, args.seed)
    if "3" in args.sections:
        section_pass(args.jobs, args.seed)


if __name__ == "__main__":
    main()
