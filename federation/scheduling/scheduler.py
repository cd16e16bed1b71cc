"""One scheduler pass: a pure function from a ``Snapshot`` to a list of ``Decision``.

The same code runs in the portal (``federation.admission``) and in the simulator
(``benchmarks/scheduler.py``). No clock, no database, no randomness: the snapshot is all it reads.

Algorithm (per pass):

1. Order the queue by multifactor priority (``priority``), ties by submission time and id; or by
   submission time alone (``Config.order="fifo"``).
2. Build the availability profile: free ``(slots, cores, GiB, GPUs)`` per pool and step over the
   horizon, less the running jobs until their estimated ends; windows are masks per pool
   (``Pool.available``, plus ``Pool.foreign_available`` for projects of other institutions).
3. For each job in order, find the starts where *every* pool it asks for has its demand free and
   open for the whole run (gang admission), within the project's quota per pool.
   - ``ASAP``: the earliest such start; ``CHEAPEST`` / ``GREENEST``: the start before the deadline
     with the least cost / emissions (earliest among equals), else the earliest (``late``) —
     time shifting after Wiesner et al., "Let's Wait Awhile" (Middleware 2021), section 4. The
     chosen start keeps a safety margin before the deadline (``_Request.latest_shift``): one run
     length, but never more than half the slack (deadline − earliest feasible end), so a job
     displaced in a later pass still has time to run before its deadline.
   - A start at step 0 is START; the resources are taken from the profile.
   - EASY backfill (Lifka 1995; Mu'alem & Feitelson, IEEE TPDS 12(6), 2001): the first job that
     cannot start now (the head) gets a reservation (PLAN) at its earliest start; later jobs start
     now only where the profile *with that reservation* still has room, so backfill never delays
     the head. A time-shifted job that meets its deadline reserves its chosen start too (PLAN),
     whether or not it is the head and also when that start is its earliest: no later job, nor
     backfill, takes the capacity it waits for. Without backfill a blocked job
     stops every later job that shares one of its pools (first come, first served per pool, as
     the portal admitted jobs before this scheduler).
   - Budgets: starts whose cost exceeds ``Job.budget_cap`` are not considered; a job with none
     left is REFUSED (Budget). A job whose cost exceeds its project's remaining budget (less what
     this pass already started or planned) WAITs (Budget).
   - Preemption: a blocked job of a higher QoS may stop running preemptible jobs of a lower QoS on
     its pools (newest first) when that lets it start now.
4. Every job not started gets a reason code (``Reason``) and, with ``Config.estimate_all``, an
   estimated start on the profile as it stands when its turn comes.

Cost and emissions of a run: Σ over its pools and steps of price × service units × hours and
intensity × power × hours, scaled to ``duration_s`` (the last step is partly used).

Several pools per site (``Job.alternatives``): before a job is placed, each of its requests picks
one pool among the key's pool and its alternatives (``pool_choices``): only pools that can ever
hold the request (cores, GiB, GPUs, GPU model) are candidates, ranked best fit first (fewest
GPUs left idle, then cores, then GiB, then the order given), so a CPU job goes to a CPU pool and
a GPU job to the GPU pool. Among the combinations (at most ``MAX_POOL_CHOICES``, best fit first)
the one with the earliest feasible start on the profile as it stands wins, ties to the better
fit; ``Decision.pools`` names it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from federation.scheduling.model import (
    QOS_LEVELS,
    Action,
    Config,
    Decision,
    Job,
    Policy,
    Reason,
    Snapshot,
)
from federation.scheduling.priority import fairshare_factors, job_priority

_EPS = 1e-9

#: The most pool combinations (one pool per request) tried for one job in a pass.
MAX_POOL_CHOICES = 16


def _series(values, steps: int, default: float) -> np.ndarray:
    """``values`` as a float array of ``steps`` entries, padded with its last value."""
    if values is None or len(values) == 0:
        return np.full(steps, default, dtype=float)
    arr = np.asarray(values[:steps], dtype=float)
    if len(arr) < steps:
        arr = np.concatenate([arr, np.full(steps - len(arr), arr[-1])])
    return arr


def price_multipliers(snapshot: Snapshot, free: np.ndarray, cap: np.ndarray, open_: np.ndarray):
    """Demand-responsive price multipliers, shape ``(pools, steps)``.

    ``occupancy[p, t]`` = share of the pool's cores held by running jobs at step ``t``;
    ``backlog[p]`` = core-steps the queue asks of the pool ÷ the pool's open core-steps over the
    horizon. Multiplier = ``clip(1 + elasticity × (occupancy + backlog), low, high)`` for a pool
    with ``demand_pricing``, else 1. Scarce hours cost more, idle hours stay at the base price.
    """
    n_pools, steps = free.shape[0], free.shape[2]
    mult = np.ones((n_pools, steps))
    index = {p.id: i for i, p in enumerate(snapshot.pools)}
    want = np.zeros(n_pools)
    for job in snapshot.queued:
        d = max(1, math.ceil(job.duration_s / snapshot.step_s))
        for pid, r in job.demands.items():
            if pid in index:
                want[index[pid]] += r.cores * d
    for i, pool in enumerate(snapshot.pools):
        dp = pool.demand_pricing
        if dp is None or cap[i, 1] <= 0:
            continue
        occupancy = 1.0 - free[i, 1] / cap[i, 1]
        open_core_steps = open_[i].sum() * cap[i, 1]
        backlog = want[i] / open_core_steps if open_core_steps else 0.0
        mult[i] = np.clip(1.0 + dp.elasticity * (occupancy + backlog), dp.low, dp.high)
    return mult


class _Need:
    """What a job asks of one pool, prepared once per pass for all the jobs asking the same of
    it (internal).

    ``i``: the pool's row in the profile; ``k``: the row of its fit mask among the pool's
    (``_Profile.fit``); ``foreign``: the project is of another institution; ``opened``: bool
    ``(steps,)``, the steps the pool is lent to the project (its window, with the foreign window
    for another institution's project); ``rows``: ``((row, amount − _EPS), …)`` over ``(slots,
    cores, GiB, GPUs)`` for the amounts asked (``> 0``); ``vec``: float ``(4, 1)``, the amounts
    (a job holds one slot), ``take`` the same negated; ``su``: service units per hour; ``kw``: power
    draw (kW).
    """

    __slots__ = ("key", "i", "k", "foreign", "opened", "rows", "vec", "take", "su", "kw")

    def __init__(self, key, i: int, foreign: bool, opened: np.ndarray, x, pool) -> None:
        self.key = key
        self.i = i
        self.k = -1
        self.foreign = foreign
        self.opened = opened
        self.rows = tuple((r, v - _EPS) for r, v in enumerate(x.vector()) if v > 0)
        self.vec = np.asarray(x.vector())[:, None]
        self.take = -1.0 * self.vec
        self.su = (
            pool.cpu_weight * x.cores + pool.memory_weight * x.memory_gib + pool.gpu_weight * x.gpus
        )
        self.kw = (pool.watts_per_core * x.cores + pool.watts_per_gpu * x.gpus) / 1000.0


class _Profile:
    """The availability profile and per-pool series of one pass (internal).

    ``free``: float ``(pools, 4, steps)``, what each pool has free of ``(slots, cores, GiB,
    GPUs)`` at each step, less the running jobs and what this pass started or reserved;
    ``base_free``: the same before the pass took anything. ``price`` (currency per service unit
    per hour) and ``carbon`` (gCO2e/kWh): ``(pools, steps)``, and their running sums over the
    steps in hours (``cum_price``, ``cum_carbon``: ``(pools, steps + 1)``; ``*_rows``: the same
    as lists of Python floats, for one start at a time).

    Fit masks, kept up to date rather than computed per job: for each pool, one row per distinct
    request asked of it in this pass (amounts and whether the project is foreign there), bool
    ``fit[i]``: ``(requests, steps)``, the pool open to the project and the request free at each
    step, with the thresholds ``thr[i]`` (``(4, requests, 1)``: amount − ``_EPS``, −∞ for an
    amount of 0: no condition) and windows ``fit_open[i]`` (``(requests, steps)``); a change of
    ``free`` over ``[a, b)`` recomputes ``fit[i][:, a:b]`` only (``_refit``). Also kept: a
    ``_Need`` per pool, request and home institution (``need``); per pool the first step it is
    closed to a home or a foreign project (``first_closed``); per request the first step at which
    the running jobs alone leave too little (``base_fit_steps``).
    """

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.steps = T = int(snapshot.horizon_steps)
        self.step_s = float(snapshot.step_s)
        self.step_h = self.step_s / 3600.0
        pools = list(snapshot.pools)
        self.pools = pools
        self.index = {p.id: i for i, p in enumerate(pools)}
        self.cap = np.array(
            [[p.slots, p.capacity.cores, p.capacity.memory_gib, p.capacity.gpus] for p in pools],
            dtype=float,
        ).reshape(len(pools), 4)
        self.cap_rows = self.cap.tolist()
        usable = self.cap.copy()
        for i, p in enumerate(pools):
            if p.usable is not None:  # a batch system's reading: the rest is not lent now
                usable[i, 1:] = np.minimum(usable[i, 1:], p.usable.vector()[1:])
        self.free = np.repeat(usable[:, :, None], T, axis=2)
        self.avail = np.array(
            [_series(p.available, T, 1.0) > 0.5 for p in pools], dtype=bool
        ).reshape(len(pools), T)
        self.favail = np.array(
            [_series(p.foreign_available, T, 0.0) > 0.5 for p in pools], dtype=bool
        ).reshape(len(pools), T)
        self.open_foreign = self.avail | self.favail
        self.online = [bool(p.online) for p in pools]
        self.inst = [p.institution for p in pools]
        self.needs_known: dict[tuple, _Need] = {}
        self._fit_rows: dict[tuple, int] = {}
        self.fit: list[np.ndarray | None] = [None] * len(pools)
        self.thr: list[np.ndarray | None] = [None] * len(pools)
        self.fit_open: list[np.ndarray | None] = [None] * len(pools)
        self.fit_rows_used: list[list[int]] = [[] for _ in pools]
        self.fit_all_open: list[bool] = [True] * len(pools)
        self._base_fit: dict[tuple, int] = {}
        self.misfits: dict[tuple, str] = {}
        self.first_closed = {
            False: [_first_false(row, T) for row in self.avail],
            True: [_first_false(row, T) for row in self.open_foreign],
        }
        self.quota_free: dict[tuple[str, int], np.ndarray] = {}
        self.running_end: dict[int, int] = {}
        for run in snapshot.running:
            end = self.end_step(run.end_s)
            self.running_end[run.id] = end
            self._take(run.project, run.demands, 0, end, sign=-1.0)
        self.base_free = self.free.copy()
        mult = price_multipliers(snapshot, self.free, self.cap, self.open_foreign)
        price = np.array([_series(p.price, T, 0.0) for p in pools]).reshape(len(pools), T)
        carbon = np.array([_series(p.carbon, T, 0.0) for p in pools]).reshape(len(pools), T)
        self.price = price * mult  # currency per service unit per hour, per step
        self.carbon = carbon
        zeros = np.zeros((len(pools), 1))
        self.cum_price = np.concatenate([zeros, np.cumsum(self.price * self.step_h, axis=1)], 1)
        self.cum_carbon = np.concatenate([zeros, np.cumsum(self.carbon * self.step_h, axis=1)], 1)
        self.cum_price_rows = self.cum_price.tolist()
        self.cum_carbon_rows = self.cum_carbon.tolist()

    def end_step(self, end_s: float) -> int:
        """Steps from now until ``end_s`` (at least 1: a running job holds step 0)."""
        return min(self.steps, max(1, math.ceil((end_s - self.snapshot.now_s) / self.step_s)))

    def need(self, pid: int, x, home: str | None) -> _Need:
        """The ``_Need`` of request ``x`` (``Resources``) on pool ``pid`` (in the profile) for a
        project of institution ``home`` (``None``: no account)."""
        key = (pid, x.cores, x.memory_gib, x.gpus, home)
        need = self.needs_known.get(key)
        if need is None:
            i = self.index[pid]
            foreign = self.inst[i] != home
            opened = self.open_foreign[i] if foreign else self.avail[i]
            need = self.needs_known[key] = _Need(key, i, foreign, opened, x, self.pools[i])
            need.k = self._fit_row(need, x)
        return need

    def _fit_row(self, need: _Need, x) -> int:
        """The row of ``need``'s fit mask in ``fit[need.i]``, added when new."""
        key = (need.i, x.cores, x.memory_gib, x.gpus, need.foreign)
        k = self._fit_rows.get(key)
        if k is not None:
            return k
        i = need.i
        thr = np.array([v - _EPS if v > 0 else -np.inf for v in x.vector()])[:, None, None]
        row = need.opened[None].copy()
        for r, v in need.rows:
            row &= self.free[i, r][None] >= v
        if self.fit[i] is None:
            self.fit[i], self.thr[i], self.fit_open[i] = row, thr, need.opened[None].copy()
        else:
            self.fit[i] = np.concatenate([self.fit[i], row])
            self.thr[i] = np.concatenate([self.thr[i], thr], axis=1)
            self.fit_open[i] = np.concatenate([self.fit_open[i], need.opened[None]])
        self.fit_rows_used[i] = [r for r in range(4) if (self.thr[i][r] > -np.inf).any()]
        self.fit_all_open[i] = bool(self.fit_open[i].all())
        k = self._fit_rows[key] = len(self.fit[i]) - 1
        return k

    def _refit(self, i: int, start: int, end: int) -> None:
        """Recompute pool ``i``'s fit masks over steps ``[start, end)`` after ``free`` changed
        there (only the resource rows some request asks for; its windows unless all open)."""
        fit = self.fit[i]
        if fit is None:
            return
        free, thr = self.free[i, :, start:end], self.thr[i]
        rows = self.fit_rows_used[i]
        ok = free[rows[0]] >= thr[rows[0]]  # (requests, end − start)
        for r in rows[1:]:
            ok &= free[r] >= thr[r]
        if not self.fit_all_open[i]:
            ok &= self.fit_open[i][:, start:end]
        fit[:, start:end] = ok

    def fit_mask(self, need: _Need, n: int) -> np.ndarray:
        """Bool ``(n,)``: at each of steps ``0 … n−1`` the pool is open to the project and has
        ``need`` free (a view of the kept mask: not to be modified, nor kept past a take)."""
        return self.fit[need.i][need.k, :n]

    def base_fit_steps(self, need: _Need) -> int:
        """The first step at which the running jobs alone (``base_free``) leave less than
        ``need`` on its pool, windows aside; ``steps`` when there is none."""
        key = need.key[:4]
        first = self._base_fit.get(key)
        if first is None:
            free = self.base_free[need.i]
            ok = np.ones(self.steps, dtype=bool)
            for r, v in need.rows:
                ok &= free[r] >= v
            first = self._base_fit[key] = _first_false(ok, self.steps)
        return first

    def _quota(self, project: str, pid: int) -> np.ndarray | None:
        key = (project, pid)
        if key in self.quota_free:
            return self.quota_free[key]
        account = self.snapshot.accounts.get(project)
        if account is None or pid not in account.quotas:
            return None
        q = account.quotas[pid]
        arr = np.repeat(np.array([[q.cores], [q.memory_gib], [q.gpus]], float), self.steps, 1)
        self.quota_free[key] = arr
        return arr

    def _take(self, project: str, demands, start: int, end: int, sign: float) -> None:
        """Take (``sign`` −1) or give back (+1) ``demands`` (pool id → ``Resources``) over steps
        ``[start, end)``, on the pools and on the project's quotas there."""
        for pid, r in demands.items():
            i = self.index.get(pid)
            if i is None:
                continue
            self.free[i, :, start:end] += sign * np.asarray(r.vector())[:, None]
            self._refit(i, start, end)
            q = self._quota(project, pid)
            if q is not None:
                q[:, start:end] += sign * np.asarray(r.vector()[1:])[:, None]

    def take(self, req: _Request, start: int, end: int) -> None:
        """Take the resources of a queued job over steps ``[start, end)`` (``_take``, with the
        amounts its ``_Need`` already holds)."""
        if req.has_quota:
            self._take(req.job.project, req.job.demands, start, end, sign=-1.0)
            return
        for n in req.needs:
            self.free[n.i, :, start:end] += n.take
            self._refit(n.i, start, end)


def _first_true(mask: np.ndarray) -> int | None:
    """Index of the first ``True`` of bool ``mask``, or ``None`` when it has none."""
    if not len(mask):
        return None
    k = int(mask.argmax())
    return k if mask[k] else None


def _first_false(row: np.ndarray, steps: int) -> int:
    """Index of the first ``False`` of bool ``row``, or ``steps`` when it has none."""
    k = int(row.argmin()) if len(row) else 0
    return k if len(row) and not row[k] else steps


def _first_run(ok: np.ndarray, d: int, t: int = 0) -> int | None:
    """The first index ``t`` with ``ok[t : t + d]`` all ``True`` (bool ``ok``, ``d ≥ 1``), or
    ``None``. A few hops first (to the next ``True``, past the first ``False`` of the run from
    there), which find it in a profile with few gaps; then from the gaps between the ``False``
    steps at once. Searches from ``t`` on."""
    n = len(ok)
    for _ in range(4):
        k = _first_true(ok[t:])
        if k is None or t + k + d > n:
            return None
        t += k
        run = ok[t : t + d]
        j = int(run.argmin())
        if run[j]:
            return t
        t += j + 1
    bad = np.flatnonzero(~ok[t:]) + t
    if not len(bad):
        return t if n - t >= d else None
    begins = np.concatenate(([t], bad + 1))  # the runs of True are [begins[k], ends[k])
    ends = np.concatenate((bad, [n]))
    k = _first_true(ends - begins >= d)
    return None if k is None else int(begins[k])


def _runs(ok: np.ndarray, d: int) -> np.ndarray:
    """Bool ``(len(ok) − d + 1,)``: ``ok[t : t + d]`` is all ``True`` (``1 ≤ d ≤ len(ok)``)."""
    if d == 1:
        return ok
    m = len(ok) - d + 1
    if d <= 4:  # short runs: AND of the shifted masks (fewer array operations)
        out = ok[:m] & ok[1 : 1 + m]
        for s in range(2, d):
            out &= ok[s : s + m]
        return out
    bad = np.empty(len(ok) + 1, dtype=np.int32)
    bad[0] = 0
    np.cumsum(~ok, out=bad[1:])
    return (bad[d:] - bad[:-d]) == 0


class _Request:
    """A queued job prepared against a profile (internal): its ``_Need`` per pool (in the
    order of ``job.demands``; ``pids``, ``idx``: their pool ids and rows), its run in steps
    (``d``), the share of its last step it uses (``frac``), its energy (kWh) and its last start
    step that meets the deadline (``last_start``; ``steps`` without a deadline)."""

    __slots__ = (
        "job",
        "pids",
        "idx",
        "needs",
        "su",
        "kw",
        "has_quota",
        "d",
        "frac",
        "energy_kwh",
        "last_start",
    )

    def __init__(self, job: Job, prof: _Profile):
        self.job = job
        self.pids = pids = list(job.demands)
        account = prof.snapshot.accounts.get(job.project)
        home = account.institution if account else None
        self.has_quota = bool(account and account.quotas and any(p in account.quotas for p in pids))
        known = prof.needs_known
        self.needs = needs = []
        self.idx, self.su, self.kw = idx, su, kw = [], [], []
        for pid, x in job.demands.items():
            n = known.get((pid, x.cores, x.memory_gib, x.gpus, home)) or prof.need(pid, x, home)
            needs.append(n)
            idx.append(n.i)
            su.append(n.su)
            kw.append(n.kw)
        duration, step = job.duration_s, prof.step_s
        self.d = d = max(1, math.ceil(duration / step))
        self.frac = duration / (d * step) if duration > 0 else 0.0
        self.energy_kwh = sum(kw) * duration / 3600.0
        if job.deadline_s is None:
            self.last_start = prof.steps
        else:
            self.last_start = math.floor(
                (job.deadline_s - job.duration_s - prof.snapshot.now_s) / prof.step_s + _EPS
            )

    def latest_shift(self, prof: _Profile, first: int) -> int:
        """The last start step a time-shifted policy may choose when ``first`` (``≤
        last_start``) is the earliest feasible start: ``last_start`` less a safety margin of one
        run length (``duration_s``), but never more than half the slack (deadline − the end of a
        run started at ``first``), rounded down to the grid and never before ``first``. Without a
        deadline there is no margin (``last_start``: the horizon).

        Why: a pass's plan is not kept (the next pass plans again), so a job that waits for the
        last cheap or green start before its deadline misses it as soon as a new higher-priority
        job takes that start; the margin leaves a run length to recover in (issue 15).
        """
        job = self.job
        if job.deadline_s is None:
            return self.last_start
        now, step = prof.snapshot.now_s, prof.step_s
        slack_s = job.deadline_s - (now + first * step + job.duration_s)
        margin_s = min(job.duration_s, max(0.0, slack_s) / 2.0)
        cut = math.floor((job.deadline_s - job.duration_s - margin_s - now) / step + _EPS)
        return max(first, min(self.last_start, cut))

    def _fits(self, free: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Per step in ``[lo, hi)``: every pool is open to the job and has its demand free in
        ``free`` (``(pools, 4, steps)``, a copy of the profile's)."""
        ok = np.ones(hi - lo, dtype=bool)
        for n in self.needs:
            ok &= n.opened[lo:hi]
            for r, v in n.rows:
                ok &= free[n.i, r, lo:hi] >= v
        return ok

    def _ok(self, prof: _Profile, n: int) -> np.ndarray:
        """Bool ``(n,)``: at each of steps ``0 … n−1`` every pool is open to the job and has its
        demand free, within the project's quotas (may be a kept mask: not to be modified)."""
        needs = self.needs
        ok = prof.fit_mask(needs[0], n)
        for need in needs[1:]:
            ok = ok & prof.fit_mask(need, n)
        if self.has_quota:
            ok = ok & self._quota_ok(prof, 0, n)
        return ok

    def open_now(self, prof: _Profile) -> bool:
        """Every pool is open to the job for its whole run from now."""
        d = min(self.d, prof.steps)
        return all(prof.first_closed[n.foreign][n.i] >= d for n in self.needs)

    def _quota_ok(self, prof: _Profile, lo: int, hi: int) -> np.ndarray:
        ok = np.ones(hi - lo, dtype=bool)
        if not self.has_quota:
            return ok
        for pid in self.pids:
            q = prof._quota(self.job.project, pid)
            if q is not None:
                need = self.job.demands[pid].vector()[1:]
                for r in range(3):
                    if need[r] > 0:
                        ok &= q[r, lo:hi] >= need[r] - _EPS
        return ok

    def fits_now(self, prof: _Profile, free: np.ndarray | None = None) -> bool:
        """Whether the job fits on every pool for steps ``[0, d)`` (of ``free``, else of the
        profile)."""
        d = self.d
        if d > prof.steps:
            return False
        if free is not None:
            return bool(self._fits(free, 0, d).all()) and (
                not self.has_quota or bool(self._quota_ok(prof, 0, d).all())
            )
        return bool(self._ok(prof, d).all())

    def starts(self, prof: _Profile) -> np.ndarray:
        """Bool mask over start steps ``0 … steps−d``: the whole run fits there (gang)."""
        d, steps = self.d, prof.steps
        if d > steps:
            return np.zeros(0, dtype=bool)
        return _runs(self._ok(prof, steps), d)

    def starts_before(self, prof: _Profile, n: int) -> np.ndarray:
        """``starts(prof)[:n]``, reading only the steps those starts' runs cover."""
        d, steps = self.d, prof.steps
        n = min(n, steps - d + 1)
        if n <= 0:
            return np.zeros(0, dtype=bool)
        return _runs(self._ok(prof, n + d - 1), d)

    def earliest(self, prof: _Profile, after: int = 0) -> int | None:
        """The first step of ``starts(prof)`` (the earliest start), or ``None``; ``after``: no
        start before it fits (the search begins there)."""
        d, steps = self.d, prof.steps
        if d > steps:
            return None
        return _first_run(self._ok(prof, steps), d, after)

    def open_ended(self, prof: _Profile) -> int | None:
        """The first step ``t`` past the last whole-run start (``t > steps − d``) from which
        every step to the horizon's end fits, or ``None``: a start whose run would end beyond
        the horizon, where the profile says nothing (and so nothing against it)."""
        d, steps = self.d, prof.steps
        lo = max(0, steps - d + 1)
        ok = self._ok(prof, steps)[lo:]
        if not len(ok) or not ok[-1]:
            return None
        bad = np.flatnonzero(~ok)
        return lo + (int(bad[-1]) + 1 if len(bad) else 0)

    def _window_sums(self, cum: np.ndarray, weights: list[float], n: int) -> np.ndarray:
        """Per start step ``0 … n−1``: Σ over pools of weight × (``cum`` over the run) ×
        ``frac`` (``n ≤ steps − d + 1``)."""
        d = self.d
        out = np.zeros(n)
        for i, w in zip(self.idx, weights, strict=True):
            if w:
                out += w * (cum[i, d : d + n] - cum[i, :n])
        return out * self.frac

    def costs(self, prof: _Profile, n: int | None = None) -> np.ndarray:
        """Cost of a start at each step ``0 … steps−d`` (or the first ``n``), currency."""
        last = prof.steps - self.d + 1
        return self._window_sums(prof.cum_price, self.su, last if n is None else n)

    def emissions(self, prof: _Profile, n: int | None = None) -> np.ndarray:
        """gCO2e of a start at each step ``0 … steps−d`` (or the first ``n``)."""
        last = prof.steps - self.d + 1
        return self._window_sums(prof.cum_carbon, self.kw, last if n is None else n)

    def cost_at(self, prof: _Profile, t: int) -> float:
        """Cost of a start at step ``t`` (currency)."""
        c, e = prof.cum_price_rows, t + self.d
        return (
            sum(w * (c[i][e] - c[i][t]) for i, w in zip(self.idx, self.su, strict=True)) * self.frac
        )

    def emissions_at(self, prof: _Profile, t: int) -> float:
        """gCO2e of a start at step ``t``."""
        c, e = prof.cum_carbon_rows, t + self.d
        return (
            sum(w * (c[i][e] - c[i][t]) for i, w in zip(self.idx, self.kw, strict=True)) * self.frac
        )

    def why_not_now(self, prof: _Profile) -> Reason:
        d = min(self.d, prof.steps)
        if not self.open_now(prof):
            return Reason.WINDOW
        if self.has_quota and not self._quota_ok(prof, 0, d).all():
            return Reason.QUOTA
        if all(prof.base_fit_steps(n) >= d for n in self.needs):
            return Reason.PRIORITY
        return Reason.RESOURCES


def _order(snapshot: Snapshot, config: Config) -> list[tuple[int, Job]]:
    pools = {p.id: p for p in snapshot.pools}
    if config.order == "fifo":
        jobs = sorted(snapshot.queued, key=lambda j: (j.submitted_s, j.id))
        return [(0, j) for j in jobs]
    fs = fairshare_factors(snapshot.accounts, snapshot.institution_shares)
    scored = [
        (
            job_priority(
                j, now_s=snapshot.now_s, pools=pools, fairshare=fs, weights=config.weights
            ),
            j,
        )
        for j in snapshot.queued
    ]
    scored.sort(key=lambda pj: (-pj[0], pj[1].submitted_s, pj[1].id))
    return scored


def _misfit(job: Job, pid: int, r, prof: _Profile) -> str:
    """Why pool ``pid`` can never hold request ``r`` of ``job``, or ``""``."""
    i = prof.index.get(pid)
    if i is None:
        return f"pool {pid} is not in the federation"
    pool = prof.pools[i]
    if job.gpu_model and r.gpus and pool.gpu_model != job.gpu_model:
        return f"pool {pid} has no {job.gpu_model} GPUs"
    cap = prof.cap_rows[i]
    if r.cores > cap[1] + _EPS or r.memory_gib > cap[2] + _EPS or r.gpus > cap[3] + _EPS:
        return f"pool {pid} has less than the job asks for"
    return ""


def _unservable(job: Job, prof: _Profile) -> str:
    """A reason the job can never run on these pools, or ``""`` (``_misfit`` of each request,
    kept per pool, request and GPU model)."""
    seen = prof.misfits
    for pid, r in job.demands.items():
        key = (pid, r.cores, r.memory_gib, r.gpus, job.gpu_model)
        problem = seen.get(key)
        if problem is None:
            problem = seen[key] = _misfit(job, pid, r, prof)
        if problem:
            return problem
    if not job.demands:
        return "the job asks for no pool"
    return ""


def pool_choices(job: Job, prof: _Profile) -> list[dict[int, int]] | str:
    """The pool combinations ``job`` may run on, best fit first: ``[{demand key: pool id}]``
    (at most ``MAX_POOL_CHOICES``, each with distinct pools), or the reason (``str``) when some
    request has no pool that can ever hold it (that of the key's own pool).

    Candidates of a key: the key and its ``job.alternatives`` (in that order, unknown pools
    dropped) that fit the request (``_misfit``), ranked by (GPUs the pool has beyond the request,
    cores beyond, GiB beyond, position): a CPU request prefers a pool without GPUs.
    """
    ranked = []
    for key, r in job.demands.items():
        fitting = []
        for pos, pid in enumerate(dict.fromkeys([key, *job.alternatives.get(key, ())])):
            if pid in prof.index and not _misfit(job, pid, r, prof):
                cap = prof.cap_rows[prof.index[pid]]
                spare = (cap[3] - r.gpus, cap[1] - r.cores, cap[2] - r.memory_gib, pos)
                fitting.append((spare, pid))
        if not fitting:
            return _misfit(job, key, r, prof) or "the job asks for no pool"
        ranked.append([(key, pid) for _, pid in sorted(fitting)])
    out = []
    for combo in itertools.product(*ranked):
        if len({pid for _, pid in combo}) == len(combo):
            out.append(dict(combo))
            if len(out) == MAX_POOL_CHOICES:
                break
    return out or "the job's requests need more pools than its sites have"


def _with_pools(job: Job, chosen: dict[int, int]) -> Job:
    if all(k == v for k, v in chosen.items()):
        return job
    return replace(job, demands={chosen[k]: r for k, r in job.demands.items()}, alternatives={})


def _earliest_choice(job: Job, choices: list[dict[int, int]], prof: _Profile) -> dict[int, int]:
    """The combination with the earliest feasible start on ``prof`` (gang, windows, quotas,
    SuperNodes online), ties to the better fit; the best fit when none can start."""
    best, best_t = choices[0], math.inf
    for chosen in choices:
        req = _Request(_with_pools(job, chosen), prof)
        if not all(prof.online[i] for i in req.idx):
            continue
        first = req.earliest(prof)
        t = math.inf if first is None else first
        if t < best_t:
            best, best_t = chosen, t
            if t == 0:
                break
    return best


def _choose_start(
    req: _Request,
    prof: _Profile,
    policy: Policy,
    starts: np.ndarray | None = None,
    costs: np.ndarray | None = None,
) -> tuple[int | None, int | None]:
    """``(first, t)``: the earliest step at which the job's whole run fits (gang, windows,
    quotas) and the step its policy chooses; ``(None, None)`` when none in the horizon.

    ``ASAP`` takes the earliest; ``CHEAPEST`` / ``GREENEST`` the start with the least cost /
    emissions among those that meet the deadline with its safety margin (``first`` …
    ``req.latest_shift(prof, first)``; the earliest within 1e-9 of the least), else the earliest
    (late) — Wiesner et al., Middleware 2021, section 4. ``starts`` (bool over
    start steps ``0 … steps−d``) and ``costs`` (currency per start step) when the caller has
    them (a budget cap removed the starts above it); otherwise only the steps that the starts
    before the deadline cover are read, and the whole horizon only when none of them fits.
    """
    timely = policy is not Policy.ASAP and req.last_start >= 0
    if timely:
        n = req.last_start + 1
        window = req.starts_before(prof, n) if starts is None else starts[:n]
        first = _first_true(window)
        if first is not None:
            window = window[: req.latest_shift(prof, first) + 1]
            if policy is Policy.CHEAPEST:
                metric = costs[: len(window)] if costs is not None else req.costs(prof, len(window))
            else:
                metric = req.emissions(prof, len(window))
            values = np.where(window, metric, np.inf)  # the starts that fit, by their metric
            least = values.min()
            if least < np.inf:
                return first, int((values <= least + 1e-9).argmax())
            in_time = np.flatnonzero(window)  # every start that fits costs +inf (or NaN)
            values = metric[in_time]
            return first, int(in_time[np.flatnonzero(values <= values.min() + 1e-9)[0]])
    if starts is not None:
        first = _first_true(starts)
    else:  # none of the starts before the deadline fits: the earliest is after them
        first = req.earliest(prof, after=req.last_start + 1 if timely else 0)
    return first, first


def schedule(snapshot: Snapshot, config: Config | None = None) -> list[Decision]:
    """One scheduler pass (module docstring): decisions for every queued job, in queue order,
    followed by PREEMPT decisions for running jobs to stop.

    Pure: reads only ``snapshot`` and ``config``; raises ``KeyError`` only for inconsistent input
    (none expected from ``Snapshot``).
    """
    config = config or Config()
    prof = _Profile(snapshot)
    budget_left = {
        name: acc.budget_remaining
        for name, acc in snapshot.accounts.items()
        if acc.budget_remaining is not None
    }
    running_by_id = {r.id: r for r in snapshot.running}
    preempted: list[Decision] = []
    decisions: list[Decision] = []
    head_reserved = False
    blocked: set[int] = set()  # pools behind a blocked job (no backfill: nobody overtakes there)
    step, now = prof.step_s, snapshot.now_s

    def decide(req, prio, action, reason, t, late=False, detail="", cost=None, em=None):
        if t is None:
            return Decision(req.job.id, action, reason, prio, detail=detail, late=late)
        cost = req.cost_at(prof, t) if cost is None else cost
        em = req.emissions_at(prof, t) if em is None else em
        return Decision(
            req.job.id,
            action,
            reason,
            prio,
            start_s=now + t * step,
            end_s=now + t * step + req.job.duration_s,
            cost=cost,
            energy_kwh=req.energy_kwh,
            emissions_g=em,
            late=late,
            detail=detail,
        )

    chosen_pools: dict[int, dict[int, int]] = {}
    for prio, job in _order(snapshot, config):
        if job.alternatives:  # several pools at a site: pick one per request first
            choices = pool_choices(job, prof)
            if isinstance(choices, str):
                decisions.append(
                    Decision(job.id, Action.REFUSE, Reason.RESOURCES, prio, detail=choices)
                )
                continue
            chosen = choices[0] if len(choices) == 1 else _earliest_choice(job, choices, prof)
            chosen_pools[job.id] = chosen
            job = _with_pools(job, chosen)
        problem = _unservable(job, prof)
        if problem:
            decisions.append(
                Decision(job.id, Action.REFUSE, Reason.RESOURCES, prio, detail=problem)
            )
            continue
        req = _Request(job, prof)
        policy = job.policy if config.order != "fifo" else Policy.ASAP
        down = [p for p, i in zip(req.pids, req.idx, strict=True) if not prof.online[i]]
        if down:
            detail = "; ".join(
                f"pool {p}: {prof.pools[prof.index[p]].down_reason or 'SuperNode offline'}"
                for p in down
            )
            decisions.append(decide(req, prio, Action.WAIT, Reason.NODE_DOWN, None, detail=detail))
            continue
        if not config.backfill and blocked.intersection(job.demands):
            decisions.append(decide(req, prio, Action.WAIT, Reason.PRIORITY, None))
            continue
        # Fast path: an ASAP job without a cap that cannot start now and needs no estimate.
        if (
            policy is Policy.ASAP
            and job.budget_cap is None
            and head_reserved
            and not config.estimate_all
            and not req.fits_now(prof)
        ):
            decisions.append(decide(req, prio, Action.WAIT, req.why_not_now(prof), None))
            continue
        starts = costs = None
        if job.budget_cap is not None:  # the cheapest start of all decides a refusal
            starts = req.starts(prof)
            if starts.any():
                costs = req.costs(prof)
                within = starts & (costs <= job.budget_cap + _EPS)
                if not within.any():
                    cheapest = float(costs[starts].min())
                    decisions.append(
                        Decision(
                            job.id,
                            Action.REFUSE,
                            Reason.BUDGET,
                            prio,
                            cost=cheapest,
                            detail=f"the cheapest start costs {cheapest:.2f}, above the cap "
                            f"{job.budget_cap:.2f}",
                        )
                    )
                    continue
                starts = within
        first, t = _choose_start(req, prof, policy, starts, costs)
        late = t is not None and t > req.last_start
        # Preemption: a blocked job of higher QoS may stop lower-QoS preemptible running jobs.
        # Not a time-shifted job that meets its deadline at a chosen start cheaper or greener
        # than now: it waits by choice, and starting it now would undo the shift.
        waits_by_choice = (
            policy is not Policy.ASAP
            and t is not None
            and not late
            and not _now_no_worse(req, prof, policy, t)
        )
        if t != 0 and config.preemption and snapshot.running and not waits_by_choice:
            victims = _preemption(req, prof, running_by_id, {d.job_id for d in preempted})
            if victims is not None:
                for run in victims:
                    prof._take(run.project, run.demands, 0, prof.running_end[run.id], sign=1.0)
                    preempted.append(
                        Decision(
                            run.id,
                            Action.PREEMPT,
                            Reason.PREEMPTED,
                            detail=f"preempted for job {job.id} (higher QoS)",
                            for_job=job.id,
                        )
                    )
                t, late = 0, req.d > req.last_start
        if t is None:
            reason = req.why_not_now(prof)
            if reason is Reason.PRIORITY:
                reason = Reason.RESOURCES
            decisions.append(
                decide(req, prio, Action.WAIT, reason, None, detail="no start within the horizon")
            )
            blocked.update(job.demands)
            # The EASY head whose earliest start comes so late that its run would end past the
            # horizon still holds that start to the horizon's end: without it, a later job
            # planned there is overtaken by this one when its start comes (issue 15).
            # (A run longer than the horizon is left out: it would hold the pools to the end
            # of every pass and never start.)
            holds = req.d <= prof.steps and (not head_reserved or not config.backfill)
            tail = req.open_ended(prof) if holds else None
            if tail is not None:
                prof.take(req, tail, prof.steps)
                head_reserved = True
            continue
        cost = req.cost_at(prof, t)
        left = budget_left.get(job.project)
        if left is not None and cost > left + _EPS:
            decisions.append(
                decide(
                    req,
                    prio,
                    Action.WAIT,
                    Reason.BUDGET,
                    t,
                    late,
                    detail=f"estimated cost {cost:.2f} above the project's remaining {left:.2f}",
                    cost=cost,
                )
            )
            continue
        if t == 0:
            prof.take(req, 0, req.d)
            if left is not None:
                budget_left[job.project] = left - cost
            decisions.append(decide(req, prio, Action.START, Reason.NONE, 0, late, cost=cost))
            continue
        shifted = policy is not Policy.ASAP and first != t
        # A time-shifted job in time keeps its start even when it is the earliest (not shifted):
        # without the reservation a later job could take it and push this one past its deadline.
        pinned = policy is not Policy.ASAP and not late
        reason = Reason.TIME_SHIFT if shifted else req.why_not_now(prof)
        if late and not shifted:
            reason = Reason.DEADLINE if reason is Reason.RESOURCES else reason
        if pinned or not head_reserved or not config.backfill:
            # A reservation: later jobs may not use these resources (EASY head or a time-shifted
            # job's chosen start).
            prof.take(req, t, t + req.d)
            if left is not None:
                budget_left[job.project] = left - cost
            head_reserved = head_reserved or not shifted
            if not shifted:
                blocked.update(job.demands)
            decisions.append(decide(req, prio, Action.PLAN, reason, t, late, cost=cost))
        else:
            decisions.append(decide(req, prio, Action.WAIT, reason, t, late, cost=cost))
    demands = {j.id: j.demands for j in snapshot.queued}
    for k, d in enumerate(decisions):
        if d.action is Action.REFUSE:
            continue
        if d.job_id in chosen_pools:
            decisions[k] = replace(d, pools=chosen_pools[d.job_id])
        elif d.action is Action.START:  # its keys are its pools
            decisions[k] = replace(d, pools={pid: pid for pid in demands[d.job_id]})
    return decisions + preempted


def _now_no_worse(req: _Request, prof: _Profile, policy: Policy, t: int) -> bool:
    """Whether a start now (step 0) costs (``CHEAPEST``) or emits (``GREENEST``) no more than the
    start at step ``t`` the policy chose among the feasible ones: then preempting to start now
    serves the job's own policy."""
    metric = req.cost_at if policy is Policy.CHEAPEST else req.emissions_at
    return metric(prof, 0) <= metric(prof, t) + _EPS


def _preemption(req: _Request, prof: _Profile, running_by_id, taken: set[int]):
    """Running jobs to stop so that ``req`` starts now, or ``None`` (module docstring)."""
    level = QOS_LEVELS.get(req.job.qos, QOS_LEVELS["normal"])
    pools = set(req.pids)
    candidates = sorted(
        (
            r
            for r in running_by_id.values()
            if r.preemptible
            and r.id not in taken
            and QOS_LEVELS.get(r.qos, QOS_LEVELS["normal"]) < level
            and pools & set(r.demands)
        ),
        key=lambda r: (QOS_LEVELS.get(r.qos, 1), -r.started_s, -r.id),
    )
    if not candidates or not req.open_now(prof):
        return None
    free = prof.free.copy()
    chosen = []
    for run in candidates:
        end = prof.running_end[run.id]
        for pid, r in run.demands.items():
            i = prof.index.get(pid)
            if i is not None:
                free[i, :, :end] += np.asarray(r.vector())[:, None]
        chosen.append(run)
        if req.fits_now(prof, free):
            return chosen
    return None
