"""The local federation's processes: the SuperExec task poll interval reaches Flower (issue 12).

``federation.runtime.start`` sets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` for the SuperLink and the
SuperNodes; their SuperExec children (which start one ServerApp or ClientApp process per task)
inherit it. Checked against flwr itself: its own reader of the variable, and the environment of
the real SuperExec processes of a real SuperLink and SuperNode (``/proc/<pid>/environ``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from federation import runtime


def test_flwr_reads_the_superexec_poll_interval_from_the_variable_we_set(monkeypatch):
    from flwr.supercore.superexec import run_superexec

    monkeypatch.setenv(runtime.SUPEREXEC_POLL_ENV, "0.2")
    assert run_superexec._get_task_poll_interval() == pytest.approx(0.2)
    monkeypatch.delenv(runtime.SUPEREXEC_POLL_ENV)
    assert run_superexec._get_task_poll_interval() == pytest.approx(1.0)  # Flower's default


def test_start_refuses_a_poll_interval_flwr_would_refuse(tmp_path):
    with pytest.raises(runtime.RuntimeError_, match="0.01–60"):
        runtime.start(tmp_path, [], superexec_poll=0.001)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _superexec_environ(parent: int, timeout: float = 60.0) -> dict[str, str]:
    """The environment of ``parent``'s ``flower-superexec`` child, once it is running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in _children(parent):
            try:
                cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")
                if any(part.endswith(b"flower-superexec") for part in cmdline):
                    raw = (Path("/proc") / str(child) / "environ").read_bytes()
                    return dict(
                        item.split("=", 1)
                        for item in raw.decode(errors="replace").split("\0")
                        if "=" in item
                    )
            except OSError:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no flower-superexec child of pid {parent} within {timeout:.0f} s")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.parametrize("poll", [0.2, None])
def test_superexec_processes_poll_at_the_interval_given(tmp_path, monkeypatch, poll):
    monkeypatch.delenv(runtime.SUPEREXEC_POLL_ENV, raising=False)
    site = runtime.LocalSite(
        site="hospital-x", store_url=f"file://{tmp_path / 'store'}", keyring=str(tmp_path / "k")
    )
    state = runtime.start(tmp_path / "federation", [site], superexec_poll=poll)
    try:
        for pid in (state.superlink_pid, state.supernodes["hospital-x"]):
            environ = _superexec_environ(pid)
            if poll is None:
                assert runtime.SUPEREXEC_POLL_ENV not in environ
            else:
                assert environ[runtime.SUPEREXEC_POLL_ENV] == "0.2"
    finally:
        runtime.stop(state)
    assert not runtime.is_running(state)


def _wait(condition, bound: float = 60.0) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_stop_ends_a_process_that_escaped_every_process_group(tmp_path):
    """flwr 1.42's SuperLink starts its SuperExec in a session of its own (``start_new_session``),
    so a ServerApp is in no group ``stop`` signals; when its SuperLink and SuperExec are gone it
    lives on, reparented to init (seen after a fault test). Here a stand-in SuperLink started with
    the runtime's environment starts a grandchild the same way and exits, leaving it an orphan:
    ``stop`` must end it, and must leave alone a process of another federation root."""

    def detached_grandchild(root: Path) -> int:
        pidfile = root / "grandchild.pid"
        code = (
            "import subprocess, sys; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))"
        )
        parent = subprocess.Popen(
            [sys.executable, "-c", code],
            env=runtime._env(root / "superlink-home"),
            start_new_session=True,
        )
        parent.wait(timeout=60)
        return int(pidfile.read_text())

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    orphan = detached_grandchild(ours)
    bystander = detached_grandchild(theirs)
    try:
        assert runtime.marked_processes(ours) == [orphan]
        assert os.getpgid(orphan) == orphan  # its own group: killpg of the SuperLink misses it
        state = runtime.FederationState(
            root=str(ours), superlink_address="127.0.0.1:1", superlink_pid=orphan + 10**7
        )
        runtime.stop(state, timeout=10)
        assert _wait(
            lambda: not runtime._alive(orphan) or orphan not in runtime.marked_processes(ours)
        )
        assert runtime.marked_processes(ours) == []
        assert runtime.marked_processes(theirs) == [bystander]
    finally:
        for pid in (orphan, bystander):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("ended", ["stopped", "killed"])
def test_a_federation_started_again_at_once_has_its_supernode_activated(tmp_path, ended):
    """A second ``./run.sh`` right after ``--exit-after-job`` had no site connected (hostile
    re-test F3): the SuperLink was stopped with the SuperNodes, so they could not deactivate,
    and it refused the same SuperNodes started again while their old activation was "online"
    (Flower error 2004, for two heartbeat intervals). ``stop`` ends the SuperNodes first; a
    SuperNode killed outright (no sign-off) is waited out by ``start``."""
    import signal
    from datetime import UTC, datetime
    from functools import partial

    from federation import superlink

    site = runtime.LocalSite(
        site="hospital-x", store_url=f"file://{tmp_path / 'store'}", keyring=str(tmp_path / "k")
    )
    root = tmp_path / "federation"

    def activated_since(state, when) -> bool:
        try:
            nodes = superlink.nodes_list(runtime.control_connection(state))
        except superlink.SuperLinkError:
            return False
        return any(
            n.status == "online" and n.last_activated_at and n.last_activated_at >= when
            for n in nodes
        )

    for attempt in range(2):  # the second start reuses the root: its database, its node keys
        began = datetime.now(UTC).replace(microsecond=0)
        state = runtime.start(root, [site])
        try:
            assert _wait(partial(activated_since, state, began), bound=180), (
                attempt,
                superlink.nodes_list(runtime.control_connection(state)),
            )
            assert runtime._alive(state.supernodes["hospital-x"])
            if ended == "killed" and attempt == 0:
                os.killpg(state.supernodes["hospital-x"], signal.SIGKILL)
        finally:
            runtime.stop(state)
