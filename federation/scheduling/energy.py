"""Energy and emissions of metered compute (pure).

energy (kWh) = (CPU seconds × W per core + GPU seconds × W per GPU) ÷ 3.6e6;
emissions (gCO2e) = energy × the grid's carbon intensity (gCO2e/kWh) during the run, the mean of
the hourly values weighted by the run's overlap with each hour (the Green Algorithms method,
Lannelongue et al., Adv. Sci. 2021, without the PUE and memory terms unless given).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


def energy_kwh(
    *, cpu_seconds: float, gpu_seconds: float = 0.0, watts_per_core: float, watts_per_gpu: float
) -> float:
    """kWh for metered core-seconds and GPU-seconds at the given power draws (W)."""
    if cpu_seconds < 0 or gpu_seconds < 0:
        raise ValueError("metered seconds cannot be negative")
    return (cpu_seconds * watts_per_core + gpu_seconds * watts_per_gpu) / 3.6e6


def mean_intensity(
    readings: Sequence[tuple[datetime, float]], *, start: datetime, end: datetime, default: float
) -> float:
    """Time-weighted mean gCO2e/kWh over ``[start, end)``; each reading holds until the next.

    Readings sorted by time; before the first reading its value holds; no readings → ``default``.
    """
    if not readings:
        return float(default)
    if end <= start:
        i = max(0, sum(1 for t, _ in readings if t <= start) - 1)
        return float(readings[i][1])
    total = 0.0
    span = (end - start).total_seconds()
    for k, (t, value) in enumerate(readings):
        lo = start if k == 0 else max(start, t)
        hi = end if k == len(readings) - 1 else min(end, readings[k + 1][0])
        if hi > lo:
            total += value * (hi - lo).total_seconds()
    return total / span


def emissions_g(energy: float, intensity_g_per_kwh: float) -> float:
    """gCO2e of ``energy`` kWh at ``intensity_g_per_kwh``."""
    return energy * intensity_g_per_kwh
