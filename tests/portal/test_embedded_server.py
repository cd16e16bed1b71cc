"""The embedded default's web server (``manage.py serve``, started by ``run.sh``), issue 9.

A hostile re-test sent an anonymous 1.5 GB POST to ``/accounts/login/`` of the embedded default,
then served by Django's development server: the web process grew from 0.86 to 2.0 GB and held
it (the development server reads a request's unread body into memory when it ends). Here the
real server is started as ``run.sh`` starts it, on a socket the OS picked and this test holds,
and a request declaring 1.5 GB gets 413 before its body is read; 64 MB of body sent after it
does not grow the server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.processes import stop

ROOT = Path(__file__).resolve().parents[2]
DECLARED = 1_500_000_000


def _rss_kib(pid: int) -> int:
    """Resident memory (KiB) of ``pid`` and its children (gunicorn's master and worker)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _request(port: int, head: str, *, timeout: float = 60.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(head.encode("latin-1"))
        return _read_response(conn)


def _read_response(conn: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    var = tmp_path_factory.mktemp("var")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(64)
    port = held.getsockname()[1]
    env = {
        **os.environ,
        "FRP_VAR_DIR": str(var),
        "DATABASE_URL": f"sqlite:///{var / 'portal.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "FRP_HEADER_TIMEOUT": "3",
    }
    proc = subprocess.Popen(  # noqa: S603 (the portal's own command)
        [sys.executable, "manage.py", "serve", "--bind", f"fd://{held.fileno()}"],
        cwd=ROOT,
        env=env,
        pass_fds=[held.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # The socket is held here, so a request waits in its backlog until the server accepts.
        yield proc, port
    finally:
        stop(proc)
        held.close()


def test_static_files_are_served_without_a_proxy(server):
    _, port = server
    reply = _request(
        port,
        "GET /static/vendor/bootstrap-5.3.9.bundle.min.js HTTP/1.1\r\nHost: localhost\r\n"
        "Connection: close\r\n\r\n",
    )
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert b"bootstrap" in reply.lower()


def test_a_body_declared_larger_than_the_limit_is_refused_unread(server):
    proc, port = server
    # Warm the worker up (its first request imports the portal) before measuring its memory.
    _request(
        port,
        "GET /static/portal/portal.css HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    before = _rss_kib(proc.pid)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(
            (
                "POST /accounts/login/ HTTP/1.1\r\nHost: localhost\r\n"
                "Content-Type: multipart/form-data; boundary=x\r\n"
                f"Content-Length: {DECLARED}\r\n\r\n"
            ).encode("latin-1")
        )
        conn.settimeout(60)
        reply = conn.recv(65536)  # answered before any of the body is sent
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
        assert b"FRP_MAX_UPLOAD_BYTES" in reply + _drain(conn)
        sent = 0
        block = b"x" * (1 << 20)
        try:
            while sent < 64 << 20:
                conn.sendall(block)
                sent += len(block)
        except OSError:
            pass  # the server closed the connection: nothing more is read
    grown_mib = (_rss_kib(proc.pid) - before) / 1024
    assert grown_mib < 48, f"the server grew by {grown_mib:.0f} MiB after {sent >> 20} MiB sent"
    # …and it still answers.
    reply = _request(
        port,
        "GET /static/portal/portal.css HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_slow_clients_cannot_hold_the_servers_threads(server):
    """Slowloris (hostile re-test A1): twice as many connections as the server has threads, each
    sending a request whose headers never end, a byte at a time. Each is closed once its headers
    are late (``FRP_HEADER_TIMEOUT``, 3 s here), and a normal request is answered meanwhile;
    gunicorn's own gthread worker held every thread for as long as the bytes kept coming."""
    _, port = server
    slow = []
    for _ in range(16):
        conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        conn.sendall(b"GET /static/portal/portal.css HTTP/1.1\r\nHost: localhost\r\n")
        slow.append(conn)
    done = threading.Event()
    closed: set[int] = set()

    def trickle():  # the attack's pace: one more byte of a header line that never ends
        while not done.is_set():
            for i, conn in enumerate(slow):
                if i not in closed:
                    try:
                        conn.sendall(b"X")
                    except OSError:
                        closed.add(i)
            done.wait(0.5)

    attacker = threading.Thread(target=trickle, daemon=True)
    attacker.start()
    try:
        reply = _request(
            port,
            "GET /static/portal/portal.css HTTP/1.1\r\nHost: localhost\r\n"
            "Connection: close\r\n\r\n",
            timeout=90,
        )
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        for conn in slow:  # the server ended every slow request (closed, or an error status)
            conn.settimeout(90)
            try:
                data = _read_response(conn)
            except ConnectionResetError:
                data = b""
            assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:200]
    finally:
        done.set()
        attacker.join(timeout=10)
        for conn in slow:
            conn.close()


def _drain(conn: socket.socket) -> bytes:
    try:
        conn.settimeout(5)
        return conn.recv(65536)
    except OSError:
        return b""


def test_the_server_is_installed_by_the_readmes_first_command():
    # run.sh installs the project without its test extra: gunicorn, which `manage.py serve`
    # runs, must be a dependency of the project itself (a new user's run.sh failed without it).
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("gunicorn") for d in project["dependencies"])
    assert "pip install -e .;" in (ROOT / "run.sh").read_text()  # no extra
