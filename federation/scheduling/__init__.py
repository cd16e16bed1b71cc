"""The scheduler as a pure function: a snapshot of pools, running and queued jobs, calendars and
forecasts in; decisions out (``schedule``). No Django, no clock, no I/O: the portal builds the
snapshot from its database (``federation.admission``) and the simulator from a generated workload
(``benchmarks/scheduler.py``)."""

from federation.scheduling.model import (
    QOS_LEVELS,
    Account,
    Action,
    Config,
    Decision,
    DemandPricing,
    Job,
    Policy,
    Pool,
    Reason,
    Resources,
    Running,
    Snapshot,
    Weights,
)
from federation.scheduling.scheduler import schedule

__all__ = [
    "QOS_LEVELS",
    "Account",
    "Action",
    "Config",
    "Decision",
    "DemandPricing",
    "Job",
    "Policy",
    "Pool",
    "Reason",
    "Resources",
    "Running",
    "Snapshot",
    "Weights",
    "schedule",
]
