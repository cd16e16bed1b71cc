"""The SuperLink boundary (``federation/superlink.py``) against a real SuperLink (flwr 1.42.0).

One SuperLink and one SuperNode per module, on free ports. Runs started here are stopped at once
(their ServerApp would wait for sites that are not there).
"""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings

from federation import runtime, superlink
from tests.federation.conftest import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def link(tmp_path_factory):
    """A running SuperLink with one SuperNode, and a ``Connection`` to it."""
    root = tmp_path_factory.mktemp("superlink")
    state = runtime.start(
        root / "federation",
        [runtime.LocalSite(site="hospital-a", store_url=f"file://{root}/a", keyring=str(root))],
    )
    runtime.write_state_control_config(root / "control", "local", state)
    conn = superlink.Connection(
        flwr_home=root / "control", federation="local", app_dir=settings.FRP_FLWR_APP_DIR
    )
    yield conn, state
    runtime.stop(state)


def _start(conn, **config) -> str:
    run_id = superlink.run_submit(conn, {"job-id": 1, "discovery-timeout": 1.0, **config})
    superlink.run_stop(conn, run_id)
    return run_id


def test_run_submit_returns_a_uint64_run_id_and_the_config_arrives_typed(link):
    conn, _ = link
    spec = json.dumps({"sites": {"a": {"store_key": 'a/"x"\\v1'}}, "target": "y"})
    config = {
        "job-id": 17,
        "job-spec": spec,
        "callback-url": "http://127.0.0.1:8000/jobs/callback/17/",
        "reply-log": "C:\\data\\new\\table.csv — Universitätsklinikum ✓\nsecond line\ttab",
        "launch-nonce": "",
        "num-rounds": 5,
        "learning-rate": 1e-07,
        "round-timeout": 120.0,
        "contribution": False,
    }

    run_id = superlink.run_submit(conn, config)
    superlink.run_stop(conn, run_id)

    assert run_id.isdigit() and 0 < int(run_id) < 2**64
    stored = superlink.run_status(conn, run_id).run_config
    assert stored == config
    assert json.loads(stored["job-spec"])["sites"]["a"]["store_key"] == 'a/"x"\\v1'
    assert isinstance(stored["num-rounds"], int) and isinstance(stored["round-timeout"], float)
    assert stored["contribution"] is False


def test_run_stop_finishes_the_run_as_stopped_with_usage_figures(link):
    conn, _ = link

    run_id = _start(conn)

    run = wait_for(
        lambda: (r := superlink.run_status(conn, run_id)).is_finished and r,
        timeout=60,
        what="the stopped run to finish",
    )
    assert (run.run_id, run.status, run.sub_status) == (run_id, "finished", "stopped")
    assert set(run.usage) == {
        "elapsed_seconds",
        "bytes_inbound",
        "bytes_outbound",
        "serverapp_seconds",
        "clientapp_seconds",
    }
    assert all(v >= 0 for v in run.usage.values())


def test_run_status_carries_the_superlinks_own_times_of_the_run(link):
    conn, _ = link
    before = datetime.now(UTC)

    run_id = _start(conn)

    run = wait_for(
        lambda: (r := superlink.run_status(conn, run_id)).is_finished and r,
        timeout=60,
        what="the stopped run to finish",
    )
    pending = datetime.fromisoformat(run.raw["pending-at"])
    finished = datetime.fromisoformat(run.raw["finished-at"])
    assert before - timedelta(seconds=1) <= pending <= finished <= datetime.now(UTC)
    assert {"starting-at", "running-at"} <= set(run.raw)  # "" when the run never got there


def test_runs_list_is_newest_first_within_its_limit_and_runs_status_finds_older_runs(link):
    conn, _ = link
    older, middle, newest = (_start(conn, **{"job-id": n}) for n in (101, 102, 103))

    page = superlink.runs_list(conn, limit=2)

    assert [r.run_id for r in page] == [newest, middle]
    found = superlink.runs_status(conn, [older, newest, "12345"], newest=page)
    assert set(found) == {older, newest}  # the older one by its own request; 12345 is unknown
    assert found[older].run_config["job-id"] == 101


def test_run_status_of_an_unknown_run_raises_run_unknown(link):
    conn, _ = link

    with pytest.raises(superlink.RunUnknown, match="does not know run 12345"):
        superlink.run_status(conn, "12345")
    with pytest.raises(superlink.RunUnknown, match="Run ID not found"):
        superlink.run_stop(conn, "12345")


def test_nodes_list_reports_the_connected_supernode_online(link):
    conn, _ = link

    nodes = wait_for(
        lambda: [n for n in superlink.nodes_list(conn) if n.status == "online"],
        timeout=60,
        what="the SuperNode to be online",
    )

    (node,) = nodes
    assert node.node_id.isdigit()
    assert node.registered_at is not None and node.last_seen is not None
    assert node.registered_at <= node.last_seen
    assert node.heartbeat_seconds > 0


def test_a_closed_port_raises_superlink_unreachable_naming_the_address(tmp_path):
    port = runtime.free_port()
    runtime.write_control_config(tmp_path, "local", f"127.0.0.1:{port}")
    conn = superlink.Connection(flwr_home=tmp_path, federation="local", app_dir=tmp_path)

    with pytest.raises(superlink.SuperLinkUnreachable, match=f"127.0.0.1:{port}"):
        superlink.runs_list(conn)


def test_a_missing_connection_file_or_name_is_a_readable_error(tmp_path):
    conn = superlink.Connection(flwr_home=tmp_path, federation="local", app_dir=tmp_path)
    with pytest.raises(superlink.SuperLinkError, match="no SuperLink connection file"):
        superlink.runs_list(conn)

    runtime.write_control_config(tmp_path, "other", "127.0.0.1:1")
    with pytest.raises(superlink.SuperLinkError, match="names no SuperLink connection 'local'"):
        superlink.runs_list(conn)


def test_a_bad_app_folder_is_a_superlink_error(link, tmp_path):
    conn, _ = link
    bad = superlink.Connection(flwr_home=conn.flwr_home, federation="local", app_dir=tmp_path)

    with pytest.raises(superlink.SuperLinkError, match="cannot build the Flower App"):
        superlink.run_submit(bad, {"job-id": 1})


def test_a_stopped_superlink_is_unreachable(tmp_path):
    state = runtime.start(tmp_path / "federation", [])
    runtime.write_state_control_config(tmp_path / "control", "local", state)
    conn = superlink.Connection(flwr_home=tmp_path / "control", federation="local", app_dir=Path())
    assert superlink.runs_list(conn) == []

    os.killpg(state.superlink_pid, signal.SIGKILL)
    runtime.stop(state)

    with pytest.raises(superlink.SuperLinkUnreachable):
        superlink.runs_list(conn)
