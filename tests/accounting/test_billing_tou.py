"""Time-of-use prices on invoices (issue 15): each piece of a run is priced at the pool's price in
force then. Expected figures are worked out by hand in the comments, not by the code."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from accounting.models import BillingEntry
from accounting.services import billing
from federation.models import ComputePool, PriceBand
from portal.ledger.models import LedgerEntry
from tests.factories import (
    BillingJobFactory,
    BillingUsageFactory,
    InstitutionFactory,
    PriceRuleFactory,
    ProjectFactory,
    SiteFactory,
)

pytestmark = pytest.mark.django_db

D = Decimal
UTC = dt.UTC
WEDNESDAY, THURSDAY = 2, 3  # 2025-03-12 is a Wednesday


class Night:
    """Institution A lends pool-a (rule from 2025-01-01: 1 SU per core-hour, 0.25 per GiB-hour,
    0.05 EUR per SU); project B runs on it (a foreign pool: A is credited, B charged)."""

    def __init__(self, tz: str = "UTC"):
        a = InstitutionFactory(slug="inst-a")
        b = InstitutionFactory(slug="inst-b")
        self.site = SiteFactory(institution=a, slug="site-a", pool__name="pool-a")
        self.pool = self.site.pools.get()
        ComputePool.objects.filter(pk=self.pool.pk).update(time_zone=tz)
        self.project = ProjectFactory(institution=b)
        self.rule = PriceRuleFactory(
            pool=self.pool,
            effective_from=dt.date(2025, 1, 1),
            cpu_weight=D("1"),
            memory_weight=D("0.25"),
            gpu_weight=D("0"),
            price_per_unit=D("0.05"),
        )

    def band(self, weekday: int, start: str, end: str, price: str) -> None:
        sh, sm = map(int, start.split(":"))
        eh, em = map(int, end.split(":"))
        PriceBand.objects.create(
            pool=self.pool,
            weekday=weekday,
            start_minute=sh * 60 + sm,
            end_minute=eh * 60 + em,
            price=D(price),
        )

    def job(self, start: dt.datetime, end: dt.datetime, *, cores: int, memory: str):
        job = BillingJobFactory(project=self.project, started_at=start, finished_at=end)
        BillingUsageFactory(
            job=job,
            site=self.site,
            cores=cores,
            memory_gib=D(memory),
            gpus=0,
            ended_at=end,
            reserved_seconds=(end - start).total_seconds(),
            wall_seconds=10.0,
        )
        return job


def _lines(job):
    return {
        e.kind: (e.service_units, e.amount, e.price_detail)
        for e in BillingEntry.objects.filter(job=job, kind__startswith="compute")
    }


def test_run_across_a_price_change_is_billed_at_each_hours_price():
    w = Night()
    w.band(WEDNESDAY, "22:00", "24:00", "0.03")
    # 2 cores + 4 GiB: 1×2 + 0.25×4 = 3 SU per hour, 21:30–22:30 UTC on Wednesday 2025-03-12.
    #   21:30–22:00: 1800 s → 1.5 SU × 0.05 = 0.075
    #   22:00–22:30: 1800 s → 1.5 SU × 0.03 = 0.045      total 3 SU, 0.12 (flat: 0.15)
    job = w.job(
        dt.datetime(2025, 3, 12, 21, 30, tzinfo=UTC),
        dt.datetime(2025, 3, 12, 22, 30, tzinfo=UTC),
        cores=2,
        memory="4",
    )
    billing.job_bill(job=job)
    lines = _lines(job)
    pieces = [
        {
            "from": "2025-03-12T21:30:00+00:00",
            "to": "2025-03-12T22:00:00+00:00",
            "seconds": "1800",
            "service_units": "1.5000",
            "price": "0.0500",
        },
        {
            "from": "2025-03-12T22:00:00+00:00",
            "to": "2025-03-12T22:30:00+00:00",
            "seconds": "1800",
            "service_units": "1.5000",
            "price": "0.0300",
        },
    ]
    assert lines["compute_charge"] == (D("3.0000"), D("0.12"), pieces)
    assert lines["compute_credit"] == (D("3.0000"), D("0.12"), pieces)
    charge = LedgerEntry.objects.filter(kind="charge").get()
    assert json.loads(charge.data)["priced"] == [
        ["2025-03-12T21:30:00+00:00", "2025-03-12T22:00:00+00:00", "1.5000", "0.0500"],
        ["2025-03-12T22:00:00+00:00", "2025-03-12T22:30:00+00:00", "1.5000", "0.0300"],
    ]


def test_bands_are_read_in_the_pools_time_zone():
    # Berlin is UTC+1 on 2025-03-12: the 22:00 local change is at 21:00 UTC.
    w = Night(tz="Europe/Berlin")
    w.band(WEDNESDAY, "22:00", "24:00", "0.03")
    # 20:30–21:30 UTC = 21:30–22:30 local: the same split as above, 0.075 + 0.045 = 0.12.
    job = w.job(
        dt.datetime(2025, 3, 12, 20, 30, tzinfo=UTC),
        dt.datetime(2025, 3, 12, 21, 30, tzinfo=UTC),
        cores=2,
        memory="4",
    )
    billing.job_bill(job=job)
    su, amount, pieces = _lines(job)["compute_charge"]
    assert (su, amount) == (D("3.0000"), D("0.12"))
    assert [p["to"] for p in pieces] == ["2025-03-12T21:00:00+00:00", "2025-03-12T21:30:00+00:00"]


def test_run_past_midnight_meets_three_prices():
    w = Night()
    w.band(WEDNESDAY, "22:00", "24:00", "0.03")
    w.band(THURSDAY, "00:00", "06:00", "0.02")
    # 1 core, 0 GiB: 1 SU per hour, Wednesday 21:00 → Thursday 01:00 (4 h).
    #   21–22 h: 1 SU × 0.05 = 0.05;  22–24 h: 2 SU × 0.03 = 0.06;  0–1 h: 1 SU × 0.02 = 0.02
    #   total 4 SU, 0.13 (flat: 0.20)
    job = w.job(
        dt.datetime(2025, 3, 12, 21, tzinfo=UTC),
        dt.datetime(2025, 3, 13, 1, tzinfo=UTC),
        cores=1,
        memory="0",
    )
    billing.job_bill(job=job)
    su, amount, pieces = _lines(job)["compute_charge"]
    assert (su, amount) == (D("4.0000"), D("0.13"))
    assert [(p["service_units"], p["price"]) for p in pieces] == [
        ("1.0000", "0.0500"),
        ("2.0000", "0.0300"),
        ("1.0000", "0.0200"),
    ]


def test_each_piece_rounds_its_service_units_before_pricing():
    w = Night()
    w.band(WEDNESDAY, "22:00", "24:00", "0.03")
    # 3 cores, 0 GiB = 3 SU/h; 21:59:00–22:01:00: 60 s each side.
    #   3 × 60 / 3600 = 0.05 SU each → 0.05 × 0.05 + 0.05 × 0.03 = 0.0025 + 0.0015 = 0.004 → 0.00
    #   SU shown: 0.0500 + 0.0500 = 0.1000
    job = w.job(
        dt.datetime(2025, 3, 12, 21, 59, tzinfo=UTC),
        dt.datetime(2025, 3, 12, 22, 1, tzinfo=UTC),
        cores=3,
        memory="0",
    )
    billing.job_bill(job=job)
    su, amount, pieces = _lines(job)["compute_charge"]
    assert (su, amount) == (D("0.1000"), D("0.00"))
    # 100 such runs would be 0.40 — and a longer one: 3 SU/h over 20:00–24:00 (band from 22:00):
    #   2 h × 3 SU × 0.05 = 0.30 + 2 h × 3 SU × 0.03 = 0.18 → 0.48 (flat 0.60)
    long = w.job(
        dt.datetime(2025, 3, 12, 20, tzinfo=UTC),
        dt.datetime(2025, 3, 13, 0, tzinfo=UTC),
        cores=3,
        memory="0",
    )
    billing.job_bill(job=long)
    assert _lines(long)["compute_charge"][:2] == (D("12.0000"), D("0.48"))


def test_run_inside_one_price_keeps_the_flat_figures_and_one_piece():
    w = Night()
    w.band(WEDNESDAY, "22:00", "24:00", "0.03")
    # 12:00–13:00, no band: 3 SU × 0.05 = 0.15 as before time-of-use prices.
    job = w.job(
        dt.datetime(2025, 3, 12, 12, tzinfo=UTC),
        dt.datetime(2025, 3, 12, 13, tzinfo=UTC),
        cores=2,
        memory="4",
    )
    billing.job_bill(job=job)
    su, amount, pieces = _lines(job)["compute_charge"]
    assert (su, amount, len(pieces)) == (D("3.0000"), D("0.15"), 1)


def test_site_with_two_pools_bills_the_pool_the_job_ran_on():
    from federation.models import JobSite
    from tests.factories import DatasetVersionFactory

    w = Night()
    gpu = ComputePool.objects.create(site=w.site, name="gpu", gpus=1, gpu_model="A100")
    PriceRuleFactory(
        pool=gpu,
        effective_from=dt.date(2025, 1, 1),
        cpu_weight=D("1"),
        memory_weight=D("0"),
        gpu_weight=D("10"),
        price_per_unit=D("0.10"),
    )
    start = dt.datetime(2025, 3, 12, 12, tzinfo=UTC)
    job = BillingJobFactory(
        project=w.project, started_at=start, finished_at=start + dt.timedelta(hours=1)
    )
    JobSite.objects.create(
        job=job, site=w.site, dataset_version=DatasetVersionFactory(dataset__site=w.site), pool=gpu
    )
    BillingUsageFactory(
        job=job, site=w.site, cores=2, memory_gib=D("4"), gpus=1,
        ended_at=job.finished_at, reserved_seconds=3600.0,
    )  # fmt: skip
    billing.job_bill(job=job)
    # On the GPU pool's rule: (1×2 + 0×4 + 10×1) × 1 h = 12 SU × 0.10 = 1.20
    # (the site's first pool would give (1×2 + 0.25×4) × 1 h = 3 SU × 0.05 = 0.15).
    su, amount, _ = _lines(job)["compute_charge"]
    assert (su, amount) == (D("12.0000"), D("1.20"))
