"""Secrets in request paths never reach an access log (hostile re-test of issue 9, finding 8).

A log reader took a password-reset key from ``var/logs/web.log`` (runserver's access log, as
``run.sh`` writes it) and reset another user's password; compose's gunicorn logged the same with
``--access-logfile -``. Here the real servers run in their own processes on a migrated SQLite
file, are sent the secret-bearing URLs, and their real log files are read.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from portal.logredact import redact
from tests.processes import stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
RESET_KEY = "7-diwtic-e18f7467ec4670225d8f4a0186554df0"
CONFIRM_KEY = "MQ:1v5Xkz:Qm9vZ2xlLXNlY3JldC1jb25maXJt"
INVITATION = "Zk3l9qPpVd0x2mT8rY6wA1bC4eF7gH0j"
CODE = "authz-code-5f1c9e2b7a"
SECRETS = (RESET_KEY.split("-", 1)[1], CONFIRM_KEY, INVITATION, CODE)
PATHS = (
    f"/accounts/password/reset/key/{RESET_KEY}/",
    f"/accounts/confirm-email/{CONFIRM_KEY}/",
    f"/invitations/{INVITATION}/",
    f"/accounts/oidc/inst-a/login/callback/?code={CODE}&state=st-{CODE}",
)


def test_redact_keeps_ordinary_paths_and_removes_secrets():
    assert redact('"GET /jobs/12/progress.json?page=2 HTTP/1.1" 200') == (
        '"GET /jobs/12/progress.json?page=2 HTTP/1.1" 200'
    )
    assert redact(f"GET {PATHS[0]} HTTP/1.1") == (
        "GET /accounts/password/reset/key/[redacted]/ HTTP/1.1"
    )
    assert redact(PATHS[3]) == (
        "/accounts/oidc/inst-a/login/callback/?code=[redacted]&state=[redacted]"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sqlite_env(tmp_path_factory):
    """A migrated SQLite database and the environment of the embedded default (DEBUG on)."""
    tmp = tmp_path_factory.mktemp("access-log")
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRP_", "DATABASE_", "CACHE_", "DJANGO_"))
    }
    env = {
        **clean,
        "DATABASE_URL": f"sqlite:///{tmp / 'portal.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "FRP_VAR_DIR": str(tmp / "var"),
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return tmp, env


def _get_each(port: int, process: subprocess.Popen) -> None:
    """Wait until the server answers (bounded), then GET every secret-bearing path once."""
    deadline = time.monotonic() + 300
    while True:
        assert process.poll() is None, "the server exited"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=60)
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):  # not up, or slow (load)
            assert time.monotonic() < deadline, "the server did not answer within 300 s"
            time.sleep(0.2)
    for path in PATHS:
        # A bad key is a 4xx page (or a redirect): the request is logged all the same.
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120)


def _assert_no_secret(log: str) -> None:
    assert "/accounts/password/reset/key/[redacted]/" in log, log[-2000:]  # the line is there
    assert "/invitations/[redacted]/" in log
    leaked = [s for s in SECRETS if s in log]
    assert not leaked, f"secrets in the access log: {leaked}\n{log[-3000:]}"


def test_runserver_access_log_holds_no_reset_key_token_or_code(sqlite_env):
    """The embedded default: ``run.sh`` sends runserver's output to ``var/logs/web.log``."""
    tmp, env = sqlite_env
    port = _free_port()
    log_path = tmp / "web.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _get_each(port, process)
        finally:
            stop(process)

    _assert_no_secret(log_path.read_text())


def test_gunicorn_access_log_holds_no_reset_key_token_or_code(sqlite_env):
    """compose's web service: gunicorn with ``--access-logfile`` and the portal's logger class."""
    tmp, env = sqlite_env
    port = _free_port()
    log_path = tmp / "gunicorn-access.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "portal.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--access-logfile",
            str(log_path),
            "--logger-class",
            "portal.logredact.GunicornLogger",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _get_each(port, process)
    finally:
        stop(process)

    _assert_no_secret(log_path.read_text())


def test_compose_and_the_image_use_the_redacting_gunicorn_logger():
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "--access-logfile - --logger-class portal.logredact.GunicornLogger" in compose
    assert (
        '"--logger-class", "portal.logredact.GunicornLogger"' in (ROOT / "Dockerfile").read_text()
    )
    assert "access_log /var/log/nginx/access.log frp_redacted;" in compose
