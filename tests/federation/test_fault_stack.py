"""Fault: the whole stack (worker, SuperLink, every SuperNode) killed mid-job and started again
on the same SuperLink database. The reconcile must end the job FAILED with a readable reason."""

from __future__ import annotations

import os
import signal

import pytest
from django.conf import settings

from federation import callbacks, runtime
from federation.models import JobStatus
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("fault-stack"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as w:
        yield w


def test_stack_killed_mid_job_and_restarted_reconciles_the_job_to_failed(world, django_db_blocker):
    with django_db_blocker.unblock():
        job = fs.submit(world, title="lose everything", num_rounds=30)
        fs.wait_round(job.pk, 1)
        state = world.federation
        world.worker_kill()
        for pid in [state.superlink_pid, *state.supernodes.values()]:
            os.killpg(pid, signal.SIGKILL)
        runtime.stop(state)  # reaps them and removes the state file

        sites = [runtime.LocalSite(**fields) for fields in state.sites.values()]
        world.federation = runtime.start(
            world.runtime_root, sites, superlink_env=callbacks.serverapp_environment()
        )  # the same folder: the same SuperLink database
        runtime.write_state_control_config(
            settings.FRP_FLWR_HOME, settings.FRP_FEDERATION_NAME, world.federation
        )
        world.worker_start()

        job = fs.wait_terminal(job.pk, timeout=600, world=world)

        assert job.status == JobStatus.FAILED
        assert fs.is_sentence(job.status_detail), job.status_detail
