"""The pure scheduler (``federation.scheduling``): decisions computed by hand for small snapshots.

Steps are 900 s (a quarter hour) from ``NOW``; each expected start, cost and emission below is
worked out in the comment beside it.
"""

from __future__ import annotations

import pytest

from federation.scheduling import (
    Account,
    Action,
    Config,
    DemandPricing,
    Job,
    Policy,
    Pool,
    Reason,
    Resources,
    Running,
    Snapshot,
    Weights,
    schedule,
)
from federation.scheduling.priority import decayed_usage, fairshare_factors, job_priority
from federation.scheduling.scheduler import price_multipliers

NOW = 1_000_000.0
STEP = 900.0
R = Resources


def snap(pools, queued, running=(), accounts=None, steps=8, shares=None):
    accounts = accounts or {"p": Account("a"), "q": Account("b")}
    return Snapshot(
        now_s=NOW,
        pools=pools,
        queued=queued,
        running=running,
        accounts=accounts,
        institution_shares=shares or {},
        step_s=STEP,
        horizon_steps=steps,
    )


def job(i, pools, minutes=15, project="p", t=0.0, **kw):
    return Job(i, project, NOW - 3600 + t, pools, minutes * 60.0, **kw)


def by_id(decisions):
    return {d.job_id: d for d in decisions}


def at(step):
    return NOW + step * STEP


# --------------------------------------------------------------------------------------------
# Gang admission, EASY backfill
# --------------------------------------------------------------------------------------------


def test_gang_job_waits_for_all_its_pools_together():
    # Pool 2 is full until step 2 (a running job); pool 1 is free now. The gang may start only
    # when both are free: step 2, never at pool 1 alone.
    pools = [Pool(1, "a", R(4, 8)), Pool(2, "b", R(4, 8))]
    running = [Running(90, "q", {2: R(4, 8)}, NOW - 100, at(2))]
    d = by_id(schedule(snap(pools, [job(1, {1: R(2), 2: R(2)})], running)))[1]
    assert (d.action, d.reason, d.start_s) == (Action.PLAN, Reason.RESOURCES, at(2))


def test_easy_backfill_starts_short_job_that_does_not_delay_head():
    # One pool of 4 cores; 2 cores busy until step 3. Head (oldest, 4 cores) reserves steps 3..4.
    # A 2-core job of 30 min (2 steps) fits in steps 0..1 and ends before step 3: it backfills.
    # A 2-core job of 60 min (4 steps, steps 0..3) would overlap the head's reservation: it waits.
    pools = [Pool(1, "a", R(4, 8), slots=4)]
    running = [Running(90, "q", {1: R(2)}, NOW - 100, at(3))]
    head = job(1, {1: R(4)}, minutes=30, t=0)
    short = job(2, {1: R(2)}, minutes=30, t=10)
    long_ = job(3, {1: R(2)}, minutes=60, t=20)
    cfg = Config(weights=Weights(fairshare=0, size=0, qos=0))  # age alone: oldest first
    d = by_id(schedule(snap(pools, [head, short, long_], running, steps=12), cfg))
    assert (d[1].action, d[1].start_s) == (Action.PLAN, at(3))
    assert (d[2].action, d[2].start_s) == (Action.START, NOW)
    assert (d[3].action, d[3].reason) == (Action.WAIT, Reason.PRIORITY)
    assert d[3].start_s == at(5)  # after the head's reservation (steps 3, 4)


def test_fifo_without_backfill_stops_behind_blocked_head():
    pools = [Pool(1, "a", R(4, 8), slots=4)]
    running = [Running(90, "q", {1: R(2)}, NOW - 100, at(3))]
    head = job(1, {1: R(4)}, minutes=30, t=0)
    short = job(2, {1: R(2)}, minutes=30, t=10)
    d = by_id(schedule(snap(pools, [short, head], running), Config(order="fifo", backfill=False)))
    assert d[1].action is Action.PLAN
    assert (d[2].action, d[2].reason) == (Action.WAIT, Reason.PRIORITY)


def test_fifo_blocks_only_the_pools_of_the_blocked_job():
    # First come, first served per pool (the portal's admission before this scheduler): job 1
    # waits for pool 1, job 2 on pool 1 stays behind it, job 3 on pool 2 alone starts.
    pools = [Pool(1, "a", R(4, 8), slots=4), Pool(2, "b", R(4, 8))]
    running = [Running(90, "q", {1: R(4)}, NOW - 100, at(3))]
    jobs = [job(1, {1: R(2)}, t=0), job(2, {1: R(1)}, t=5), job(3, {2: R(1)}, t=10)]
    cfg = Config(order="fifo", backfill=False)
    d = by_id(schedule(snap(pools, jobs, running), cfg))
    assert (d[1].action, d[1].start_s) == (Action.PLAN, at(3))
    assert (d[2].action, d[2].reason) == (Action.WAIT, Reason.PRIORITY)
    assert d[3].action is Action.START


def test_slots_limit_concurrent_jobs():
    pools = [Pool(1, "a", R(16, 64), slots=1)]
    d = by_id(schedule(snap(pools, [job(1, {1: R(1)}, t=0), job(2, {1: R(1)}, t=5)])))
    assert d[1].action is Action.START
    assert d[2].start_s == at(1)


def test_job_larger_than_pool_is_refused():
    d = schedule(snap([Pool(1, "a", R(4, 8))], [job(1, {1: R(8)})]))[0]
    assert (d.action, d.reason) == (Action.REFUSE, Reason.RESOURCES)


# --------------------------------------------------------------------------------------------
# Windows, health, quotas
# --------------------------------------------------------------------------------------------


def test_window_closed_now_plans_start_at_opening():
    closed3 = [False, False, False, True, True, True, True, True]
    pools = [Pool(1, "a", R(4, 8), available=closed3)]
    d = schedule(snap(pools, [job(1, {1: R(1)}, minutes=30)]))[0]
    assert (d.action, d.reason, d.start_s) == (Action.PLAN, Reason.WINDOW, at(3))


def test_run_must_fit_inside_window():
    # Open steps 0..1 and 4..7: a 45-minute (3-step) run fits only from step 4.
    win = [True, True, False, False, True, True, True, True]
    d = schedule(snap([Pool(1, "a", R(4, 8), available=win)], [job(1, {1: R(1)}, minutes=45)]))
    assert (d[0].reason, d[0].start_s) == (Reason.WINDOW, at(4))


def test_foreign_only_window_admits_other_institutions_projects():
    # Pool of institution a is lent now only to other institutions: project q (institution b)
    # starts, project p (institution a) waits for the general window at step 4.
    never = [False] * 4 + [True] * 4
    pools = [Pool(1, "a", R(4, 8), slots=2, available=never, foreign_available=[True] * 8)]
    d = by_id(
        schedule(snap(pools, [job(1, {1: R(1)}, project="p"), job(2, {1: R(1)}, project="q")]))
    )
    assert d[2].action is Action.START
    assert (d[1].reason, d[1].start_s) == (Reason.WINDOW, at(4))


def test_offline_node_waits_with_node_down():
    pools = [Pool(1, "a", R(4, 8)), Pool(2, "b", R(4, 8), online=False)]
    d = schedule(snap(pools, [job(1, {1: R(1), 2: R(1)})]))[0]
    assert (d.action, d.reason) == (Action.WAIT, Reason.NODE_DOWN)


def test_down_pool_names_its_reason_in_the_node_down_detail():
    pools = [
        Pool(1, "a", R(4, 8), online=False, down_reason="Slurm partition frp drained: n1: x"),
        Pool(2, "b", R(4, 8), online=False),
    ]
    d = schedule(snap(pools, [job(1, {1: R(1), 2: R(1)})]))[0]
    assert (d.action, d.reason) == (Action.WAIT, Reason.NODE_DOWN)
    assert d.detail == "pool 1: Slurm partition frp drained: n1: x; pool 2: SuperNode offline"


def test_usable_part_of_capacity_is_what_jobs_get_and_bigger_jobs_wait_not_refused():
    # A batch system's reading: 4 of the pool's 8 cores usable (nodes down or busy). A 4-core job
    # starts; a 1-core job is planned when it ends (step 1); a 6-core job waits with no start
    # (it fits the capacity, so it is not refused); a 9-core job is refused (beyond the capacity).
    pools = [Pool(1, "a", R(8, 32), slots=4, usable=R(4, 16))]
    queued = [
        job(1, {1: R(4, 4)}, t=0),
        job(2, {1: R(1, 1)}, t=1),
        job(3, {1: R(6, 1)}, t=2),
        job(4, {1: R(9, 1)}, t=3),
    ]
    d = by_id(schedule(snap(pools, queued), Config(order="fifo")))
    assert d[1].action is Action.START
    assert (d[2].action, d[2].start_s) == (Action.PLAN, at(1))
    assert (d[3].action, d[3].reason, d[3].start_s) == (Action.WAIT, Reason.RESOURCES, None)
    assert d[4].action is Action.REFUSE


def test_usable_memory_limits_too():
    pools = [Pool(1, "a", R(8, 32), usable=R(8, 2.0))]
    d = schedule(snap(pools, [job(1, {1: R(1, 4)})]))[0]
    assert (d.action, d.reason) == (Action.WAIT, Reason.RESOURCES)


def test_quota_per_project_per_pool():
    # Project p may hold 2 cores on pool 1; it runs 2 until step 2, so a new 1-core job waits.
    accounts = {"p": Account("a", quotas={1: R(2, 100, 0)})}
    pools = [Pool(1, "a", R(16, 64), slots=4)]
    running = [Running(90, "p", {1: R(2)}, NOW - 100, at(2))]
    d = schedule(snap(pools, [job(1, {1: R(1)})], running, accounts))[0]
    assert (d.action, d.reason, d.start_s) == (Action.PLAN, Reason.QUOTA, at(2))


# --------------------------------------------------------------------------------------------
# Priority (Slurm multifactor)
# --------------------------------------------------------------------------------------------


def test_fairshare_classic_two_level_by_hand():
    # Institutions a and b, one share each (S_inst = 0.5). a has projects p (1 share) and r (3);
    # b has q. Usage: p 30, r 10, q 60 (total 100).
    # a: U = 0.4, UE = 0.4 + (1 − 0.4)·0.5 = 0.7. p: S = 0.5·0.25 = 0.125, U = 0.3,
    #    UE = 0.3 + (0.7 − 0.3)·0.25 = 0.4, F = 2^(−0.4/0.125) = 2^−3.2.
    # r: S = 0.375, U = 0.1, UE = 0.1 + 0.6·0.75 = 0.55, F = 2^(−0.55/0.375).
    # b: U = 0.6, UE = 0.6 + 0.4·0.5 = 0.8; q: S = 0.5, UE = 0.6 + 0.2·1 = 0.8, F = 2^−1.6.
    accounts = {
        "p": Account("a", shares=1, usage=30),
        "r": Account("a", shares=3, usage=10),
        "q": Account("b", shares=1, usage=60),
    }
    f = fairshare_factors(accounts, {"a": 1, "b": 1})
    assert f["p"] == pytest.approx(2**-3.2)
    assert f["r"] == pytest.approx(2 ** (-0.55 / 0.375))
    assert f["q"] == pytest.approx(2**-1.6)


def test_fairshare_without_usage_is_one():
    assert fairshare_factors({"p": Account("a")}, {}) == {"p": 1.0}


def test_job_priority_sums_weighted_factors():
    # age 3.5 days of 7 → 0.5·1000 = 500; size 4 of 16 cores → 0.25·1000 = 250;
    # QoS high (2 of 2) → 2000; fair share 0.5 → 5000. Total 7750.
    pools = {1: Pool(1, "a", R(16, 64))}
    j = Job(1, "p", NOW - 3.5 * 86400, {1: R(4)}, 60, qos="high")
    assert job_priority(j, now_s=NOW, pools=pools, fairshare={"p": 0.5}, weights=Weights()) == 7750


def test_decayed_usage_halves_each_half_life():
    # 8 SU·h one half-life ago → 4; 4 SU·h two half-lives ago → 1.
    records = [(NOW - 3600, 8.0), (NOW - 7200, 4.0)]
    assert decayed_usage(records, now_s=NOW, half_life_s=3600) == pytest.approx(5.0)


def test_fair_share_orders_queue_lightly_used_project_first():
    accounts = {"p": Account("a", usage=90), "q": Account("b", usage=10)}
    pools = [Pool(1, "a", R(4, 8), slots=1)]
    d = schedule(
        snap(pools, [job(1, {1: R(1)}, project="p"), job(2, {1: R(1)}, project="q")], (), accounts)
    )
    assert [x.job_id for x in d] == [2, 1]
    assert d[0].action is Action.START


# --------------------------------------------------------------------------------------------
# Time shifting, cost, emissions
# --------------------------------------------------------------------------------------------

CARBON = [400, 300, 120, 100, 150, 500, 500, 500]
PRICE = [2.0, 2.0, 1.0, 1.0, 0.5, 0.5, 3.0, 3.0]


def shifting_pool(**kw):
    return Pool(1, "a", R(4, 8), price=PRICE, carbon=CARBON, watts_per_core=100, **kw)


def test_greenest_starts_at_forecast_minimum_before_deadline():
    # 30 min, 2 cores at 100 W = 0.2 kW → 0.05 kWh per step. Window sums of intensity:
    # 0:700 1:420 2:220 3:250 4:650 … minimum at step 2: 0.05·220 = 11 g.
    j = job(1, {1: R(2)}, minutes=30, policy=Policy.GREENEST, deadline_s=at(8))
    d = schedule(snap([shifting_pool()], [j]))[0]
    assert (d.action, d.reason, d.start_s) == (Action.PLAN, Reason.TIME_SHIFT, at(2))
    assert d.emissions_g == pytest.approx(11.0)
    assert d.energy_kwh == pytest.approx(0.1)


def test_cheapest_starts_at_cheapest_hours():
    # 2 SU (cores) × 0.25 h per step: sums of price over 2 steps: 4,3,2,1.5,1,3.5,6 → step 4,
    # cost 2·0.25·1.0 = 0.5.
    j = job(1, {1: R(2)}, minutes=30, policy=Policy.CHEAPEST, deadline_s=at(8))
    d = schedule(snap([shifting_pool()], [j]))[0]
    assert (d.start_s, d.cost) == (at(4), pytest.approx(0.5))


def test_deadline_limits_the_shift():
    # Deadline at step 4: the run (2 steps) must end by then, so starts 0..2 meet it; the slack
    # (deadline − earliest end, 4 − 2 = 2 steps) halved keeps one step of margin: starts 0..1
    # → step 1 (420 < 700), not the greener step 2 (220) that ends just at the deadline.
    j = job(1, {1: R(2)}, minutes=30, policy=Policy.GREENEST, deadline_s=at(4))
    d = schedule(snap([shifting_pool()], [j]))[0]
    assert (d.start_s, d.late) == (at(1), False)


# Strictly falling intensity: the greenest start is always the latest one allowed.
FALLING = [800, 700, 600, 500, 400, 300, 200, 100, 50, 40, 30, 20]


@pytest.mark.parametrize(
    ("minutes", "busy_until", "deadline", "expected"),
    [
        # 30 min (2 steps) due at step 12: starts 0..10 meet it; slack 12 − 2 = 10 steps, half
        # is 5 > one run (2 steps): margin 2 → latest start 12 − 2 − 2 = 8.
        pytest.param(30, 0, 12, 8, id="one-run-length"),
        # 60 min (4 steps) due at step 7: slack 7 − 4 = 3 steps, half is 1.5 < one run (4):
        # margin 1.5 steps → latest start ⌊7 − 4 − 1.5⌋ = 1.
        pytest.param(60, 0, 7, 1, id="half-the-slack"),
        # 60 min, the pool busy until step 2, due at step 10: the earliest end is step 6, slack
        # 10 − 6 = 4 steps, half 2 < 4: margin 2 → latest start 10 − 4 − 2 = 4 (from now the
        # slack would be 6 steps, margin 3, start 3: the slack counts from the earliest end).
        pytest.param(60, 2, 10, 4, id="slack-from-earliest-end"),
    ],
)
def test_time_shift_keeps_a_margin_before_the_deadline(minutes, busy_until, deadline, expected):
    pool = Pool(1, "a", R(4, 8), carbon=FALLING, watts_per_core=100)
    running = [Running(90, "q", {1: R(4)}, NOW - 100, at(busy_until))] if busy_until else []
    j = job(1, {1: R(2)}, minutes=minutes, policy=Policy.GREENEST, deadline_s=at(deadline))
    d = schedule(snap([pool], [j], running, steps=12))[0]
    assert (d.action, d.start_s, d.late) == (Action.PLAN, at(expected), False)


def test_time_shift_without_deadline_keeps_no_margin():
    # No deadline, nothing to miss: the greenest start of the horizon, 12 − 2 = step 10.
    pool = Pool(1, "a", R(4, 8), carbon=FALLING, watts_per_core=100)
    j = job(1, {1: R(2)}, minutes=30, policy=Policy.GREENEST)
    d = schedule(snap([pool], [j], steps=12))[0]
    assert d.start_s == at(10)


def test_greenest_start_is_not_taken_by_a_later_lower_priority_job():
    # Oldest first (age alone). Job 1 (ASAP, pool 2 full until step 3) is the EASY head: it
    # reserves step 3. Job 2 (greenest, 4 cores for 30 min) on pool 1, 2 of whose 4 cores are
    # busy until step 2: its earliest start, step 2, is also its greenest (window sums 220 at 2,
    # 250 at 3, 650 at 4; 4 is the last start its margin allows), so it is not "shifted". Job 3
    # (ASAP, 2 cores for 60 min: steps 0..3) fits now only by taking the cores job 2 waits for
    # at steps 2..3. Job 2 must keep its start: a plan at step 2, and job 3 waits for step 4.
    pools = [shifting_pool(slots=4), Pool(2, "b", R(4, 8), slots=4)]
    running = [
        Running(90, "q", {1: R(2)}, NOW - 100, at(2)),
        Running(91, "q", {2: R(4)}, NOW - 100, at(3)),
    ]
    head = job(1, {2: R(4)}, minutes=30, t=0)
    green = job(2, {1: R(4)}, minutes=30, t=10, policy=Policy.GREENEST, deadline_s=at(8))
    later = job(3, {1: R(2)}, minutes=60, t=20)
    cfg = Config(weights=Weights(fairshare=0, size=0, qos=0))
    d = by_id(schedule(snap(pools, [head, green, later], running), cfg))
    assert (d[1].action, d[1].start_s) == (Action.PLAN, at(3))
    assert (d[2].action, d[2].start_s, d[2].emissions_g) == (
        Action.PLAN,
        at(2),
        pytest.approx(0.1 * 220),  # 4 cores × 100 W = 0.4 kW × 0.25 h per step
    )
    assert (d[3].action, d[3].start_s) == (Action.WAIT, at(4))


def test_deadline_unreachable_runs_asap_and_is_late():
    # The pool is busy until step 4; a 30-minute job due at step 3 cannot make it.
    running = [Running(90, "q", {1: R(4)}, NOW - 100, at(4))]
    j = job(1, {1: R(2)}, minutes=30, policy=Policy.GREENEST, deadline_s=at(3))
    d = schedule(snap([shifting_pool()], [j], running))[0]
    assert (d.reason, d.start_s, d.late) == (Reason.DEADLINE, at(4), True)


def test_asap_ignores_carbon():
    j = job(1, {1: R(2)}, minutes=30, policy=Policy.ASAP, deadline_s=at(8))
    d = schedule(snap([shifting_pool()], [j]))[0]
    assert (d.action, d.emissions_g) == (Action.START, pytest.approx(0.05 * 700))


# --------------------------------------------------------------------------------------------
# Budgets
# --------------------------------------------------------------------------------------------


def test_budget_cap_below_cheapest_start_is_refused():
    # Cheapest 30-minute start costs 0.5 (above); a cap of 0.4 can never be met.
    j = job(1, {1: R(2)}, minutes=30, budget_cap=0.4)
    d = schedule(snap([shifting_pool()], [j]))[0]
    assert (d.action, d.reason, d.cost) == (Action.REFUSE, Reason.BUDGET, pytest.approx(0.5))


def test_budget_cap_moves_asap_to_first_affordable_start():
    # Costs per start: 2.0, 1.5, 1.0, 0.75, 0.5 … a cap of 1.0 → earliest affordable is step 2.
    j = job(1, {1: R(2)}, minutes=30, budget_cap=1.0)
    d = schedule(snap([shifting_pool()], [j]))[0]
    assert (d.action, d.start_s, d.cost) == (Action.PLAN, at(2), pytest.approx(1.0))


def test_project_budget_exhausted_waits():
    accounts = {"p": Account("a", budget_remaining=1.0)}
    d = schedule(snap([shifting_pool()], [job(1, {1: R(2)}, minutes=30)], (), accounts))[0]
    assert (d.action, d.reason) == (Action.WAIT, Reason.BUDGET)


def test_project_budget_is_spent_within_a_pass():
    # Remaining 2.5: job 1 starts now for 2.0 (steps 0–1 at 2.0/SU·h × 2 SU × 0.5 h); job 2 (also
    # 2.0 now) no longer fits the remaining 0.5 and waits for budget.
    accounts = {"p": Account("a", budget_remaining=2.5)}
    pools = [shifting_pool(slots=2)]
    jobs = [job(1, {1: R(2)}, minutes=30, t=0), job(2, {1: R(2)}, minutes=30, t=5)]
    d = by_id(schedule(snap(pools, jobs, (), accounts)))
    assert d[1].action is Action.START
    assert (d[2].action, d[2].reason) == (Action.WAIT, Reason.BUDGET)


def test_demand_pricing_multiplier_by_hand():
    # 4 cores; 2 held by a running job in steps 0..1 → occupancy 0.5 there, 0 after. Queue asks
    # 2 cores × 2 steps = 4 core-steps of 4 cores × 8 open steps = 32 → backlog 0.125.
    # Multiplier = clip(1 + 0.8·(occ + 0.125), 1, 1.4): steps 0–1 → 1.4 (1.5 clipped), then 1.1.
    pool = Pool(1, "a", R(4, 8), slots=2, demand_pricing=DemandPricing(0.8, 1.0, 1.4))
    running = [Running(90, "q", {1: R(2)}, NOW - 100, at(2))]
    s = snap([pool], [job(1, {1: R(2)}, minutes=30)], running)
    import numpy as np

    free = np.repeat(np.array([[2.0, 4.0, 8.0, 0.0]])[:, :, None], 8, axis=2)
    free[0, :, :2] -= np.array([1.0, 2.0, 0, 0])[:, None]
    cap = np.array([[2.0, 4.0, 8.0, 0.0]])
    mult = price_multipliers(s, free, cap, np.ones((1, 8), bool))
    assert mult[0].tolist() == pytest.approx([1.4, 1.4] + [1.1] * 6)


# --------------------------------------------------------------------------------------------
# Preemption
# --------------------------------------------------------------------------------------------


def test_high_qos_job_preempts_low_qos_preemptible_job():
    pools = [Pool(1, "a", R(4, 8))]
    running = [Running(90, "q", {1: R(4)}, NOW - 100, at(6), qos="low", preemptible=True)]
    d = by_id(schedule(snap(pools, [job(1, {1: R(4)}, qos="high")], running)))
    assert d[1].action is Action.START
    assert (d[90].action, d[90].reason) == (Action.PREEMPT, Reason.PREEMPTED)


def test_time_shifted_high_qos_job_waits_for_its_hours_instead_of_preempting():
    # The greenest start of a 30-minute job is step 2 (test_greenest_starts_at_forecast_minimum…);
    # the low-QoS job holds the whole pool until step 1. Preempting it would start the high-QoS
    # job now, at 700 g/kWh·step instead of 220: it keeps its chosen start and nobody is stopped.
    running = [Running(90, "q", {1: R(4)}, NOW - 100, at(1), qos="low", preemptible=True)]
    green = job(1, {1: R(4)}, minutes=30, qos="high", policy=Policy.GREENEST, deadline_s=at(8))
    d = by_id(schedule(snap([shifting_pool()], [green], running)))
    assert (d[1].action, d[1].reason, d[1].start_s) == (Action.PLAN, Reason.TIME_SHIFT, at(2))
    assert 90 not in d
    # Held until step 5 instead, its first free start emits 1000 (steps 5–6) against 700 now:
    # now is its greenest start, and it preempts.
    until5 = [Running(90, "q", {1: R(4)}, NOW - 100, at(5), qos="low", preemptible=True)]
    d = by_id(schedule(snap([shifting_pool()], [green], until5)))
    assert d[1].action is Action.START
    assert d[90].action is Action.PREEMPT
    # The same job under ASAP cannot wait for its hours: it preempts and starts now.
    asap = job(1, {1: R(4)}, minutes=30, qos="high")
    d = by_id(schedule(snap([shifting_pool()], [asap], running)))
    assert d[1].action is Action.START
    assert d[90].action is Action.PREEMPT


def test_no_preemption_of_non_preemptible_or_equal_qos():
    pools = [Pool(1, "a", R(4, 8))]
    running = [
        Running(90, "q", {1: R(2)}, NOW - 100, at(6), qos="low"),
        Running(91, "q", {1: R(2)}, NOW - 100, at(6), qos="normal", preemptible=True),
    ]
    d = by_id(schedule(snap(pools, [job(1, {1: R(4)}, qos="normal")], running)))
    assert d[1].action is Action.PLAN
    assert 90 not in d and 91 not in d


# --------------------------------------------------------------------------------------------
# Several pools per site: a request picks the pool that meets it
# --------------------------------------------------------------------------------------------


# Site "a" has a CPU pool (id 1: 16 cores, 64 GiB, no GPU) and a GPU pool (id 2: 8 cores,
# 64 GiB, 2 A100); site "b" has one pool (id 3). A job's request at site a is keyed by pool 1
# with pool 2 as its alternative (the portal keys by the site's first pool).
def _two_pool_site():
    return [
        Pool(1, "a", R(16, 64)),
        Pool(2, "a", R(8, 64, 2), gpu_model="A100"),
        Pool(3, "b", R(8, 32), slots=2),
    ]


def test_cpu_request_goes_to_the_cpu_pool_gpu_request_to_the_gpu_pool():
    cpu = job(1, {1: R(4, 8), 3: R(2)}, alternatives={1: (2,)})
    gpu = job(2, {1: R(4, 8, 1), 3: R(2)}, alternatives={1: (2,)}, t=10)
    d = by_id(schedule(snap(_two_pool_site(), [cpu, gpu])))
    # Both pools of site a can hold 4 cores / 8 GiB; best fit leaves no GPU idle: pool 1.
    assert (d[1].action, d[1].pools) == (Action.START, {1: 1, 3: 3})
    # Only pool 2 has a GPU: the request keyed by pool 1 runs on pool 2. Pool 3 has 8 cores and
    # 2 slots: 2 + 2 cores fit, so both start now.
    assert (d[2].action, d[2].pools) == (Action.START, {1: 2, 3: 3})


def test_gpu_request_listed_with_alternatives_in_any_order_picks_the_gpu_pool():
    gpu = job(1, {2: R(1, 1, 1)}, alternatives={2: (1,)})
    assert by_id(schedule(snap(_two_pool_site(), [gpu])))[1].pools == {2: 2}
    gpu = job(1, {1: R(1, 1, 1)}, alternatives={1: (2,)})
    assert by_id(schedule(snap(_two_pool_site(), [gpu])))[1].pools == {1: 2}


def test_cpu_request_uses_the_gpu_pool_when_the_cpu_pool_is_busy():
    # Pool 1 is full until step 3; pool 2 (GPU) is idle and holds 4 cores: start now on it
    # (earliest start wins over best fit), rather than a plan at step 3.
    running = [Running(90, "q", {1: R(16)}, NOW - 100, at(3))]
    d = by_id(
        schedule(snap(_two_pool_site(), [job(1, {1: R(4)}, alternatives={1: (2,)})], running))
    )
    assert (d[1].action, d[1].start_s, d[1].pools) == (Action.START, NOW, {1: 2})
    # Without the alternative it waits for pool 1 (step 3); its keys are its pools (no choice
    # to report until it starts).
    d = by_id(schedule(snap(_two_pool_site(), [job(1, {1: R(4)})], running)))
    assert (d[1].action, d[1].start_s, d[1].pools) == (Action.PLAN, at(3), {})
    d = by_id(schedule(snap(_two_pool_site(), [job(1, {1: R(4)})])))
    assert (d[1].action, d[1].pools) == (Action.START, {1: 1})


def test_request_no_pool_of_the_site_meets_is_refused():
    # 12 cores and a GPU: pool 1 has no GPU, pool 2 has 8 cores only.
    d = by_id(schedule(snap(_two_pool_site(), [job(1, {1: R(12, 8, 1)}, alternatives={1: (2,)})])))
    assert (d[1].action, d[1].reason) == (Action.REFUSE, Reason.RESOURCES)
    assert d[1].detail == "pool 1 has less than the job asks for"
    assert d[1].pools == {}


def test_two_jobs_fill_both_pools_of_a_site_in_one_pass():
    # Pools have one slot. Job 1 (12 cores) takes pool 1 (best fit: no idle GPU). Job 2 (12
    # cores) cannot use pool 2 (8 cores): it reserves pool 1 after job 1 (15 min = step 1).
    # Job 3 (6 cores) finds pool 1 taken and reserved, so it starts now on pool 2.
    jobs = [
        job(1, {1: R(12)}, alternatives={1: (2,)}, t=0),
        job(2, {1: R(12)}, alternatives={1: (2,)}, t=10),
        job(3, {1: R(6)}, alternatives={1: (2,)}, t=20),
    ]
    cfg = Config(weights=Weights(fairshare=0, size=0, qos=0))  # age alone: oldest first
    d = by_id(schedule(snap(_two_pool_site(), jobs), cfg))
    assert (d[1].action, d[1].pools) == (Action.START, {1: 1})
    assert (d[2].action, d[2].start_s, d[2].pools) == (Action.PLAN, at(1), {1: 1})
    assert (d[3].action, d[3].pools) == (Action.START, {1: 2})
