"""Process handling shared by the IdP fixtures: free ports, readiness polling, clean shutdown."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

IDP_DIR = Path(__file__).resolve().parent

_live: set[subprocess.Popen] = set()


class IdPStartError(RuntimeError):
    """An identity provider did not come up; the message ends with the tail of its log."""


def free_port(host: str) -> int:
    """A TCP port that is free on ``host`` right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# Runs "$@" in the background and watches its own stdin, a pipe only this Python process writes
# to: EOF means pytest has gone (even by SIGKILL), and the whole process group is terminated, so no
# IdP outlives the test run. When the server exits by itself, the group is cleaned up the same way
# and the shell exits with the server's status (so Popen.poll() notices a crash).
_WATCHDOG = """
exec 3<&0
"$@" 3<&- </dev/null & server=$!
{ cat <&3 >/dev/null; kill -TERM 0; } &
exec 3<&-
wait "$server"; status=$?
trap 'exit $status' TERM
kill -TERM 0
"""


def spawn(cmd: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session/process group with stdout+stderr appended to ``log_path``.

    The process group ends when ``terminate()`` is called or when this Python process exits.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", _WATCHDOG, "idp-watchdog", *cmd],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=IDP_DIR,
            start_new_session=True,
        )
    _live.add(proc)
    return proc


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until no process of group ``pgid`` is left (the server, not just its shell)."""
    deadline = time.monotonic() + timeout
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def terminate(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not gone within ``timeout`` seconds.

    Returns once every process of the group has exited, so the server's port is closed: the
    watchdog shell can exit a moment before the server it started.
    """
    _live.discard(proc)
    if proc.stdin and not proc.stdin.closed:
        proc.stdin.close()  # the watchdog then stops the group by itself; make sure below
    pgid = proc.pid  # start_new_session: the shell leads its own group
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    if not _wait_group_gone(pgid, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        _wait_group_gone(pgid, timeout)


def wait_until_ready(
    url: str, *, proc: subprocess.Popen, log_path: Path, timeout: float, what: str
) -> None:
    """Poll ``url`` until it answers 200; fail early with the log if the process exits."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    deadline = time.monotonic() + timeout
    last_error: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise IdPStartError(
                f"{what} exited with code {proc.returncode} before it was ready "
                f"({url}).\n--- {log_path} ---\n{log_tail(log_path)}"
            )
        try:
            with opener.open(url, timeout=2) as resp:
                if resp.status == 200:
                    return
                last_error = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last_error = exc
        time.sleep(0.05)
    terminate(proc)
    raise IdPStartError(
        f"{what} not ready at {url} after {timeout:.0f} s (last error: {last_error}).\n"
        f"--- {log_path} ---\n{log_tail(log_path)}"
    )


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


@atexit.register
def _stop_leftovers() -> None:  # a crashed test run must not leave servers behind
    for proc in list(_live):
        terminate(proc, timeout=2)
