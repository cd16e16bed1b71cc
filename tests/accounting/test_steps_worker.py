"""The sweep in a real Celery worker (Redis, PostgreSQL, beat, two prefork processes): a finished
job whose hand-off was lost is found by the periodic sweep (every second, no grace period) and
accounted for exactly once; two more sweeps sent at the same moment and the later beat ticks
write nothing more. (Chains racing on one job are tested in-process, in ``test_steps.py``.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from accounting.models import JobAccountingStep
from accounting.tasks import job_accounting_sweep_task
from tests.accounting.steps_world import build_steps_world, hand_off_lost
from tests.accounting.test_steps import _accounted_once
from tests.federation.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SWEEP_DONE = re.compile(r"Task accounting\.job_accounting_sweep\[[^]]+\] succeeded")


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A Celery worker with beat on the test database, sweeping every second; stopped before
    the test database is flushed."""
    import redis

    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
    db = connection.settings_dict
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        FRP_VAR_DIR=str(tmp_path / "worker-var"),
        FRP_ACCOUNTING_SWEEP_SECONDS="1",
        FRP_ACCOUNTING_SWEEP_GRACE_SECONDS="0",
        FRP_RECONCILE_SECONDS="3600",
        FRP_LEDGER_CHECKPOINT_SECONDS="3600",
    )
    log = tmp_path / "worker.log"
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("celery")),
            "-A",
            "portal",
            "worker",
            "-B",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp_path / "beat-schedule"),
        ],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield log
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _sweeps(log: Path) -> int:
    return len(SWEEP_DONE.findall(log.read_text(errors="replace")))


def test_worker_sweep_accounts_a_job_whose_hand_off_was_lost_once(worker):
    with hand_off_lost():  # the job ended while nothing took it on
        job = build_steps_world().job()
    assert not JobAccountingStep.objects.filter(job=job).exists()
    wait_for(lambda: "ready." in worker.read_text(errors="replace"), timeout=120, what="the worker")
    job_accounting_sweep_task.delay()  # two more sweeps at once, beside beat's
    job_accounting_sweep_task.delay()

    def accounted():
        states = set(JobAccountingStep.objects.filter(job=job).values_list("status", flat=True))
        return states == {"done"} and JobAccountingStep.objects.filter(job=job).count() == 4

    wait_for(accounted, timeout=120, interval=0.5, what="the sweep to account for the job")
    seen = _sweeps(worker)
    wait_for(lambda: _sweeps(worker) >= seen + 3, timeout=60, interval=0.5, what="later sweeps")

    _accounted_once(job)
    log = worker.read_text(errors="replace")
    assert "accounting sweep: queued 1 job(s)" in log
    assert "Traceback" not in log, log[-3000:]
