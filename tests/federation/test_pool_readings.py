"""Pools read through an adapter, in the portal: the pool form's adapter fields and their inline
errors, the reading stored by the refresh (a failed read is a down pool with its reason, never an
error page), what the scheduler's snapshot makes of it (``admission.pool_capacity``), and the
pool page. Slurm is a stand-in ``scontrol`` here printing the outputs recorded from the real one;
``test_slurm_integration.py`` runs the real Slurm."""

from __future__ import annotations

import stat
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from federation import admission, pool_services, scheduling, tasks
from federation.models import ComputePool
from portal.models import AuditEvent, Role
from tests.factories import MembershipFactory, SiteFactory
from tests.federation.test_pools import _settings_post

pytestmark = pytest.mark.django_db
RECORDED = Path(__file__).parent / "recorded" / "slurm"


@pytest.fixture
def pool():
    return SiteFactory(institution__name="Hospital A").pools.get()


@pytest.fixture
def admin(pool):
    return MembershipFactory(institution=pool.site.institution, role=Role.INSTITUTION_ADMIN).user


@pytest.fixture
def scontrol(tmp_path, settings):
    """A stand-in scontrol printing the recorded partition and the recorded nodes of ``state``
    (``scontrol.state = "drained"`` …); ``settings.FRP_SLURM_SCONTROL`` names it."""

    class Stand:
        state = "idle"

        def set(self, state: str) -> None:
            (tmp_path / "nodes.txt").write_text((RECORDED / f"nodes_{state}.txt").read_text())

    (tmp_path / "partition.txt").write_text((RECORDED / "partition_frp.txt").read_text())
    path = tmp_path / "scontrol"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$3" = partition ]; then cat {tmp_path / "partition.txt"}; '
        f"else cat {tmp_path / 'nodes.txt'}; fi\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    settings.FRP_SLURM_SCONTROL = str(path)
    stand = Stand()
    stand.set("idle")
    return stand


def _slurm(pool, **kw):
    pool.adapter, pool.slurm_partition = "slurm", kw.pop("partition", "frp")
    for k, v in kw.items():
        setattr(pool, k, v)
    pool.save()
    return pool


# --- the form ---------------------------------------------------------------------------------


def test_admin_sets_a_slurm_partition_and_a_reading_of_before_is_cleared(client, pool, admin):
    pool.health, pool.read_at, pool.reading = "up", timezone.now(), {"total": {"cores": 1}}
    pool.save()
    client.force_login(admin)
    url = reverse("federation:pool_edit", args=[pool.pk])
    response = client.post(
        url,
        _settings_post(
            pool, adapter="slurm", slurm_partition=" batch ", slurm_conf="/etc/slurm/slurm.conf"
        ),
    )
    assert response.status_code == 302
    pool.refresh_from_db()
    assert (pool.adapter, pool.slurm_partition, pool.slurm_conf) == (
        "slurm",
        "batch",
        "/etc/slurm/slurm.conf",
    )
    assert (pool.health, pool.read_at, pool.reading) == ("", None, {})
    page = client.get(url).content.decode()
    assert "Slurm partition" in page and "not read yet" in page
    assert "The Slurm partition whose nodes the pool lends" in page  # help text


@pytest.mark.parametrize(
    "overrides, field, message",
    [
        ({"adapter": "slurm"}, "slurm_partition", "A Slurm pool needs the partition to read."),
        (
            {"adapter": "slurm", "slurm_partition": "a;b"},
            "slurm_partition",
            "Letters, digits, dot, dash and underscore only",
        ),
        (
            {"adapter": "slurm", "slurm_partition": "b", "slurm_conf": "etc/slurm.conf"},
            "slurm_conf",
            "An absolute path without '..'",
        ),
        ({"adapter": "pbs"}, "adapter", "Select a valid choice."),
    ],
)
def test_adapter_errors_are_inline_and_nothing_saved(
    client, pool, admin, overrides, field, message
):
    client.force_login(admin)
    response = client.post(
        reverse("federation:pool_edit", args=[pool.pk]), _settings_post(pool, **overrides)
    )
    assert response.status_code == 200
    errors = response.context["form"].errors[field]
    assert any(e.startswith(message) for e in errors), errors
    assert f'<div class="invalid-feedback d-block">{escape(errors[0])}</div>' in (
        response.content.decode()
    )
    pool.refresh_from_db()
    assert pool.adapter == "static"


# --- reading, storing, failing ------------------------------------------------------------------


def test_refresh_stores_the_reading_and_audits_a_change_of_health(pool, scontrol):
    _slurm(pool)
    reading = pool_services.pool_reading_refresh(pool=pool)
    pool.refresh_from_db()
    assert reading is not None
    assert (pool.health, pool.health_reason) == ("up", "")
    assert pool.reading["total"] == {"cores": 2, "memory_gib": 1.0, "gpus": {}}
    assert pool.read_at == reading.read_at
    scontrol.set("drained")
    pool_services.pool_reading_refresh(pool=pool)
    pool_services.pool_reading_refresh(pool=pool)  # same health: no second event
    pool.refresh_from_db()
    assert (pool.health, pool.health_reason) == ("drained", "localhost idle+drain: maintenance")
    events = AuditEvent.objects.filter(action="pool.health", target_id=str(pool.pk))
    assert [e.data["health"] for e in events.order_by("pk")] == ["up", "drained"]


def test_failed_read_is_a_down_pool_with_the_error_as_reason(pool, settings):
    settings.FRP_SLURM_SCONTROL = "/nonexistent/scontrol"
    _slurm(pool, reading={"total": {"cores": 2}})
    assert pool_services.pool_reading_refresh(pool=pool) is None
    pool.refresh_from_db()
    assert pool.health == "down"
    assert "/nonexistent/scontrol not found" in pool.health_reason
    assert pool.reading == {} and pool.read_at is not None


def test_beat_task_reads_slurm_pools_only(pool, scontrol, monkeypatch):
    static = SiteFactory().pools.get()
    _slurm(pool)
    monkeypatch.setattr(tasks.services, "superlink_connection", lambda: None)
    monkeypatch.setattr(pool_services, "pool_health_refresh", lambda **kw: 0)  # no SuperLink here
    tasks.pools_refresh_task()
    pool.refresh_from_db()
    static.refresh_from_db()
    assert pool.health == "up" and pool.read_at is not None
    assert static.health == "" and static.read_at is None


# --- what the scheduler sees ------------------------------------------------------------------


def test_static_pool_is_its_figures(pool):
    capacity, usable, online, reason = admission.pool_capacity(pool, now=timezone.now())
    assert (capacity, usable, online, reason) == (
        scheduling.Resources(pool.cores, float(pool.memory_gib), pool.gpus),
        None,
        True,
        "",
    )


def test_slurm_pool_lends_the_smaller_of_its_figures_and_slurms(pool, scontrol):
    _slurm(pool, cores=8, memory_gib=32)
    scontrol.set("mixed")
    pool_services.pool_reading_refresh(pool=pool)
    capacity, usable, online, _ = admission.pool_capacity(pool, now=timezone.now())
    assert capacity == scheduling.Resources(2, 1.0, 0)
    assert usable == scheduling.Resources(1, 0.75, 0)
    assert online
    pool.cores = 1  # the admin lends one core at most
    assert admission.pool_capacity(pool, now=timezone.now())[0].cores == 1


@pytest.mark.parametrize(
    "state, why",
    [
        ("never", "Slurm partition frp not read yet"),
        ("stale", "Slurm partition frp last read 20 min ago"),
        ("drained", "Slurm partition frp drained: localhost idle+drain: maintenance"),
    ],
)
def test_slurm_pool_is_down_unread_stale_or_drained(pool, scontrol, state, why):
    _slurm(pool)
    now = timezone.now()
    if state != "never":
        scontrol.set("idle" if state == "stale" else state)
        pool_services.pool_reading_refresh(pool=pool)
        if state == "stale":
            now = pool.read_at + timedelta(minutes=20)
    _, _, online, reason = admission.pool_capacity(pool, now=now)
    assert not online
    assert reason.startswith(why)


def test_pool_page_shows_adapter_health_reason_capacity_and_time(client, pool, admin, scontrol):
    _slurm(pool)
    scontrol.set("drained")
    pool_services.pool_reading_refresh(pool=pool)
    pool.refresh_from_db()
    client.force_login(admin)
    html = client.get(reverse("federation:pool_edit", args=[pool.pk])).content.decode()
    assert 'id="pool-health">Drained<' in html
    assert "localhost idle+drain: maintenance" in html
    assert f"read {pool.read_at:%Y-%m-%d %H:%M:%S} UTC" in html
    assert "<code>frp</code>" in html


def test_read_now_button_reads_and_reports_a_failure_without_an_error_page(
    client, pool, admin, settings
):
    settings.FRP_SLURM_SCONTROL = "/nonexistent/scontrol"
    _slurm(pool)
    client.force_login(admin)
    response = client.post(reverse("federation:pool_read", args=[pool.pk]), follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "The pool could not be read" in html and "not found" in html
    pool.refresh_from_db()
    assert pool.health == "down"


def test_read_now_is_404_for_other_institutions_admins(client, pool):
    other = MembershipFactory(role=Role.INSTITUTION_ADMIN).user
    client.force_login(other)
    assert client.post(reverse("federation:pool_read", args=[pool.pk])).status_code == 404
    assert ComputePool.objects.get(pk=pool.pk).read_at is None
