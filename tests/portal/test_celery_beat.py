"""The embedded beat of a worker started with ``-B`` dies with its worker (``portal/celery.py``).

A real worker on Redis is killed with SIGKILL, as the OOM killer would; its beat child must end
too, instead of queueing periodic tasks with no worker to run them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.federation.fault_support import alive, children_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def test_embedded_beat_ends_when_its_worker_is_killed(tmp_path):
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="portal.settings",
        FRP_VAR_DIR=str(tmp_path / "var"),
        FRP_RECONCILE_SECONDS="3600",
    )
    worker = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("celery")),
            "-A",
            "portal",
            "worker",
            "-B",
            "--pool",
            "solo",
            "--schedule",
            str(tmp_path / "beat-schedule"),
        ],
        env=env,
        stdout=(tmp_path / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        (beat,) = wait_for(
            lambda: children_of(worker.pid), timeout=120, what="the worker's beat child"
        )
        wait_for(lambda: list(tmp_path.glob("beat-schedule*")), timeout=60, what="beat to start")

        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)

        wait_for(lambda: not alive(beat), timeout=60, what="the beat child to end")
        assert worker.returncode == -signal.SIGKILL and not alive(beat)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)  # the worker's group: beat too, if it lived on
