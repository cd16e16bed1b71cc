"""The scheduler's input and output: plain frozen dataclasses, no Django.

Times are seconds since the epoch (``float``); the plan is on a grid of ``Snapshot.step_s``
seconds starting at ``Snapshot.now_s``: step ``t`` covers ``[now + t·step, now + (t+1)·step)``.
Per-step series (availability, price, carbon intensity) have one value per step of the horizon
(``Snapshot.horizon_steps``); a shorter series is padded with its last value.

Money is ``float`` in the pool's currency inside the pure scheduler (the portal converts to
``Decimal`` at its edge); energy is kWh, emissions grams of CO2-equivalent (gCO2e).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Policy(StrEnum):
    """When a job should run: as soon as possible, or the cheapest / lowest-carbon start before its
    deadline (time shifting, Wiesner et al., "Let's Wait Awhile", Middleware 2021)."""

    ASAP = "asap"
    CHEAPEST = "cheapest"
    GREENEST = "greenest"


class Action(StrEnum):
    """What the scheduler decided for a job in this pass."""

    START = "start"  # admit now on all its sites (gang)
    PLAN = "plan"  # reserved for a later start (EASY head reservation or a time-shifted start)
    WAIT = "wait"  # no reservation; ``reason`` says why, ``start_s`` is the estimated start
    REFUSE = "refuse"  # cannot ever run as asked (budget cap, resources no pool has)
    PREEMPT = "preempt"  # a running preemptible job to stop (it resumes from its checkpoint)


class Reason(StrEnum):
    """Why a job is not started now, after Slurm's job reason codes (``squeue -o %r``)."""

    NONE = "None"
    RESOURCES = "Resources"  # the pools are busy
    PRIORITY = "Priority"  # resources are held for higher-priority jobs
    WINDOW = "Window"  # a pool is not lent at this time
    BUDGET = "Budget"  # estimated cost above the job's cap or the project's remaining budget
    NODE_DOWN = "NodeDown"  # a site's SuperNode is offline
    DEADLINE = "DeadlineUnreachable"  # the earliest possible end is after the deadline
    TIME_SHIFT = "TimeShift"  # waiting for the cheapest / lowest-carbon start before the deadline
    QUOTA = "Quota"  # the project's quota on a pool is used up
    PREEMPTED = "Preempted"  # stopped for a higher-QoS job


#: Quality-of-service levels, lowest first; the QoS priority factor is ``level / max level``.
QOS_LEVELS: dict[str, int] = {"low": 0, "normal": 1, "high": 2}


@dataclass(frozen=True, slots=True)
class Resources:
    """A quantity of a pool's resources: cores, memory in GiB, GPUs (of the pool's model)."""

    cores: int = 0
    memory_gib: float = 0.0
    gpus: int = 0

    def vector(self) -> tuple[float, float, float, float]:
        """``(slots, cores, memory_gib, gpus)``: a job holds one slot of each pool it uses."""
        return (1.0, float(self.cores), float(self.memory_gib), float(self.gpus))


@dataclass(frozen=True, slots=True)
class DemandPricing:
    """Demand-responsive price bounds set by the pool's admin.

    The multiplier of a step's price is ``clip(1 + elasticity × (occupancy + backlog), low, high)``
    (see ``scheduler.price_multipliers``).
    """

    elasticity: float = 0.5
    low: float = 1.0
    high: float = 2.0


@dataclass(frozen=True, slots=True)
class Pool:
    """One compute pool as the scheduler sees it.

    ``available``: per step, whether the pool is lent to every project; ``foreign_available``: per
    step, extra lending only to projects of other institutions (``None`` = never). ``price``: per
    step, currency per service unit per hour; service units per hour of a job =
    ``cpu_weight·cores + memory_weight·GiB + gpu_weight·GPUs`` (Slurm TRESBillingWeights).
    ``carbon``: per step, gCO2e/kWh. ``watts_per_core`` / ``watts_per_gpu``: power draw used to
    turn reserved seconds into energy. ``usable``: what of ``capacity`` is usable over the
    horizon (a batch system's reading: its nodes down or busy with its own jobs; ``None`` = all):
    jobs wait for it (``Resources``) but are refused only beyond ``capacity``. ``online``: False
    when the pool cannot take work (SuperNode offline, batch system's nodes down), with
    ``down_reason`` in a waiting job's detail (reason ``NodeDown``).
    """

    id: int
    institution: str
    capacity: Resources
    slots: int = 1
    gpu_model: str = ""
    available: Sequence[bool] | None = None
    foreign_available: Sequence[bool] | None = None
    price: Sequence[float] | None = None
    carbon: Sequence[float] | None = None
    cpu_weight: float = 1.0
    memory_weight: float = 0.0
    gpu_weight: float = 0.0
    watts_per_core: float = 10.0
    watts_per_gpu: float = 250.0
    online: bool = True
    demand_pricing: DemandPricing | None = None
    usable: Resources | None = None
    down_reason: str = ""


@dataclass(frozen=True, slots=True)
class Account:
    """A project's standing: its institution, fair-share shares, decayed usage and budget.

    ``shares``: the project's raw shares inside its institution; ``usage``: its decayed past usage
    (service-unit hours, see ``priority.decayed_usage``); ``budget_remaining``: currency left (``None``
    = unlimited); ``quotas``: pool id → the most the project may hold there at once.
    """

    institution: str
    shares: float = 1.0
    usage: float = 0.0
    budget_remaining: float | None = None
    quotas: Mapping[int, Resources] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Job:
    """A queued job request. ``demands``: pool id → resources it needs there (all start together).

    ``duration_s``: estimated run time; ``deadline_s``: results wanted by (``None`` = none);
    ``budget_cap``: the most it may cost (``None`` = no cap); ``gpu_model``: required model, if any.
    ``alternatives``: for a key of ``demands``, other pools that may serve that request instead
    (the other pools of the same site); the scheduler picks one pool per key
    (``scheduler.pool_choices``) and says which in ``Decision.pools``.
    """

    id: int
    project: str
    submitted_s: float
    demands: Mapping[int, Resources]
    duration_s: float
    policy: Policy = Policy.ASAP
    deadline_s: float | None = None
    budget_cap: float | None = None
    qos: str = "normal"
    preemptible: bool = False
    gpu_model: str = ""
    alternatives: Mapping[int, Sequence[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Running:
    """A job that holds resources until ``end_s`` (its estimated end)."""

    id: int
    project: str
    demands: Mapping[int, Resources]
    started_s: float
    end_s: float
    qos: str = "normal"
    preemptible: bool = False


@dataclass(frozen=True, slots=True)
class Weights:
    """Multifactor priority weights (Slurm ``PriorityWeight*``) and the age cap."""

    age: float = 1000.0
    fairshare: float = 10000.0
    size: float = 1000.0
    qos: float = 2000.0
    max_age_s: float = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Config:
    """Scheduler switches: queue order (multifactor ``"priority"`` or ``"fifo"``), EASY backfill,
    preemption, and whether every waiting job gets an estimated start (one search over the horizon
    per job). ``Config(order="fifo", backfill=False, preemption=False)`` is first come, first
    served: the baseline."""

    weights: Weights = Weights()
    order: str = "priority"  # or "fifo": submission order, the baseline
    backfill: bool = True
    preemption: bool = True
    estimate_all: bool = True


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduler pass reads."""

    now_s: float
    pools: Sequence[Pool]
    queued: Sequence[Job]
    running: Sequence[Running] = ()
    accounts: Mapping[str, Account] = field(default_factory=dict)
    institution_shares: Mapping[str, float] = field(default_factory=dict)
    step_s: float = 900.0
    horizon_steps: int = 14 * 96


@dataclass(frozen=True, slots=True)
class Decision:
    """The decision for one job. For START / PLAN / WAIT ``start_s``/``end_s`` are the (estimated)
    run, ``cost`` in the pools' currency, ``energy_kwh`` and ``emissions_g`` for that run (``None``
    when no start within the horizon is possible). ``late``: the run ends after the deadline.
    ``pools``: the pool chosen for each key of the job's ``demands`` (``{key: pool id}``; the key
    itself unless an alternative was chosen), for every START and every decision of a job with
    ``alternatives``; empty otherwise (REFUSE, PREEMPT, and a job without alternatives that does
    not start: its keys are its pools). ``for_job``: of a PREEMPT, the queued job it frees
    resources for (``None`` otherwise)."""

    job_id: int
    action: Action
    reason: Reason = Reason.NONE
    priority: int = 0
    start_s: float | None = None
    end_s: float | None = None
    cost: float | None = None
    energy_kwh: float | None = None
    emissions_g: float | None = None
    late: bool = False
    detail: str = ""
    pools: Mapping[int, int] = field(default_factory=dict)
    for_job: int | None = None
