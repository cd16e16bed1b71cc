"""Fault: the Celery worker killed (SIGKILL) while a job is LAUNCHING, after the SuperLink started
the job's run but before the worker recorded it.

Made deterministic with a lock, not a delay: the test holds an exclusive lock on the audit table,
so the worker's recording transaction (which writes the ``job.launch`` audit event) waits while
the run already exists on the SuperLink. Then the worker is killed, its embedded beat must end with
it, and a new worker must find the run by the job's launch nonce instead of starting another:
exactly one Flower run belongs to the job, it is the job's recorded run, and the job completes.
Callbacks signed for any other run id are refused, and a portal run whose nonce no job holds is
stopped by the reconcile.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection, transaction
from django.test import Client

from federation import callbacks, services, superlink
from federation.models import JobStatus
from frp_flwr.signing import job_key, sign
from portal.models import AuditEvent
from tests.federation import fault_support as fs
from tests.federation.conftest import flower_world, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("fault-worker"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as w:
        yield w


def _lock_audit_table() -> psycopg.Connection:
    """A second connection holding ``LOCK TABLE portal_auditevent IN EXCLUSIVE MODE`` (reads go
    on; inserts wait) until it is closed."""
    db = connection.settings_dict
    conn = psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=False
    )
    conn.execute("LOCK TABLE portal_auditevent IN EXCLUSIVE MODE")
    return conn


def test_worker_killed_while_launching_leaves_one_run_found_by_its_nonce(world, django_db_blocker):
    with django_db_blocker.unblock():
        held = {}
        with transaction.atomic():
            # Runs after the commit, before the launch task is sent (callbacks run in order).
            transaction.on_commit(lambda: held.setdefault("lock", _lock_audit_table()))
            job = fs.submit(world, title="launch, crash, relaunch", num_rounds=2)
        try:
            # The worker started the run, and waits to record it.
            job = wait_for(
                lambda: (j := fs.job(job.pk)).launch_nonce and j,
                timeout=300,
                what="the launch nonce",
            )
            (run,) = wait_for(lambda: fs.runs_of(job.pk), timeout=300, what="the run")
            assert run.run_config["launch-nonce"] == job.launch_nonce
            job = fs.job(job.pk)
            assert job.status == JobStatus.LAUNCHING and not job.flower_run_id
            (beat,) = fs.children_of(world.worker.pid)

            world.worker_kill()
        finally:
            held["lock"].close()

        wait_for(lambda: not fs.alive(beat), timeout=60, what="the embedded beat to end")
        world.worker_start()
        job = fs.wait_terminal(job.pk, timeout=600, world=world)

        assert job.status == JobStatus.COMPLETED, job.status_detail
        runs = fs.runs_of(job.pk)
        assert [r.run_id for r in runs] == [run.run_id] == [job.flower_run_id]
        launches = AuditEvent.objects.filter(
            action="job.launch", target_type="federation.federatedjob", target_id=str(job.pk)
        )
        assert [e.data for e in launches] == [
            {"run_id": run.run_id, "found_by_nonce": True, "shapley_consent": True}
        ]
        assert not AuditEvent.objects.filter(action="job.orphan_run_stop").exists()

        # Callbacks are accepted only from the job's recorded run.
        master = callbacks.master_key()
        body = json.dumps({"event": "failed", "reason": "forged", "seq": 10**6}).encode()
        other = str(int(run.run_id) ^ 1)
        response = Client().post(
            f"/jobs/callback/{job.pk}/",
            data=body,
            content_type="application/json",
            headers=sign(job_key(master, job_id=job.pk, run_id=other), body),
        )
        assert response.status_code == 403
        assert fs.job(job.pk).failure_reason == ""

        # A portal run whose nonce no job holds (a launch that lost its job) is stopped.
        config = {**services.job_run_config(job).to_flower(), "launch-nonce": "f" * 32}
        orphan = superlink.run_submit(fs.connection(), config)
        stopped = wait_for(
            lambda: (r := superlink.run_status(fs.connection(), orphan)).is_finished and r,
            timeout=120,
            what="the orphan run to be stopped",
        )
        assert stopped.sub_status == "stopped"
        event = wait_for(
            lambda: AuditEvent.objects.filter(action="job.orphan_run_stop").first(),
            timeout=60,
            what="the orphan's audit event",
        )
        assert event.data["run_id"] == orphan and event.target_id == str(job.pk)
