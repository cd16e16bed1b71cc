"""Unit tests of the SuperLink boundary (``federation/superlink.py``) against a fake ``flwr`` CLI.

The fake is a small Python script that records its arguments, environment and the run-config file it
was given, then prints canned output. The real CLI is exercised in tests/federation/test_integration.py.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from federation import superlink

FAKE_FLWR = """#!{python}
import json, os, shutil, sys, time
from pathlib import Path

out = Path({out!r})
args = sys.argv[1:]
(out / "argv.json").write_text(json.dumps(args))
(out / "env.json").write_text(json.dumps({{"FLWR_HOME": os.environ.get("FLWR_HOME"),
    "FLWR_TELEMETRY_ENABLED": os.environ.get("FLWR_TELEMETRY_ENABLED")}}))
if "-c" in args:
    shutil.copy(args[args.index("-c") + 1], out / "run-config.toml")
time.sleep({sleep})
sys.stdout.write({stdout!r})
sys.stderr.write({stderr!r})
sys.exit({exit_code})
"""


class FakeFlwr:
    """The fake CLI's script and what it recorded."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.dir = tmp_path
        self.script = tmp_path / "flwr"
        monkeypatch.setattr(superlink, "_flwr", lambda: str(self.script))
        self.answer({"success": True})

    def answer(self, stdout, *, stderr: str = "", exit_code: int = 0, sleep: float = 0) -> None:
        text = stdout if isinstance(stdout, str) else json.dumps(stdout)
        self.script.write_text(
            FAKE_FLWR.format(
                python=sys.executable,
                out=str(self.dir),
                stdout=text,
                stderr=stderr,
                exit_code=exit_code,
                sleep=sleep,
            )
        )
        self.script.chmod(0o755)

    @property
    def argv(self) -> list[str]:
        return json.loads((self.dir / "argv.json").read_text())

    @property
    def env(self) -> dict:
        return json.loads((self.dir / "env.json").read_text())

    @property
    def run_config(self) -> dict:
        with (self.dir / "run-config.toml").open("rb") as fh:
            return tomllib.load(fh)


@pytest.fixture
def flwr(tmp_path, monkeypatch) -> FakeFlwr:
    return FakeFlwr(tmp_path, monkeypatch)


@pytest.fixture
def conn(tmp_path) -> superlink.Connection:
    return superlink.Connection(
        flwr_home=tmp_path / "flwr-home", federation="local-frp", app_dir=tmp_path / "app"
    )


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_call_success_false_with_exit_0_raises_with_message(flwr, conn):
    flwr.answer({"success": False, "error-message": "boom"}, exit_code=0)

    with pytest.raises(superlink.SuperLinkError, match="boom"):
        superlink.run_submit(conn, {"job-id": 1})


def test_call_non_json_output_raises(flwr, conn):
    flwr.answer("Traceback (most recent call last):\n  oops\n", exit_code=0)

    with pytest.raises(superlink.SuperLinkError, match="no JSON") as err:
        superlink.run_status(conn, "7")
    assert "oops" in str(err.value)


def test_call_no_output_failure_reports_stderr(flwr, conn):
    flwr.answer("", stderr="connection refused: 127.0.0.1:9093", exit_code=1)

    with pytest.raises(superlink.SuperLinkError, match="connection refused"):
        superlink.run_stop(conn, "7")


def test_call_timeout_raises(flwr, conn, monkeypatch):
    monkeypatch.setattr(superlink, "CLI_TIMEOUT_SECONDS", 0.5)
    flwr.answer({"success": True}, sleep=10)

    with pytest.raises(superlink.SuperLinkError, match="timed out"):
        superlink.run_stop(conn, "7")


def test_call_passes_flwr_home_and_disables_telemetry(flwr, conn):
    flwr.answer({"success": True})

    superlink.run_stop(conn, "7")

    assert flwr.env == {"FLWR_HOME": str(conn.flwr_home), "FLWR_TELEMETRY_ENABLED": "0"}


# ---------------------------------------------------------------------------------------------
# run_submit
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", [42, 18446744073709551615, "9001"])
def test_run_submit_returns_run_id_as_string(flwr, conn, run_id):
    flwr.answer({"success": True, "run-id": run_id})

    result = superlink.run_submit(conn, {"job-id": 1})

    assert result == str(run_id)


def test_run_submit_without_run_id_raises(flwr, conn):
    flwr.answer({"success": True})

    with pytest.raises(superlink.SuperLinkError, match="no run id"):
        superlink.run_submit(conn, {"job-id": 1})


def test_run_submit_calls_flwr_run_with_app_federation_and_config(flwr, conn):
    flwr.answer({"success": True, "run-id": 1})

    superlink.run_submit(conn, {"job-id": 1})

    argv = flwr.argv
    assert argv[:3] == ["run", str(conn.app_dir), "local-frp"]
    assert argv[3] == "-c" and argv[4].endswith(".toml")
    assert argv[5:] == ["--format", "json"]
    assert not os.path.exists(argv[4])  # the temporary config file is removed afterwards


def test_run_submit_config_file_removed_when_refused(flwr, conn):
    flwr.answer({"success": False, "error-message": "no such federation"})

    with pytest.raises(superlink.SuperLinkError):
        superlink.run_submit(conn, {"job-id": 1})

    assert not os.path.exists(flwr.argv[4])


def test_run_submit_run_config_survives_toml_round_trip(flwr, conn):
    spec = json.dumps({"sites": {"a": {"store_key": 'a/"x"\\v1'}}, "target": "y"})
    config = {
        "job-id": 17,
        "job-spec": spec,
        "callback-url": "http://127.0.0.1:8000/jobs/callback/17/",
        "quoted": 'he said "hi"',
        "backslashes": "C:\\data\\new\\table.csv",
        "multiline": "first line\nsecond line\ttab",
        "unicode": "Universitätsklinikum — ✓",
        "empty": "",
        "num-rounds": 5,
        "negative": -3,
        "learning-rate": 0.1,
        "tiny": 1e-07,
        "round-timeout": 120.0,
        "flag-on": True,
        "flag-off": False,
    }
    flwr.answer({"success": True, "run-id": 1})

    superlink.run_submit(conn, config)

    received = flwr.run_config
    assert received == config
    assert json.loads(received["job-spec"])["sites"]["a"]["store_key"] == 'a/"x"\\v1'
    assert isinstance(received["num-rounds"], int) and isinstance(received["round-timeout"], float)
    assert isinstance(received["flag-on"], bool)


# ---------------------------------------------------------------------------------------------
# run_status and run_stop
# ---------------------------------------------------------------------------------------------


def _ls(status: str, **extra) -> dict:
    return {"success": True, "runs": [{"run-id": 7, "status": status, **extra}]}


def test_run_status_finished_completed_parsed(flwr, conn):
    flwr.answer(_ls("finished:completed", **{"status-details": "all rounds done"}))

    run = superlink.run_status(conn, "7")

    assert (run.run_id, run.status, run.sub_status) == ("7", "finished", "completed")
    assert run.details == "all rounds done"
    assert run.is_finished
    assert flwr.argv == ["ls", "local-frp", "--run-id", "7", "--format", "json"]


@pytest.mark.parametrize(
    ("reported", "status", "sub_status"),
    [
        ("finished:failed", "finished", "failed"),
        ("finished:stopped", "finished", "stopped"),
        ("running", "running", ""),
        ("pending", "pending", ""),
    ],
)
def test_run_status_parses_status_and_sub_status(flwr, conn, reported, status, sub_status):
    flwr.answer(_ls(reported))

    run = superlink.run_status(conn, "7")

    assert (run.status, run.sub_status) == (status, sub_status)
    assert run.is_finished is (status == "finished")


def test_run_status_unknown_run_raises(flwr, conn):
    flwr.answer({"success": True, "runs": []})

    with pytest.raises(superlink.SuperLinkError, match="does not know run 7"):
        superlink.run_status(conn, "7")


def test_run_stop_calls_flwr_stop(flwr, conn):
    flwr.answer({"success": True})

    superlink.run_stop(conn, "18446744073709551615")

    assert flwr.argv == ["stop", "18446744073709551615", "local-frp", "--format", "json"]


def test_run_status_usage_reads_flowers_per_run_figures(flwr, conn):
    # The JSON flwr 1.42 `ls --run-id` prints (flwr/cli/ls.py `_to_json`).
    flwr.answer(
        _ls(
            "finished:completed",
            elapsed=20.5,
            **{
                "network-traffic": {
                    "inbound-bytes": 4096,
                    "outbound-bytes": 8192,
                    "total-bytes": 12288,
                },
                "compute-time": {
                    "serverapp-seconds": 19.0,
                    "clientapp-seconds": 1.25,
                    "total-seconds": 20.25,
                },
            },
        )
    )

    run = superlink.run_status(conn, "7")

    assert run.usage == {
        "elapsed_seconds": 20.5,
        "bytes_inbound": 4096,
        "bytes_outbound": 8192,
        "serverapp_seconds": 19.0,
        "clientapp_seconds": 1.25,
    }


def test_run_status_usage_empty_when_not_reported(flwr, conn):
    flwr.answer(_ls("running"))

    assert superlink.run_status(conn, "7").usage == {}
