"""Compute pools: the admin's settings and calendars, carbon sources (CSV; Electricity Maps and
WattTime replayed from recorded answers on a loopback HTTP server), SuperNode health, the queue
and calendar pages."""

from __future__ import annotations

import http.server
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from federation import carbon, pool_services, superlink
from federation.models import (
    AvailabilityWindow,
    CarbonReading,
    ComputePool,
    FederatedJob,
    JobSite,
    PriceBand,
)
from federation.scheduling import calendar, energy
from portal.models import AuditEvent, Role
from tests.factories import MembershipFactory, SiteFactory, UserFactory

pytestmark = pytest.mark.django_db
RECORDED = Path(__file__).parent / "recorded"


@pytest.fixture
def pool():
    return SiteFactory(institution__name="Hospital A").pools.get()


@pytest.fixture
def admin(pool):
    return MembershipFactory(institution=pool.site.institution, role=Role.INSTITUTION_ADMIN).user


def _settings_post(pool, **overrides):
    data = {
        "slots": 2,
        "cores": 16,
        "memory_gib": "64",
        "gpus": 0,
        "gpu_model": "",
        "time_zone": "Europe/Berlin",
        "base_price": "0.10",
        "currency": "EUR",
        "cpu_weight": "1",
        "memory_weight": "0",
        "gpu_weight": "0",
        "demand_elasticity": "0.5",
        "price_floor": "1",
        "price_cap": "2",
        "carbon_source": "csv",
        "carbon_default": "300",
        "carbon_provider": "",
        "carbon_zone": "",
        "watts_per_core": "12",
        "watts_per_gpu": "250",
    }
    for prefix in ("windows", "bands", "exceptions"):
        data.update(
            {
                f"{prefix}-TOTAL_FORMS": "0",
                f"{prefix}-INITIAL_FORMS": "0",
                f"{prefix}-MIN_NUM_FORMS": "0",
                f"{prefix}-MAX_NUM_FORMS": "1000",
            }
        )
    data.update(overrides)
    return data


def test_admin_saves_resources_window_and_price_band(client, pool, admin):
    client.force_login(admin)
    data = _settings_post(
        pool,
        **{
            "windows-TOTAL_FORMS": "1",
            "windows-0-weekday": "5",
            "windows-0-start": "00:00",
            "windows-0-end": "00:00",
            "windows-0-foreign_only": "on",
            "bands-TOTAL_FORMS": "1",
            "bands-0-weekday": "0",
            "bands-0-start": "08:00",
            "bands-0-end": "20:00",
            "bands-0-price": "0.25",
        },
    )
    response = client.post(reverse("federation:pool_edit", args=[pool.pk]), data)
    assert response.status_code == 302
    pool.refresh_from_db()
    assert (pool.cores, pool.time_zone, pool.watts_per_core) == (16, "Europe/Berlin", 12.0)
    window = AvailabilityWindow.objects.get(pool=pool)
    assert (window.weekday, window.start_minute, window.end_minute) == (5, 0, 1440)
    assert window.foreign_only
    band = PriceBand.objects.get(pool=pool)
    assert (band.start_minute, band.end_minute, str(band.price)) == (480, 1200, "0.2500")
    assert AuditEvent.objects.filter(action="pool.update", target_id=str(pool.pk)).exists()


def test_window_ending_before_start_is_an_inline_error_and_nothing_is_saved(client, pool, admin):
    client.force_login(admin)
    data = _settings_post(
        pool,
        cores="32",
        **{
            "windows-TOTAL_FORMS": "1",
            "windows-0-weekday": "1",
            "windows-0-start": "18:00",
            "windows-0-end": "08:00",
        },
    )
    response = client.post(reverse("federation:pool_edit", args=[pool.pk]), data)
    assert response.status_code == 200
    assert "Must be after the start" in response.content.decode()
    pool.refresh_from_db()
    assert pool.cores == 8 and not AvailabilityWindow.objects.exists()


def test_pool_pages_are_404_for_other_institutions_admins(client, pool):
    other = MembershipFactory(role=Role.INSTITUTION_ADMIN).user
    client.force_login(other)
    for name in ("pool_edit", "pool_queue", "pool_calendar", "pool_calendar_json"):
        assert client.get(reverse(f"federation:{name}", args=[pool.pk])).status_code == 404


def test_carbon_csv_upload_stores_readings(client, pool, admin):
    client.force_login(admin)
    csv = b"datetime,g_per_kwh\n2026-12-01T13:00+01:00,320\n2026-12-01T13:00Z,250.5\n"
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.post(
        reverse("federation:pool_carbon_upload", args=[pool.pk]),
        {"file": SimpleUploadedFile("c.csv", csv, content_type="text/csv")},
    )
    readings = list(CarbonReading.objects.filter(pool=pool).order_by("at"))
    assert [(r.at, r.g_per_kwh) for r in readings] == [
        (datetime(2026, 12, 1, 12, 0, tzinfo=UTC), 320.0),
        (datetime(2026, 12, 1, 13, 0, tzinfo=UTC), 250.5),
    ]


@pytest.mark.parametrize(
    ("csv", "message"),
    [
        (b"time,value\n", "header must name"),
        (
            b"datetime,g_per_kwh\n2026-12-01T13:00,320\n",
            "line 2: '2026-12-01T13:00' has no UTC offset",
        ),
        (b"datetime,g_per_kwh\n2026-12-01T13:00Z,-1\n", "line 2: intensity must be zero or more"),
        (b"datetime,g_per_kwh\n2026-12-01T13:00Z,x\n", "line 2: 'x' is not a number"),
        (b"datetime,g_per_kwh\n2026-12-01T13:00Z,1\n2026-12-01T13:00Z,2\n", "line 3"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_carbon_csv_is_refused_with_its_first_error(client, pool, admin, csv, message):
    client.force_login(admin)
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = client.post(
        reverse("federation:pool_carbon_upload", args=[pool.pk]),
        {"file": SimpleUploadedFile("c.csv", csv, content_type="text/csv")},
        follow=True,
    )
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not CarbonReading.objects.exists()


class _Recorded(http.server.BaseHTTPRequestHandler):
    """Replays a recorded provider answer; remembers the request's path and headers."""

    routes: dict[str, tuple[int, bytes]] = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append((self.path, self.headers))
        status, body = type(self).routes.get(self.path, (404, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def provider():
    _Recorded.routes, _Recorded.seen = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorded
    server.shutdown()
    server.server_close()


def test_electricitymaps_forecast_from_recorded_answer(provider):
    base, handler = provider
    body = (RECORDED / "electricitymaps_forecast_DE.json").read_bytes()
    handler.routes["/v3/carbon-intensity/forecast?zone=DE"] = (200, body)
    points = carbon.forecast("electricitymaps", "DE", base_url=base, token="tok-1")
    assert points[0] == (datetime(2026, 12, 1, 14, tzinfo=UTC), 412.0)
    assert [v for _, v in points] == [412.0, 388.0, 351.0, 297.0]
    assert handler.seen[0][1].get("auth-token") == "tok-1"


def test_watttime_forecast_converts_pounds_per_mwh(provider):
    base, handler = provider
    body = (RECORDED / "watttime_forecast_CAISO_NORTH.json").read_bytes()
    handler.routes["/v3/forecast?region=CAISO_NORTH&signal_type=co2_moer"] = (200, body)
    points = carbon.forecast("watttime", "CAISO_NORTH", base_url=base, token="tok-2")
    # 881 lb/MWh × 453.592 g/lb ÷ 1000 kWh/MWh = 399.6145… g/kWh
    assert points[0][1] == pytest.approx(881.0 * 0.453592)
    assert points[2][1] == pytest.approx(290.29888)
    assert handler.seen[0][1].get("authorization") == "Bearer tok-2"


def test_provider_errors_raise_carbon_error(provider):
    base, handler = provider
    handler.routes["/v3/carbon-intensity/forecast?zone=DE"] = (401, b'{"error":"bad token"}')
    with pytest.raises(carbon.CarbonError, match="HTTP 401"):
        carbon.forecast("electricitymaps", "DE", base_url=base, token="x")
    handler.routes["/v3/carbon-intensity/forecast?zone=FR"] = (200, b'{"zone":"FR"}')
    with pytest.raises(carbon.CarbonError, match="unexpected Electricity Maps answer"):
        carbon.forecast("electricitymaps", "FR", base_url=base, token="x")


def test_provider_forecast_is_stored_as_readings(provider, pool, settings):
    base, handler = provider
    body = (RECORDED / "electricitymaps_forecast_DE.json").read_bytes()
    handler.routes["/v3/carbon-intensity/forecast?zone=DE"] = (200, body)
    settings.FRP_CARBON_ELECTRICITYMAPS_URL = base
    settings.FRP_CARBON_ELECTRICITYMAPS_TOKEN = "tok"
    ComputePool.objects.filter(pk=pool.pk).update(
        carbon_source="provider", carbon_provider="electricitymaps", carbon_zone="DE"
    )
    pool.refresh_from_db()
    assert pool_services.carbon_forecast_fetch(pool=pool) == 4
    assert CarbonReading.objects.filter(pool=pool, forecast=True).count() == 4


def test_health_from_the_superlinks_node_list(pool, monkeypatch, world_job):
    # Two SuperNodes as the Control API's ListNodes reports them; the pool's site last ran as
    # the offline one (its job discovered that node id).
    t = datetime(2026, 12, 1, 13, 40, 3, tzinfo=UTC)
    nodes = [
        superlink.NodeState("5830372181926744062", "online", t, t, None, None, None, 30.0),
        superlink.NodeState("18446744073709551615", "offline", t, t, t, None, None, 30.0),
    ]
    monkeypatch.setattr(superlink, "nodes_list", lambda conn: nodes)
    JobSite.objects.filter(job=world_job, site=pool.site).update(node_id="18446744073709551615")
    conn = superlink.Connection(Path("."), "local", Path("."))
    assert pool_services.pool_health_refresh(conn=conn) == 1
    pool.refresh_from_db()
    assert pool.node_online is False
    assert pool.last_seen_at == t
    JobSite.objects.filter(job=world_job, site=pool.site).update(node_id="5830372181926744062")
    pool_services.pool_health_refresh(conn=conn)
    pool.refresh_from_db()
    assert pool.node_online is True


@pytest.fixture
def world_job(pool):
    from tests.factories import DatasetVersionFactory, ProjectFactory

    version = DatasetVersionFactory(dataset__site=pool.site)
    job = FederatedJob.objects.create(
        project=ProjectFactory(), submitted_by=UserFactory(), title="j", target_column="label"
    )
    JobSite.objects.create(job=job, site=pool.site, dataset_version=version)
    return job


def test_calendar_json_hourly_availability_price_and_carbon(client, pool, admin):
    # Lent Mondays 00–12 UTC only, price 0.30 in Monday 06–09, 0.10 otherwise; carbon 200 then
    # 100 from a reading two hours ahead.
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    ComputePool.objects.filter(pk=pool.pk).update(always_available=False, base_price="0.10")
    monday = now.weekday() == 0
    AvailabilityWindow.objects.create(pool=pool, weekday=0, start_minute=0, end_minute=720)
    PriceBand.objects.create(pool=pool, weekday=0, start_minute=360, end_minute=540, price="0.30")
    CarbonReading.objects.create(
        pool=pool, at=now - timedelta(hours=3), g_per_kwh=200, source="csv"
    )
    CarbonReading.objects.create(
        pool=pool, at=now + timedelta(hours=2), g_per_kwh=100, source="csv"
    )
    client.force_login(admin)
    data = client.get(reverse("federation:pool_calendar_json", args=[pool.pk])).json()
    hours = [datetime.fromisoformat(h) for h in data["hours"]]
    assert len(hours) == 7 * 24
    for h, a, p in zip(hours, data["available"], data["price"], strict=True):
        assert a == int(h.weekday() == 0 and h.hour < 12)
        assert p == (0.30 if h.weekday() == 0 and 6 <= h.hour < 9 else 0.10)
    assert data["carbon"][:4] == [200.0, 200.0, 100.0, 100.0]
    assert monday in (True, False)


def test_weekly_window_in_the_pools_time_zone():
    # Berlin is UTC+1 in December: a Saturday 00:00–24:00 window opens Friday 23:00 UTC.
    start = datetime(2026, 12, 4, 21, 0, tzinfo=UTC)  # a Friday
    open_ = calendar.availability(
        [calendar.WeeklySpan(5, 0, 1440)], [], start=start, steps=4, step_s=3600, tz="Europe/Berlin"
    )
    assert open_ == [False, False, True, True]


def test_price_segments_cut_a_run_exactly_at_band_edges_in_local_time():
    # Berlin is UTC+1: a Friday 22:00–24:00 local band at 0.03 is 21:00–23:00 UTC; a Saturday
    # 00:00–06:00 band at 0.03 too continues it (merged); base 0.05 elsewhere.
    bands = [
        calendar.PriceBand(calendar.WeeklySpan(4, 1320, 1440), 0.03),
        calendar.PriceBand(calendar.WeeklySpan(5, 0, 360), 0.03),
    ]
    start = datetime(2026, 12, 4, 20, 30, tzinfo=UTC)  # Friday 21:30 local
    end = datetime(2026, 12, 5, 6, 15, tzinfo=UTC)  # Saturday 07:15 local
    got = calendar.price_segments(bands, 0.05, start=start, end=end, tz="Europe/Berlin")
    assert got == [
        (start, datetime(2026, 12, 4, 21, tzinfo=UTC), 0.05),
        (datetime(2026, 12, 4, 21, tzinfo=UTC), datetime(2026, 12, 5, 5, tzinfo=UTC), 0.03),
        (datetime(2026, 12, 5, 5, tzinfo=UTC), end, 0.05),
    ]
    assert calendar.price_segments(bands, 0.05, start=end, end=end, tz="UTC") == []


def test_mean_intensity_and_energy_by_hand():
    # 1,800 core-seconds at 10 W = 18,000 J = 0.005 kWh; 30 min at 300 then 30 min at 100 → 200.
    t0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
    readings = [(t0 - timedelta(hours=1), 300.0), (t0 + timedelta(minutes=30), 100.0)]
    kwh = energy.energy_kwh(cpu_seconds=1800, watts_per_core=10, watts_per_gpu=250)
    assert kwh == pytest.approx(0.005)
    mean = energy.mean_intensity(readings, start=t0, end=t0 + timedelta(hours=1), default=0)
    assert mean == pytest.approx(200.0)
    assert energy.emissions_g(kwh, mean) == pytest.approx(1.0)


def test_queue_page_shows_reason_and_estimate(client, pool, admin, world_job):
    FederatedJob.objects.filter(pk=world_job.pk).update(
        sched_reason="Window", status_detail="a pool is not lent at this time", sched_priority=42
    )
    client.force_login(admin)
    html = client.get(reverse("federation:pool_queue", args=[pool.pk])).content.decode()
    assert f"#{world_job.pk} j" in html
    assert "Window" in html and "a pool is not lent at this time" in html


# --- several pools per site ------------------------------------------------------------------


def _new_pool_post(pool, **overrides):
    data = _settings_post(pool, name="gpu", cores=8, gpus=2, gpu_model="NVIDIA A100 80GB")
    for prefix in ("windows", "bands", "exceptions"):
        for key in ("TOTAL_FORMS", "INITIAL_FORMS", "MIN_NUM_FORMS", "MAX_NUM_FORMS"):
            data.pop(f"{prefix}-{key}")
    data.update(overrides)
    return data


def test_admin_adds_a_second_pool_to_a_site(client, pool, admin):
    client.force_login(admin)
    url = reverse("federation:pool_create", args=[pool.site.pk])
    assert client.get(url).status_code == 200

    response = client.post(url, _new_pool_post(pool))

    gpu = ComputePool.objects.get(site=pool.site, name="gpu")
    assert response.status_code == 302 and response.url == reverse(
        "federation:pool_edit", args=[gpu.pk]
    )
    assert (gpu.cores, gpu.gpus, gpu.gpu_model) == (8, 2, "NVIDIA A100 80GB")
    assert pool.site.pools.count() == 2
    event = AuditEvent.objects.get(action="pool.create")
    assert event.data["pool"] == "gpu" and event.data["site"] == pool.site.slug
    # The institution's Sites & pools page lists both, with the way to add another.
    page = client.get(reverse("portal:institution_sites", args=[pool.site.institution.slug]))
    html = page.content.decode()
    assert f"<code>{pool.name}</code>" in html and "<code>gpu</code>" in html
    assert url in html


@pytest.mark.parametrize(
    "overrides, field, message",
    [
        ({"name": ""}, "name", "This field is required."),
        ({"gpu_model": ""}, "gpu_model", "Name the GPU model of the pool's GPUs."),
    ],
)
def test_new_pool_form_errors_inline_and_nothing_saved(
    client, pool, admin, overrides, field, message
):
    client.force_login(admin)
    response = client.post(
        reverse("federation:pool_create", args=[pool.site.pk]), _new_pool_post(pool, **overrides)
    )
    assert response.status_code == 200
    assert message in response.context["form"].errors[field]
    assert pool.site.pools.count() == 1


def test_new_pool_with_the_name_of_another_pool_of_the_site_is_refused(client, pool, admin):
    client.force_login(admin)
    response = client.post(
        reverse("federation:pool_create", args=[pool.site.pk]), _new_pool_post(pool, name=pool.name)
    )
    assert response.status_code == 200
    assert response.context["form"].errors["name"] == [
        f"The site already has a pool named {pool.name}."
    ]
    assert pool.site.pools.count() == 1


def test_new_pool_page_is_404_for_other_institutions_admins_and_researchers(client, pool):
    url = reverse("federation:pool_create", args=[pool.site.pk])
    for role in (Role.INSTITUTION_ADMIN, Role.RESEARCHER):
        other = MembershipFactory(role=role).user
        client.force_login(other)
        assert client.get(url).status_code == 404
        assert client.post(url, _new_pool_post(pool)).status_code == 404
    researcher = MembershipFactory(institution=pool.site.institution, role=Role.RESEARCHER).user
    client.force_login(researcher)
    assert client.get(url).status_code == 404
    assert pool.site.pools.count() == 1


def test_queue_page_shows_a_running_job_on_the_pool_it_runs_on(client, pool, admin, world_job):
    gpu = ComputePool.objects.create(site=pool.site, name="gpu", gpus=1, gpu_model="A100")
    FederatedJob.objects.filter(pk=world_job.pk).update(status="running", started_at=timezone.now())
    JobSite.objects.filter(job=world_job).update(pool=gpu)
    client.force_login(admin)
    on_gpu = client.get(reverse("federation:pool_queue", args=[gpu.pk])).content.decode()
    on_cpu = client.get(reverse("federation:pool_queue", args=[pool.pk])).content.decode()
    assert f"#{world_job.pk} j" in on_gpu
    assert f"#{world_job.pk} j" not in on_cpu


def test_migration_records_the_first_pool_for_jobs_already_started(pool, world_job):
    import importlib

    from django.apps import apps

    from tests.factories import DatasetVersionFactory, ProjectFactory

    migration = importlib.import_module("federation.migrations.0013_jobsite_pool")
    ComputePool.objects.create(site=pool.site, name="gpu", gpus=1, gpu_model="A100")
    FederatedJob.objects.filter(pk=world_job.pk).update(
        status="completed", started_at=timezone.now()
    )
    queued = FederatedJob.objects.create(
        project=ProjectFactory(), submitted_by=UserFactory(), title="q", target_column="label"
    )
    JobSite.objects.create(
        job=queued, site=pool.site, dataset_version=DatasetVersionFactory(dataset__site=pool.site)
    )

    migration.first_pool_for_started_jobs(apps, None)

    assert JobSite.objects.get(job=world_job).pool == pool  # ran before pools were chosen
    assert JobSite.objects.get(job=queued).pool is None  # chosen when it launches
