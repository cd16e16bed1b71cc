"""Golden decisions of the pure scheduler (``federation.scheduling.schedule``), issue 15.

The scheduler's decisions on seeded snapshots were recorded from the code before it was made
faster, and recorded again when time-shifted jobs began to reserve their chosen start and keep a
margin before their deadline (``recorded/scheduling_golden.json.gz``; ADR 0020: 3,156 of the
8,700 bench decisions, 791 of 9,279 rich and 26 of 1,745 small changed then, none in the
all-ASAP or first-come-first-served passes), and again when a time-shifted job stopped
preempting for its own later hours (ADR 0035's amendment: 256 rich and 17 small), and when the
EASY head began to hold a start whose run ends past the horizon (ADR 0020's amendment: 8 small);
every pass must still give them, field for
field: action, reason, priority, (estimated) start and end, cost, energy, emissions, lateness,
detail, the pools chosen and the job a preemption is for. Floats are compared exactly (a faster
pass must not change the arithmetic that picks a start).

Snapshots (all built here from seeds, no Django):

- ``bench-*``: the benchmark's federation (``benchmarks/scheduler.py``, section 3: 50 pools of
  10 institutions, a third lent only nights and weekends, diurnal prices and carbon, every job
  with a deadline) with 300 and 2,500 queued jobs, a 14-day horizon at 15-minute steps, every
  job estimated, all ASAP, CHEAPEST, GREENEST and a mix;
- ``rich-*``: 14 pools with GPUs (two models), several pools per site (``alternatives``), a pool
  whose batch system lends half its cores (``usable``), an offline pool, demand pricing, foreign
  windows, quotas, project budgets and job caps, running jobs of which some are preemptible,
  high-QoS jobs, jobs too large, on unknown pools or on none, runs longer than the horizon;
  under every ``Config`` the portal and the benchmark use (priority or FIFO order, backfill or
  not, preemption or not, estimates or not);
- ``small-*``: 240 random snapshots of 1–4 pools and 1–12 jobs over 24 steps, with the same
  features drawn at random (the shape of ``test_scheduling_properties``).

To record again after an intended change of decisions (say why in the commit)::

    PYTHONPATH=$PWD .venv/bin/python tests/federation/test_scheduling_golden.py
"""

from __future__ import annotations

import functools
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from federation.scheduling import (
    Account,
    Config,
    DemandPricing,
    Job,
    Policy,
    Pool,
    Resources,
    Running,
    Snapshot,
    Weights,
    schedule,
)

GOLDEN = Path(__file__).parent / "recorded" / "scheduling_golden.json.gz"
STEP = 900.0
DAY = 86400.0

CONFIGS = {
    "default": Config(),
    "no-estimates": Config(estimate_all=False),
    "fcfs": Config(order="fifo", backfill=False, preemption=False, estimate_all=False),
    "fifo-backfill": Config(order="fifo"),
    "no-backfill": Config(backfill=False),
    "no-preemption": Config(preemption=False),
    "age-first": Config(weights=Weights(age=20000.0, fairshare=10.0, max_age_s=2 * DAY)),
}


# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------


def bench_snapshot(n_jobs: int, seed: int, mix: str) -> Snapshot:
    """Section 3 of ``benchmarks/scheduler.py`` (its generator, copied so that a change of the
    benchmark's workload does not change the golden decisions): ``n_jobs`` queued, 50 pools,
    14 days of 15-minute steps. ``mix``: a ``Policy`` value, or ``"mixed"`` (by job id)."""
    rng = np.random.default_rng(seed)
    steps = int(14 * DAY / STEP)
    hours = (np.arange(steps) * STEP / 3600.0) % 24
    weekend = ((np.arange(steps) * STEP // DAY).astype(int)) % 7 >= 5
    carbon = {}
    for inst in range(10):
        base, amp = rng.uniform(150, 550), rng.uniform(0.25, 0.55)
        noise = 1 + 0.05 * rng.standard_normal(steps)
        carbon[inst] = base * (1 - amp * np.cos(2 * np.pi * (hours - 13) / 24)) * noise
    pools = []
    for pid in range(1, 51):
        inst = (pid - 1) // 5
        cores = int(rng.choice([32, 64, 128]))
        nights = rng.random() < 1 / 3
        avail = (hours >= 18) | (hours < 8) | weekend if nights else np.ones(steps, bool)
        base = rng.uniform(0.04, 0.12)
        price = base * np.where(weekend, 0.7, np.where((hours >= 8) & (hours < 20), 1.5, 1.0))
        pools.append(
            Pool(
                pid,
                f"inst{inst}",
                Resources(cores, 4.0 * cores, 0),
                slots=cores // 4,
                available=avail,
                price=price,
                carbon=carbon[inst],
            )
        )
    accounts = {f"i{i}p{j}": Account(f"inst{i}") for i in range(10) for j in range(3)}
    queued = []
    for k in range(n_jobs):
        t = float(rng.uniform(0, 12 * DAY))
        chosen = rng.choice(50, size=int(rng.integers(1, 5)), replace=False) + 1
        demands = {}
        for p in chosen.tolist():
            cores = int(2 ** rng.integers(0, 5))
            demands[p] = Resources(cores, 4.0 * cores, 0)
        dur = max(300.0, float(min(24 * 3600, 3600 * math.exp(rng.normal(0, 1.2)))))
        slack = float(rng.uniform(12, 48)) * 3600
        project = f"i{int(rng.integers(0, 10))}p{int(rng.integers(0, 3))}"
        qos = str(rng.choice(["low", "normal", "high"], p=[0.2, 0.7, 0.1]))
        policy = list(Policy)[(k + 1) % 3] if mix == "mixed" else Policy(mix)
        queued.append(
            Job(k + 1, project, -t, demands, dur, policy, deadline_s=dur + slack, qos=qos)
        )
    return Snapshot(0.0, pools, queued, accounts=accounts, step_s=STEP, horizon_steps=steps)


def rich_snapshot(rng: np.random.Generator, *, n_pools: int, n_jobs: int, steps: int) -> Snapshot:
    """A random snapshot with every feature the scheduler has (module docstring)."""
    now = 1_700_000_000.0
    insts = ["a", "b", "c", "d"][: max(1, min(4, n_pools // 2 + 1))]
    models = ["A100", "V100"]
    pools = []
    for pid in range(1, n_pools + 1):
        inst = insts[(pid - 1) % len(insts)]
        gpus = int(rng.choice([0, 0, 2, 4]))
        cores = int(rng.choice([4, 8, 16, 32]))
        window = rng.random(steps) < 0.7
        kind = rng.random()
        pools.append(
            Pool(
                pid,
                inst,
                Resources(cores, float(4 * cores), gpus),
                slots=int(rng.integers(1, 5)),
                gpu_model=str(rng.choice(models)) if gpus else "",
                available=None if kind < 0.4 else window.tolist(),
                foreign_available=(rng.random(steps) < 0.5).tolist() if kind > 0.8 else None,
                price=(rng.uniform(0.01, 0.2, steps) if rng.random() < 0.8 else None),
                carbon=(rng.uniform(50, 700, int(rng.integers(1, steps + 1))).tolist()),
                cpu_weight=float(rng.choice([1.0, 0.5])),
                memory_weight=float(rng.choice([0.0, 0.25])),
                gpu_weight=float(rng.choice([0.0, 8.0])),
                online=bool(rng.random() > 0.1),
                down_reason="batch system: 3 nodes down" if rng.random() < 0.5 else "",
                demand_pricing=DemandPricing(0.5, 1.0, 2.0) if rng.random() < 0.3 else None,
                usable=(
                    Resources(cores // 2, float(2 * cores), gpus // 2)
                    if rng.random() < 0.15
                    else None
                ),
            )
        )
    by_inst: dict[str, list[int]] = {}
    for p in pools:
        by_inst.setdefault(p.institution, []).append(p.id)
    projects = [f"{i}{k}" for i in insts for k in range(2)]
    accounts = {}
    for name in projects:
        quotas = {}
        if rng.random() < 0.3:
            pid = int(rng.integers(1, n_pools + 1))
            cap = pools[pid - 1].capacity
            quotas[pid] = Resources(max(1, cap.cores // 2), cap.memory_gib / 2, cap.gpus)
        accounts[name] = Account(
            name[0],
            shares=float(rng.choice([0.0, 1.0, 2.0, 5.0]) if rng.random() < 0.9 else 1.0),
            usage=float(rng.uniform(0, 100)) if rng.random() < 0.7 else 0.0,
            budget_remaining=float(rng.uniform(0, 40)) if rng.random() < 0.4 else None,
            quotas=quotas,
        )
    shares = {i: float(rng.choice([1.0, 2.0, 3.0])) for i in insts if rng.random() < 0.5}

    def request(pid: int, big: bool = False) -> Resources:
        cap = pools[pid - 1].capacity
        if big:
            return Resources(cap.cores + 1, cap.memory_gib, 0)
        cores = int(rng.integers(0, cap.cores + 1))
        gpus = int(rng.integers(0, cap.gpus + 1)) if cap.gpus and rng.random() < 0.5 else 0
        return Resources(cores, float(rng.integers(0, int(cap.memory_gib) + 1)), gpus)

    def demands(big: bool = False) -> dict[int, Resources]:
        n = int(rng.integers(1, min(3, n_pools) + 1))
        chosen = sorted(rng.choice(n_pools, size=n, replace=False) + 1)
        return {int(p): request(int(p), big and k == 0) for k, p in enumerate(chosen)}

    running = []
    for k in range(int(rng.integers(0, max(2, n_pools)))):
        dem = demands()
        running.append(
            Running(
                10_000 + k,
                str(rng.choice(projects)),
                dem,
                now - float(rng.uniform(0, 3 * DAY)),
                now + float(rng.uniform(-STEP, (steps + 4) * STEP)),
                qos=str(rng.choice(["low", "normal", "high"], p=[0.5, 0.4, 0.1])),
                preemptible=bool(rng.random() < 0.5),
            )
        )
    queued = []
    for k in range(n_jobs):
        odd = rng.random()
        if odd < 0.03:
            dem: dict[int, Resources] = {}
        elif odd < 0.06:
            dem = {n_pools + 7: Resources(1, 1.0, 0)}
        else:
            dem = demands(big=odd < 0.1)
        alternatives = {}
        for key in dem:
            others = (
                [p for p in by_inst[pools[key - 1].institution] if p != key]
                if key <= n_pools
                else []
            )
            if others and rng.random() < 0.5:
                alternatives[key] = tuple(int(p) for p in rng.permutation(others))
        gpu_model = ""
        if any(r.gpus for r in dem.values()) and rng.random() < 0.5:
            gpu_model = str(rng.choice(models))
        duration = float(
            rng.choice([60.0, 300.0, STEP, float(rng.uniform(60, 10 * STEP)), (steps + 2) * STEP])
        )
        queued.append(
            Job(
                k + 1,
                str(rng.choice(projects + ["stranger"]))
                if rng.random() < 0.05
                else str(rng.choice(projects)),
                now - float(rng.uniform(0, 4 * DAY)),
                dem,
                duration,
                Policy(str(rng.choice(list(Policy)))),
                deadline_s=(
                    None
                    if rng.random() < 0.3
                    else now + duration + float(rng.uniform(-STEP, steps * STEP))
                ),
                budget_cap=float(rng.uniform(0, 10)) if rng.random() < 0.25 else None,
                qos=str(rng.choice(["low", "normal", "high", "unknown"], p=[0.3, 0.4, 0.25, 0.05])),
                preemptible=bool(rng.random() < 0.2),
                gpu_model=gpu_model,
                alternatives=alternatives,
            )
        )
    return Snapshot(
        now,
        pools,
        queued,
        running,
        accounts,
        institution_shares=shares,
        step_s=STEP,
        horizon_steps=steps,
    )


@functools.cache
def golden_cases() -> list[tuple[str, Snapshot, Config]]:
    """``(name, snapshot, config)`` of every recorded pass, in a fixed order (built once)."""
    return list(_cases())


def _cases():
    for n in (300, 2500):
        for mix in ("asap", "cheapest", "greenest", "mixed"):
            if n == 2500 and mix == "cheapest":
                continue  # the mix covers it; keeps the recording small
            yield f"bench-{n}-{mix}", bench_snapshot(n, 7, mix), CONFIGS["default"]
    for seed in range(6):
        rng = np.random.default_rng(1000 + seed)
        snap = rich_snapshot(rng, n_pools=14, n_jobs=120 + 40 * seed, steps=192)
        for name, config in CONFIGS.items():
            yield f"rich-{seed}-{name}", snap, config
    names = list(CONFIGS)
    for seed in range(240):
        rng = np.random.default_rng(seed)
        snap = rich_snapshot(
            rng, n_pools=int(rng.integers(1, 5)), n_jobs=int(rng.integers(1, 13)), steps=24
        )
        name = names[seed % len(names)]
        yield f"small-{seed}-{name}", snap, CONFIGS[name]


# --------------------------------------------------------------------------------------------
# Recording and comparing
# --------------------------------------------------------------------------------------------


def as_row(d) -> list:
    """A decision as JSON-able values (floats kept exact: JSON writes ``repr``)."""
    return [
        d.job_id,
        d.action.value,
        d.reason.value,
        d.priority,
        d.start_s,
        d.end_s,
        d.cost,
        d.energy_kwh,
        d.emissions_g,
        d.late,
        d.detail,
        sorted([int(k), int(v)] for k, v in d.pools.items()),
        d.for_job,
    ]


def record(path: Path = GOLDEN) -> None:
    out = {name: [as_row(d) for d in schedule(s, c)] for name, s, c in golden_cases()}
    text = json.dumps(out, separators=(",", ":"))
    path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))  # the same bytes each time


@pytest.fixture(scope="module")
def golden() -> dict[str, list]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as f:
        return json.load(f)


def test_golden_recording_covers_every_case(golden):
    assert list(golden) == [name for name, _, _ in golden_cases()]
    actions = {row[1] for rows in golden.values() for row in rows}
    reasons = {row[2] for rows in golden.values() for row in rows}
    # The recording exercises every action and the reasons a pass can give.
    assert actions == {"start", "plan", "wait", "refuse", "preempt"}
    assert {
        "None",
        "Resources",
        "Priority",
        "Window",
        "Budget",
        "NodeDown",
        "DeadlineUnreachable",
        "TimeShift",
        "Quota",
        "Preempted",
    } <= reasons


def test_schedule_gives_the_golden_decisions(golden):
    for name, snap, config in golden_cases():
        got = [as_row(d) for d in schedule(snap, config)]
        want = golden[name]
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            assert g == w, f"{name}: job {w[0]}"


if __name__ == "__main__":
    record()
    print(f"recorded {GOLDEN}")
