"""Fault: a site's SuperNode killed mid-round (SIGKILL to its process group), then restarted alone.

Three sites, so the job can go on without one. The job page must say which site was lost in which
round and count it; ``manage.py supernode_restart`` must restart that site alone (the SuperLink and
the other SuperNodes keep their processes), and the admin page must show each SuperNode's state as
the SuperLink reports it: the dead node offline, then online again after the restart. With SuperNode
authentication (on by default, ADR 0021) the site's key is registered once, so the restarted
SuperNode comes back under the same node id.
"""

from __future__ import annotations

import os
import signal

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import reverse

from federation import runtime, selectors, superlink
from federation.models import JobStatus, SiteRoundMetric
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("hospital-a", "hospital-b", "hospital-c")
LOST = "hospital-c"


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        SITES,
        root=tmp_path_factory.mktemp("fault-supernode"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as w:
        yield w


def test_supernode_killed_mid_round_is_named_and_counted_then_restarts_alone(
    world, django_db_blocker
):
    with django_db_blocker.unblock():
        job = fs.submit(world, title="lose a site", num_rounds=4)
        fs.wait_round(job.pk, 1)
        old_node = job.sites.get(site__slug=LOST).node_id
        os.killpg(world.federation.supernodes[LOST], signal.SIGKILL)

        job = fs.wait_terminal(job.pk, timeout=900, world=world)

        # The job went on with the other two sites and says which site it lost in which round.
        assert job.status == JobStatus.COMPLETED, job.status_detail
        ok_rounds = list(
            SiteRoundMetric.objects.filter(
                job_site__job=job, job_site__site__slug=LOST, ok=True
            ).values_list("round", flat=True)
        )
        lost_round = max(ok_rounds) + 1
        assert lost_round >= 2
        progress = selectors.job_progress(job=job)
        assert [(lost["site"], lost["round"]) for lost in progress["lost"]] == [(LOST, lost_round)]
        assert fs.is_sentence(progress["lost"][0]["error"]), progress["lost"][0]["error"]
        html = fs.page(world.researcher, reverse("federation:job_detail", args=[job.pk]))
        assert "1 of 3 sites lost" in html
        assert f"<code>{LOST}</code> in round {lost_round}" in html
        assert f'data-lost-round="{lost_round}"' in html
        data = fs.page(world.researcher, reverse("federation:job_progress_json", args=[job.pk]))
        assert f'"site": "{LOST}", "round": {lost_round}' in data

        # The SuperLink counts the killed SuperNode offline before the restart.
        wait_for(
            lambda: (
                {n.node_id: n for n in superlink.nodes_list(fs.connection())}[old_node].status
                == "offline"
            ),
            timeout=120,
            what="the killed SuperNode offline",
        )
        admin = get_user_model().objects.create_user("root", password="pw-admin-123", is_staff=True)
        html = fs.page(admin, reverse("federation:supernodes"))
        assert f'data-node-id="{old_node}" data-status="offline" data-site="{LOST}"' in html

        # Restart that site alone: nothing else is touched.
        before = runtime.load_state(world.runtime_root)
        others = {s: p for s, p in before.supernodes.items() if s != LOST}
        call_command("supernode_restart", LOST)
        after = runtime.load_state(world.runtime_root)
        assert after.superlink_pid == before.superlink_pid and fs.alive(after.superlink_pid)
        assert after.superlink_address == before.superlink_address
        assert {s: after.supernodes[s] for s in others} == others
        assert all(fs.alive(p) for p in others.values())
        assert after.supernodes[LOST] != before.supernodes[LOST]
        assert fs.alive(after.supernodes[LOST])

        # The SuperLink sees the restarted SuperNode online again, under its registered node id.
        def restarted_online():
            states = selectors.supernode_states()["nodes"]
            return [n for n in states if n["site"] == LOST and n["status"] == "online"] or None

        (new,) = wait_for(restarted_online, timeout=120, what="the restarted SuperNode online")
        assert new["node_id"] == old_node == after.node_ids[LOST]
        states = {n.node_id: n for n in superlink.nodes_list(fs.connection())}
        assert sum(1 for n in states.values() if n.status == "online") == 3

        html = fs.page(admin, reverse("federation:supernodes"))
        assert f'data-node-id="{new["node_id"]}" data-status="online" data-site="{LOST}"' in html
        for site in others:
            assert f'data-status="online" data-site="{site}"' in html
