"""Boundary to the Flower SuperLink's control API, through the pinned ``flwr`` CLI (flwr 1.42.0).

Contract:

- ``run_submit(run_config)`` builds the Flower App in ``FRP_FLWR_APP_DIR`` and starts one run on the
  federation named in ``$FLWR_HOME/config.toml``; returns the run id (uint64) as a string.
- ``run_status(run_id)`` / ``runs_status([run_id, …])`` return ``RunStatus`` values (``status`` is ``pending|starting|running|finished``,
  ``sub_status`` is ``completed|failed|stopped`` once finished, plus details and usage figures).
  ``RunStatus.usage`` is what flwr 1.42 reports per run (``flwr ls --format json``: ``elapsed``,
  ``network-traffic.{inbound,outbound}-bytes``, ``compute-time.{serverapp,clientapp}-seconds``):
  whole-run totals over all SuperNodes. Flower exposes no per-node (per-site) compute time or
  traffic, so the portal's per-site usage comes from the ClientApp's own metering and these totals
  serve only as a run-level cross-check.
- ``run_stop(run_id)`` asks the SuperLink to stop a run.
- ``node_register(public_key, name=…)`` / ``node_unregister(node_id)`` / ``nodes_list()``: SuperNode
  authentication (``flwr supernode register|unregister|ls``; the SuperLink runs with
  ``--enable-supernode-auth``), node ids as strings, states as ``NodeState``.

Every call uses ``--format json`` and checks ``success`` (the CLI exits 0 even on error). Failures
raise ``SuperLinkError`` with the CLI's message. Nothing outside this module sees the CLI or its JSON.
"""

from __future__ import annotations

import json
import numbers
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLI_TIMEOUT_SECONDS = 120


class SuperLinkError(Exception):
    """The SuperLink refused a request or could not be reached."""


@dataclass(frozen=True)
class RunStatus:
    """A run as the SuperLink reports it. Times in seconds, traffic in bytes (when reported)."""

    run_id: str
    status: str
    sub_status: str
    details: str
    raw: dict

    @property
    def is_finished(self) -> bool:
        return self.status == "finished"

    @property
    def usage(self) -> dict[str, float | int]:
        """Flower's per-run figures: ``elapsed_seconds``, ``bytes_inbound``/``bytes_outbound``
        (SuperLink ↔ SuperNodes traffic, bytes), ``serverapp_seconds``/``clientapp_seconds``
        (compute time, s). Keys the CLI did not report are left out (``{}`` when none)."""
        traffic = self.raw.get("network-traffic") or {}
        compute = self.raw.get("compute-time") or {}
        fields = {
            "elapsed_seconds": (self.raw.get("elapsed"), float),
            "bytes_inbound": (traffic.get("inbound-bytes"), int),
            "bytes_outbound": (traffic.get("outbound-bytes"), int),
            "serverapp_seconds": (compute.get("serverapp-seconds"), float),
            "clientapp_seconds": (compute.get("clientapp-seconds"), float),
        }
        out: dict[str, float | int] = {}
        for key, (value, kind) in fields.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = kind(value)
        return out


@dataclass(frozen=True)
class Connection:
    """Where the CLI finds the SuperLink: its ``FLWR_HOME`` and the federation (connection) name."""

    flwr_home: Path
    federation: str
    app_dir: Path


def _flwr() -> str:
    candidate = Path(sys.executable).with_name("flwr")
    return str(candidate) if candidate.exists() else "flwr"


def _call(conn: Connection, args: list[str]) -> dict:
    env = dict(os.environ, FLWR_HOME=str(conn.flwr_home), FLWR_TELEMETRY_ENABLED="0")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    try:
        proc = subprocess.run(
            [_flwr(), *args, "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SuperLinkError(f"flwr {args[0]} timed out after {CLI_TIMEOUT_SECONDS} s") from exc
    try:
        payload = json.loads(proc.stdout.strip() or "{}")
    except json.JSONDecodeError as exc:
        raise SuperLinkError(
            f"flwr {args[0]} printed no JSON (exit {proc.returncode}): "
            f"{(proc.stdout + proc.stderr)[-500:]}"
        ) from exc
    if not payload.get("success"):
        message = payload.get("error-message") or proc.stderr[-500:] or "unknown error"
        raise SuperLinkError(f"flwr {args[0]} failed: {message}")
    return payload


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def run_submit(conn: Connection, run_config: dict[str, str | int | float | bool]) -> str:
    """Start one run of the Flower App with ``run_config`` overrides; return the run id (str)."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write("".join(f"{k} = {_toml_value(v)}\n" for k, v in run_config.items()))
        config_path = fh.name
    try:
        payload = _call(conn, ["run", str(conn.app_dir), conn.federation, "-c", config_path])
    finally:
        os.unlink(config_path)
    run_id = payload.get("run-id")
    if run_id is None:
        raise SuperLinkError(f"flwr run returned no run id: {payload}")
    return str(run_id)


def _run_status(run: dict, run_id: str) -> RunStatus:
    status, _, sub_status = str(run.get("status", "")).partition(":")
    return RunStatus(
        run_id=str(run_id),
        status=status,
        sub_status=sub_status,
        details=str(run.get("status-details", "") or ""),
        raw=run,
    )


def run_status(conn: Connection, run_id: str) -> RunStatus:
    """Read one run's status. Raises ``SuperLinkError`` when the SuperLink does not know it."""
    payload = _call(conn, ["ls", conn.federation, "--run-id", str(run_id)])
    runs = payload.get("runs") or []
    if not runs:
        raise SuperLinkError(f"the SuperLink does not know run {run_id}")
    return _run_status(runs[0], run_id)


def runs_status(conn: Connection, run_ids: list[str]) -> dict[str, RunStatus]:
    """Status of several runs with one CLI call (each ``flwr`` call is a process start, ~1.5 s).

    Returns run id → ``RunStatus`` for the runs the SuperLink lists; runs it does not list are left
    out (ask ``run_status`` for those). Raises ``SuperLinkError`` when the SuperLink fails.
    """
    if len(run_ids) == 1:
        return {run_ids[0]: run_status(conn, run_ids[0])}
    payload = _call(conn, ["ls", conn.federation])
    listed = {str(r.get("run-id")): r for r in payload.get("runs") or []}
    return {rid: _run_status(listed[rid], rid) for rid in run_ids if rid in listed}


def run_stop(conn: Connection, run_id: str) -> None:
    """Ask the SuperLink to stop a run (idempotent on the portal side)."""
    _call(conn, ["stop", str(run_id), conn.federation])


@dataclass(frozen=True)
class NodeState:
    """A SuperNode as the SuperLink lists it (``flwr supernode ls``).

    ``status``: ``registered`` (key known, never connected), ``online``, ``offline`` or
    ``unregistered``. Times are the CLI's UTC strings (``YYYY-MM-DD HH:MM:SSZ``) or ``""``.
    """

    node_id: str
    status: str
    registered_at: str
    online_at: str
    offline_at: str
    unregistered_at: str

    @property
    def last_seen(self) -> str:
        """When the node was last known connected: now if online, else when it went offline."""
        return self.online_at if self.status == "online" else self.offline_at


def _time(value) -> str:
    return "" if value in (None, "", "N/A") else str(value)


def node_register(conn: Connection, public_key: str, *, name: str) -> str:
    """Register a SuperNode's public key (OpenSSH line) under ``name``; return its node id.

    Raises ``SuperLinkError`` when the SuperLink refuses (key already registered, auth off, …).
    """
    with tempfile.NamedTemporaryFile("w", suffix=".pub", delete=False) as fh:
        fh.write(public_key.strip() + "\n")
        key_path = fh.name
    try:
        payload = _call(conn, ["supernode", "register", key_path, conn.federation, "--name", name])
    finally:
        os.unlink(key_path)
    node_id = payload.get("node-id")
    if node_id is None:
        raise SuperLinkError(f"flwr supernode register returned no node id: {payload}")
    return str(node_id)


def node_unregister(conn: Connection, node_id: str) -> None:
    """Unregister SuperNode ``node_id``: the SuperLink refuses it from then on."""
    _call(conn, ["supernode", "unregister", str(int(node_id)), conn.federation])


def nodes_list(conn: Connection) -> dict[str, NodeState]:
    """Every SuperNode the SuperLink knows (unregistered ones included), by node id."""
    payload = _call(conn, ["supernode", "ls", conn.federation, "--verbose"])
    out: dict[str, NodeState] = {}
    for node in payload.get("nodes") or []:
        node_id = str(node.get("node-id"))
        out[node_id] = NodeState(
            node_id=node_id,
            status=str(node.get("status", "")),
            registered_at=_time(node.get("created-at")),
            online_at=_time(node.get("online-at")),
            offline_at=_time(node.get("offline-at")),
            unregistered_at=_time(node.get("deleted-at")),
        )
    return out
