"""Energy and emissions of usage records and their ledger leaves (issue 15 point 5).

s0 meters 0.25 + 0.125 CPU s in rounds and 0.5 s of contribution work = 0.875 core-seconds.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from accounting.services.usage import usage_record_job
from federation.models import CarbonReading, ComputePool, FederatedJob
from portal.ledger.models import LedgerEntry
from tests.accounting import test_usage

pytestmark = pytest.mark.django_db
metered_job = test_usage.metered_job


def test_usage_energy_and_emissions_by_hand(metered_job):
    job = FederatedJob.objects.get(pk=metered_job.pk)
    start = job.finished_at - timedelta(hours=1)
    FederatedJob.objects.filter(pk=job.pk).update(started_at=start)
    pool = ComputePool.objects.get(site__slug="s0")
    ComputePool.objects.filter(pk=pool.pk).update(watts_per_core=36.0)
    # 300 g/kWh for the first half hour, 100 for the second: mean 200.
    CarbonReading.objects.create(
        pool=pool, at=start - timedelta(hours=2), g_per_kwh=300, source="csv"
    )
    CarbonReading.objects.create(
        pool=pool, at=start + timedelta(minutes=30), g_per_kwh=100, source="csv"
    )
    job.refresh_from_db()
    records = {r.site.slug: r for r in usage_record_job(job=job)}
    # 0.875 s × 36 W = 31.5 J = 8.75e-6 kWh; × 200 g/kWh = 1.75e-3 g
    assert records["s0"].energy_kwh == pytest.approx(8.75e-6)
    assert records["s0"].emissions_g == pytest.approx(1.75e-3)
    leaf = json.loads(LedgerEntry.objects.get(kind="usage", data__contains='"s0"').data)
    assert leaf["energy_wh"] == "0.009"
    assert leaf["emissions_g"] == "0.002"


def test_usage_energy_counts_reserved_gpus_for_the_held_time(metered_job):
    from federation.models import JobSite

    job = FederatedJob.objects.get(pk=metered_job.pk)
    start = job.finished_at - timedelta(hours=1)
    FederatedJob.objects.filter(pk=job.pk).update(started_at=start)
    JobSite.objects.filter(job=job, site__slug="s0").update(gpus=1)
    pool = ComputePool.objects.get(site__slug="s0")
    ComputePool.objects.filter(pk=pool.pk).update(watts_per_core=36.0, watts_per_gpu=250.0)
    CarbonReading.objects.create(
        pool=pool, at=start - timedelta(hours=1), g_per_kwh=200, source="csv"
    )
    job.refresh_from_db()
    records = {r.site.slug: r for r in usage_record_job(job=job)}
    # No GPU time is metered: the reserved GPU is held for the run, 1 × 3600 s × 250 W = 900 kJ.
    # (0.875 s × 36 W + 900,000 J) / 3.6e6 = 900,031.5 / 3.6e6 = 0.25000875 kWh; × 200 = 50.00175 g
    assert records["s0"].energy_kwh == pytest.approx(0.25000875)
    assert records["s0"].emissions_g == pytest.approx(50.00175)


def test_usage_energy_uses_the_power_and_carbon_of_the_pool_the_job_ran_on(metered_job):
    from federation.models import JobSite

    job = FederatedJob.objects.get(pk=metered_job.pk)
    start = job.finished_at - timedelta(hours=1)
    FederatedJob.objects.filter(pk=job.pk).update(started_at=start)
    first = ComputePool.objects.get(site__slug="s0")
    ComputePool.objects.filter(pk=first.pk).update(watts_per_core=1000.0, carbon_default=900)
    other = ComputePool.objects.create(
        site=first.site, name="second", watts_per_core=36.0, carbon_default=200
    )
    JobSite.objects.filter(job=job, site__slug="s0").update(pool=other)
    job.refresh_from_db()
    records = {r.site.slug: r for r in usage_record_job(job=job)}
    # The second pool's figures: 0.875 s × 36 W = 8.75e-6 kWh; × 200 g/kWh (its default) = 1.75e-3
    assert records["s0"].energy_kwh == pytest.approx(8.75e-6)
    assert records["s0"].emissions_g == pytest.approx(1.75e-3)
