"""Turning a pool's weekly calendar, time-of-use prices and carbon readings into per-step series.

Pure functions (``zoneinfo`` only). A step ``t`` starts at ``start + t·step_s``; a series value is
the one in force at the step's start.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo


@dataclass(frozen=True, slots=True)
class WeeklySpan:
    """A weekly recurring span: ``weekday`` 0 = Monday … 6 = Sunday, minutes from midnight in the
    pool's time zone, ``end_minute`` up to 1440 (a span past midnight is two spans)."""

    weekday: int
    start_minute: int
    end_minute: int

    def __post_init__(self):
        if not 0 <= self.weekday <= 6:
            raise ValueError("weekday must be 0 (Monday) … 6 (Sunday)")
        if not 0 <= self.start_minute < self.end_minute <= 1440:
            raise ValueError("a span needs 0 ≤ start < end ≤ 1440 minutes")

    def covers(self, local: datetime) -> bool:
        minute = local.hour * 60 + local.minute
        return local.weekday() == self.weekday and self.start_minute <= minute < self.end_minute


@dataclass(frozen=True, slots=True)
class Exception_:
    """A dated exception: ``[start, end)`` (aware datetimes) open (``available``) or closed."""

    start: datetime
    end: datetime
    available: bool


@dataclass(frozen=True, slots=True)
class PriceBand:
    """A time-of-use band: the price per service unit·hour during ``span``."""

    span: WeeklySpan
    price: float


def step_starts(start: datetime, steps: int, step_s: float) -> list[datetime]:
    """The aware start datetime of each step."""
    return [start + timedelta(seconds=i * step_s) for i in range(steps)]


def availability(
    spans: Iterable[WeeklySpan],
    exceptions: Iterable[Exception_],
    *,
    start: datetime,
    steps: int,
    step_s: float,
    tz: str,
    always: bool = False,
) -> list[bool]:
    """Per step: open when a weekly span covers its start (or ``always``), unless an exception
    covering it says otherwise (the last matching exception wins)."""
    zone = ZoneInfo(tz)
    spans = list(spans)
    exceptions = list(exceptions)
    out = []
    for at in step_starts(start, steps, step_s):
        local = at.astimezone(zone)
        is_open = always or any(s.covers(local) for s in spans)
        for ex in exceptions:
            if ex.start <= at < ex.end:
                is_open = ex.available
        out.append(is_open)
    return out


def time_of_use(
    bands: Iterable[PriceBand],
    base_price: float,
    *,
    start: datetime,
    steps: int,
    step_s: float,
    tz: str,
) -> list[float]:
    """Per step: the price of the first band covering its start, else ``base_price``."""
    zone = ZoneInfo(tz)
    bands = list(bands)
    out = []
    for at in step_starts(start, steps, step_s):
        local = at.astimezone(zone)
        out.append(next((b.price for b in bands if b.span.covers(local)), base_price))
    return out


def intensity(
    readings: Sequence[tuple[datetime, float]],
    *,
    start: datetime,
    steps: int,
    step_s: float,
    default: float,
) -> list[float]:
    """Per step: the latest reading at or before its start (``readings`` sorted by time), else the
    first reading after it, else ``default`` (gCO2e/kWh)."""
    times = [r[0] for r in readings]
    out = []
    for at in step_starts(start, steps, step_s):
        i = bisect.bisect_right(times, at) - 1
        if i >= 0:
            out.append(float(readings[i][1]))
        elif readings:
            out.append(float(readings[0][1]))
        else:
            out.append(float(default))
    return out


def price_segments(
    bands: Iterable[PriceBand],
    base_price,
    *,
    start: datetime,
    end: datetime,
    tz: str,
) -> list[tuple[datetime, datetime, object]]:
    """The time-of-use price schedule over ``[start, end)`` (aware datetimes): a list of
    ``(from, to, price)`` pieces that tile the interval, in order, adjacent pieces of equal price
    merged. A piece's price is that of the first band covering its start (the rule of
    ``time_of_use``), else ``base_price``; bands change only on their own edges and at local
    midnight, so the pieces are exact (not on the scheduler's grid). ``price`` is returned as
    given (``float`` in the scheduler, ``Decimal`` in billing). An empty interval gives ``[]``.
    Raises ``ValueError`` for naive datetimes.
    """
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("start and end must be aware datetimes")
    if end <= start:
        return []
    zone = ZoneInfo(tz)
    bands = list(bands)
    first = start.astimezone(zone).date() - timedelta(days=1)
    last = end.astimezone(zone).date() + timedelta(days=1)
    edges = {start, end}
    day = first
    while day <= last:
        midnight = datetime(day.year, day.month, day.day, tzinfo=zone)
        minutes = {0}
        for band in bands:
            if band.span.weekday == day.weekday():
                minutes.update((band.span.start_minute, band.span.end_minute))
        for minute in minutes:
            local = midnight + timedelta(minutes=minute)  # wall-clock arithmetic in ``zone``
            at = local.astimezone(start.tzinfo)
            if start < at < end:
                edges.add(at)
        day += timedelta(days=1)
    points = sorted(edges)
    pieces: list[tuple[datetime, datetime, object]] = []
    for lo, hi in zip(points, points[1:], strict=False):
        local = lo.astimezone(zone)
        price = next((b.price for b in bands if b.span.covers(local)), base_price)
        if pieces and pieces[-1][2] == price:
            pieces[-1] = (pieces[-1][0], hi, price)
        else:
            pieces.append((lo, hi, price))
    return pieces
