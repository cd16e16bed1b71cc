"""Admission of real jobs through the pure scheduler (``federation.admission``): windows, the
greenest start, budgets, health, and the per-policy estimates of the job form.

Times are on the plan's grid: ``FRP_SCHED_STEP_SECONDS`` (300 s) from the pass's ``now``.
"""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from federation import services
from federation.models import (
    AvailabilityException,
    CarbonReading,
    ComputePool,
    JobStatus,
    ProjectAllocation,
)
from tests.federation import test_services as svc

# the service tests' fixtures: a project with two granted sites, the faked SuperLink, a launch
world, fake_superlink, launch = svc.world, svc.fake_superlink, svc.launch

pytestmark = pytest.mark.django_db
STEP = 300


def _pools(world):
    return ComputePool.objects.filter(site__in=[v.dataset.site for v in world["versions"]])


def _grid_after(now, at):
    """The first plan step starting at or after ``at``."""
    return now + timedelta(seconds=STEP * math.ceil((at - now).total_seconds() / STEP))


def test_job_waits_for_window_then_starts_in_it(world, fake_superlink, launch, monkeypatch):
    now = timezone.now()
    reopen = now + timedelta(hours=1)
    for pool in _pools(world):
        AvailabilityException.objects.create(
            pool=pool, start=now - timedelta(hours=1), end=reopen, available=False
        )
    job = launch(world)
    assert job.status == JobStatus.QUEUED
    assert job.sched_reason == "Window"
    assert "availability window" in job.status_detail
    # planned at the first step of the reopened window (the pass ran a moment after ``now``)
    assert reopen <= job.est_start <= reopen + timedelta(seconds=STEP)
    assert fake_superlink.submitted == []

    later = reopen + timedelta(minutes=1)
    monkeypatch.setattr(timezone, "now", lambda: later)
    job = services.job_launch(job_id=job.pk)
    assert job.status == JobStatus.RUNNING
    assert len(fake_superlink.submitted) == 1


def test_greenest_job_starts_at_the_forecast_minimum(world, fake_superlink, launch, monkeypatch):
    now = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(timezone, "now", lambda: now)
    hour0 = now.replace(minute=0, second=0) + timedelta(hours=1)
    low = hour0 + timedelta(hours=5)
    for pool in _pools(world):
        pool.carbon_source = "csv"
        pool.save()
        CarbonReading.objects.create(
            pool=pool, at=now - timedelta(hours=1), g_per_kwh=450, source="csv"
        )
        for h in range(24):
            at = hour0 + timedelta(hours=h)
            g = 80.0 if at == low else 450.0 - 10 * (h % 3)
            CarbonReading.objects.create(pool=pool, at=at, g_per_kwh=g, source="csv")
    job = launch(
        world,
        schedule={"policy": "greenest", "deadline": now + timedelta(hours=12)},
    )
    assert job.status == JobStatus.QUEUED
    assert job.sched_reason == "TimeShift"
    assert job.est_start == _grid_after(now, low)
    assert job.est_emissions_g < job.est_energy_kwh * 100  # at the 80 g/kWh hour
    assert fake_superlink.submitted == []

    monkeypatch.setattr(timezone, "now", lambda: job.est_start)
    assert services.job_launch(job_id=job.pk).status == JobStatus.RUNNING


def test_job_over_its_budget_cap_is_refused(world, fake_superlink, launch):
    _pools(world).update(base_price=Decimal("10"))
    job = launch(world, schedule={"budget_cap": Decimal("0.01")})
    assert job.status == JobStatus.FAILED
    assert "refused by the scheduler: Budget" in job.status_detail
    assert "above the cap 0.01" in job.status_detail
    assert fake_superlink.submitted == []
    # the scheduler's word stays on the job: the reason code and the cheapest start's cost
    assert job.sched_reason == "Budget"
    assert job.est_cost is not None and job.est_cost > Decimal("0.01")
    assert f"the cheapest start costs {job.est_cost:.2f}" in job.status_detail
    assert job.est_start is None


def test_job_over_project_budget_waits(world, fake_superlink, launch):
    _pools(world).update(base_price=Decimal("10"))
    ProjectAllocation.objects.create(project=world["project"], budget=Decimal("0.05"))
    job = launch(world)
    assert job.status == JobStatus.QUEUED
    assert job.sched_reason == "Budget"
    assert "remaining 0.05" in job.status_detail


def test_job_at_offline_node_waits_with_node_down(world, fake_superlink, launch):
    pool = _pools(world).first()
    pool.node_online = False
    pool.save()
    job = launch(world)
    assert (job.status, job.sched_reason) == (JobStatus.QUEUED, "NodeDown")


def test_resources_per_site_are_recorded_and_checked(world, fake_superlink, launch):
    _pools(world).update(cores=4)
    job = launch(world, schedule={"cores": 3, "memory_gib": Decimal("4"), "gpus": 0})
    assert job.status == JobStatus.RUNNING
    assert {js.cores for js in job.sites.all()} == {3}
    second = launch(world, schedule={"cores": 2})  # 3 + 2 > 4 cores: waits for resources
    assert (second.status, second.sched_reason) == (JobStatus.QUEUED, "Resources")
    too_big = launch(world, schedule={"cores": 5})
    assert too_big.status == JobStatus.FAILED
    assert "less than the job asks for" in too_big.status_detail


def test_estimate_partial_lists_each_policy(world, client):
    now = timezone.now()
    for pool in _pools(world):
        pool.base_price = Decimal("2")
        pool.save()
    client.force_login(world["pi"])
    data = {
        "title": "t",
        "project": world["project"].pk,
        "datasets": [v.pk for v in world["versions"]],
        "target_column": "label",
        "num_rounds": 2,
        "local_epochs": 1,
        "learning_rate": 0.1,
        "sched-policy": "asap",
        "sched-cores": 1,
        "sched-memory_gib": 2,
        "sched-gpus": 0,
    }
    response = client.post(reverse("federation:job_estimate"), data)
    assert response.status_code == 200
    html = response.content.decode()
    for label in ("As soon as possible", "Cheapest before the deadline", "Lowest carbon"):
        assert label in html
    rows = response.context["estimates"]["rows"]
    asap = next(r for r in rows if r["policy"] == "asap")
    assert asap["action"] == "start"
    assert abs((asap["start"] - now).total_seconds()) < 120
    duration = response.context["estimates"]["duration_s"]
    # 2 sites × 1 core × 2.00 per core-hour × the estimated hours
    assert asap["cost"] == Decimal(str(round(2 * 2 * duration / 3600, 2)))


def test_gpu_and_cpu_jobs_go_to_the_pool_of_their_site_that_meets_them(
    world, fake_superlink, launch
):
    # Each site: its first pool (CPU, 8 cores, no GPU) and a GPU pool (8 cores, 1 A100).
    cpu = {p.site_id: p for p in _pools(world)}
    gpu = {
        site_id: ComputePool.objects.create(
            site_id=site_id, name="gpu", cores=8, gpus=1, gpu_model="NVIDIA A100"
        )
        for site_id in cpu
    }
    gpu_job = launch(world, schedule={"cores": 2, "gpus": 1})
    assert gpu_job.status == JobStatus.RUNNING
    assert {js.site_id: js.pool_id for js in gpu_job.sites.all()} == {
        s: p.pk for s, p in gpu.items()
    }
    cpu_job = launch(world, schedule={"cores": 2, "gpus": 0})
    assert cpu_job.status == JobStatus.RUNNING  # best fit: the CPU pools, which are free
    assert {js.site_id: js.pool_id for js in cpu_job.sites.all()} == {
        s: p.pk for s, p in cpu.items()
    }
    # A second GPU job waits for the GPU pools (one slot each), not for the CPU pools.
    second = launch(world, schedule={"cores": 2, "gpus": 1})
    assert (second.status, second.sched_reason) == (JobStatus.QUEUED, "Resources")
    assert {js.pool_id for js in second.sites.all()} == {None}  # chosen at launch
    too_big = launch(world, schedule={"cores": 2, "gpus": 2})
    assert too_big.status == JobStatus.FAILED
    assert "less than the job asks for" in too_big.status_detail


def _finished(project, model, rounds, seconds, now):
    from tests.factories import BillingJobFactory

    return BillingJobFactory(
        project=project,
        model=model,
        num_rounds=rounds,
        started_at=now - timedelta(seconds=seconds),
        finished_at=now,
    )


def test_duration_estimate_without_history_uses_the_measured_fixed_and_round_costs(world):
    from federation.admission import duration_estimate

    # 34 s fixed + 5 × (6.2 s + 1 epoch × 455 rows × 2 µs) = 34 + 5 × 6.20091 = 65.00455 s
    assert duration_estimate(model="logreg", num_rounds=5, local_epochs=1, rows=455) == (
        pytest.approx(65.00455)
    )


def test_duration_estimate_fits_a_line_through_jobs_of_different_lengths(world):
    """Three finished jobs of 2, 5 and 10 rounds taking 30 s + 6.5 s a round (43, 62.5, 95 s):
    the line through them gives 30 + 6.5 × 7 = 75.5 s for seven rounds. Seconds per round
    alone (the median of 21.5, 12.5, 9.5) would have said 20 + 7 × 12.5 = 107.5 s."""
    from federation.admission import duration_estimate

    now = timezone.now()
    for rounds in (2, 5, 10):
        _finished(world["project"], "logreg", rounds, 30 + 6.5 * rounds, now)
    _finished(world["project"], "mlp", 3, 500, now)  # another model's history is not used
    assert duration_estimate(model="logreg", num_rounds=7, local_epochs=1, rows=100) == (
        pytest.approx(75.5)
    )


def test_duration_estimate_with_one_round_count_takes_the_median_after_the_fixed_cost(world):
    """Three 4-round jobs of 54, 58 and 90 s: after the 34 s fixed cost 5, 6 and 14 s a round,
    median 6 s, so six rounds are estimated at 34 + 6 × 6 = 70 s."""
    from federation.admission import duration_estimate

    now = timezone.now()
    for seconds in (54, 58, 90):
        _finished(world["project"], "logreg", 4, seconds, now)
    assert duration_estimate(model="logreg", num_rounds=6, local_epochs=1, rows=100) == (
        pytest.approx(70.0)
    )


def test_job_duration_estimate_takes_the_rows_as_released(world):
    """The job form and page show the estimate to researchers, so it is computed from the rows as
    the profile releases them (nearest 5, 1–7 as 4), never the exact ones (issue 9, finding 5):
    457 and 453 rows both give the estimate of 455 rows, 34 + 5 × (6.2 + 455 × 2 µs) = 65.00455 s;
    a 3-row and a 6-row dataset give that of 4 rows, and a job's estimate is that of its largest."""
    from types import SimpleNamespace

    from federation.admission import duration_estimate, job_duration_estimate

    def est(*rows):
        versions = [SimpleNamespace(row_count=n) for n in rows]
        return job_duration_estimate(
            model="linear", num_rounds=5, local_epochs=1, versions=versions
        )

    assert est(457) == est(453) == est(455) == pytest.approx(65.00455)
    assert est(457) != duration_estimate(model="linear", num_rounds=5, local_epochs=1, rows=457)
    assert est(3) == est(6) == pytest.approx(34 + 5 * (6.2 + 4 * 2e-6))
    assert est(3, 457, 120) == est(455)


def test_a_submitted_jobs_estimate_uses_the_history_of_its_own_model_kind(world):
    """``job_submit`` estimates from finished jobs of the job's model kind (a linear job's
    ``FederatedJob.model`` is ``linear``; the estimate once asked for ``logreg``, which no job
    submitted through the form has, so history was never used): three linear jobs of 2, 5 and
    10 rounds taking 30 s + 6.5 s a round give 30 + 6.5 × 3 = 49.5 s for a 3-round job."""
    now = timezone.now()
    for rounds in (2, 5, 10):
        _finished(world["project"], "linear", rounds, 30 + 6.5 * rounds, now)
    job = svc.submit(world, num_rounds=3)
    assert job.model == "linear"
    assert job.estimated_seconds == pytest.approx(49.5)
