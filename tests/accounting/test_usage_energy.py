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
