"""Boundary to the Flower SuperLink's Control API, called from inside this process (flwr 1.42.0).

flwr 1.42 serves the Control API as protobuf over HTTP; this module uses flwr's own client for it
(``flwr.supercore.control.ControlHttpClient``, the one the ``flwr`` CLI uses), so a status check
costs one HTTP request (tens of milliseconds) instead of a ``flwr`` process start (~1.5 s and as
many CPU-seconds). ``benchmarks/reconcile.py`` prints the two against each other.

Contract:

- ``Connection`` names ``$FLWR_HOME/config.toml`` (``[superlink.NAME] address=…, insecure=…,
  root-certificates=…``, the file the CLI reads) and the Flower App folder.
- ``run_submit(conn, run_config)`` builds the Flower App (FAB) and starts one run; returns the run id
  (uint64) as a string.
- ``run_status(conn, run_id)`` / ``runs_status(conn, [run_id, …])`` / ``runs_list(conn)`` return
  ``RunStatus`` values (``status`` is ``pending|starting|running|finished``, ``sub_status`` is
  ``completed|failed|stopped`` once finished, details, usage figures and the run's config).
  ``RunStatus.usage`` is what flwr 1.42 reports per run (the fields of ``flwr ls --format json``:
  ``elapsed``, ``network-traffic.{inbound,outbound}-bytes``,
  ``compute-time.{serverapp,clientapp}-seconds``): whole-run totals over all SuperNodes. Flower
  exposes no per-node (per-site) compute time or traffic, so the portal's per-site usage comes from
  the ClientApp's own metering and these totals serve only as a run-level cross-check.
- ``run_stop(conn, run_id)`` asks the SuperLink to stop a run.
- ``nodes_list(conn)`` returns every SuperNode the SuperLink knows (``NodeState``: id, status
  ``registered|online|offline|unregistered``, when it registered, was last seen, …).
- ``node_register(conn, public_key, name=…)`` / ``node_unregister(conn, node_id)``: SuperNode
  authentication (what ``flwr supernode register|unregister`` send; the SuperLink runs with
  ``--enable-supernode-auth``), node ids as strings.

Failures raise ``SuperLinkError`` with a readable message; a SuperLink that cannot be reached at
all (connection refused, timeout) raises its subclass ``SuperLinkUnreachable``. Nothing outside this
module sees flwr's protobuf or HTTP types.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

REQUEST_TIMEOUT_SECONDS = 20.0
SUBMIT_TIMEOUT_SECONDS = 120.0


class SuperLinkError(Exception):
    """The SuperLink refused a request or could not be reached."""


class SuperLinkUnreachable(SuperLinkError):
    """Nothing answered at the SuperLink's address (refused, reset or timed out)."""


class RunUnknown(SuperLinkError):
    """The SuperLink answered that it does not know the run (HTTP 404)."""


@dataclass(frozen=True)
class RunStatus:
    """A run as the SuperLink reports it. Times in seconds, traffic in bytes (when reported).

    ``raw`` holds the fields of ``flwr ls --format json`` for this run (among them the
    SuperLink's own times ``pending-at``, ``starting-at``, ``running-at``, ``finished-at``: ISO
    8601 with offset, ``""`` until the run gets there); ``run_config`` the run's config overrides
    as the SuperLink stored them (``{}`` when not read).
    """

    run_id: str
    status: str
    sub_status: str
    details: str
    raw: dict
    run_config: dict = field(default_factory=dict)

    @property
    def is_finished(self) -> bool:
        return self.status == "finished"

    @property
    def usage(self) -> dict[str, float | int]:
        """Flower's per-run figures: ``elapsed_seconds``, ``bytes_inbound``/``bytes_outbound``
        (SuperLink ↔ SuperNodes traffic, bytes), ``serverapp_seconds``/``clientapp_seconds``
        (compute time, s). Keys the SuperLink did not report are left out (``{}`` when none)."""
        traffic = self.raw.get("network-traffic") or {}
        compute = self.raw.get("compute-time") or {}
        fields_ = {
            "elapsed_seconds": (self.raw.get("elapsed"), float),
            "bytes_inbound": (traffic.get("inbound-bytes"), int),
            "bytes_outbound": (traffic.get("outbound-bytes"), int),
            "serverapp_seconds": (compute.get("serverapp-seconds"), float),
            "clientapp_seconds": (compute.get("clientapp-seconds"), float),
        }
        out: dict[str, float | int] = {}
        for key, (value, kind) in fields_.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = kind(value)
        return out


@dataclass(frozen=True)
class NodeState:
    """A SuperNode as the SuperLink reports it (``flwr supernode ls``).

    ``node_id``: uint64 as text. ``status``: ``registered`` (known, never connected),
    ``online``, ``offline`` (its heartbeat lapsed) or ``unregistered``. Times are aware UTC
    datetimes or ``None``; ``online_until``: when the SuperLink stops counting it online unless it
    sends a heartbeat; ``heartbeat_seconds``: its heartbeat interval. ``name``: the name it was
    registered under (node authentication), ``""`` otherwise.
    """

    node_id: str
    status: str
    registered_at: datetime | None
    last_activated_at: datetime | None
    last_deactivated_at: datetime | None
    unregistered_at: datetime | None
    online_until: datetime | None
    heartbeat_seconds: float
    name: str = ""

    @property
    def last_seen(self) -> datetime | None:
        """When it last showed signs of life: its last heartbeat (``online_until`` − interval)
        while online, else when it went offline (``None`` when it never connected)."""
        if self.status == "online" and self.online_until:
            return self.online_until - timedelta(seconds=self.heartbeat_seconds)
        return self.last_deactivated_at or self.last_activated_at


@dataclass(frozen=True)
class Connection:
    """Where the portal finds the SuperLink: the ``FLWR_HOME`` holding ``config.toml``, the
    connection's name there, and the Flower App folder."""

    flwr_home: Path
    federation: str
    app_dir: Path


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


def _connection_config(conn: Connection) -> dict:
    path = Path(conn.flwr_home) / "config.toml"
    try:
        with path.open("rb") as fh:
            config = tomllib.load(fh)
    except FileNotFoundError:
        raise SuperLinkError(
            f"no SuperLink connection file {path} (start the federation first)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise SuperLinkError(f"{path} is not valid TOML: {exc}") from None
    entry = (config.get("superlink") or {}).get(conn.federation)
    if not isinstance(entry, dict) or not entry.get("address"):
        raise SuperLinkError(f"{path} names no SuperLink connection {conn.federation!r}")
    return entry


class _VersionHeaders:
    """Tells the SuperLink which flwr this client runs (what flwr's own clients send)."""

    def __init__(self) -> None:
        from flwr.supercore.constant import FLWR_CLIENT_METADATA_KEY
        from flwr.supercore.runtime_version_compatibility import RuntimeVersionMetadata

        self.headers = {
            **dict(RuntimeVersionMetadata.from_local_component("frp portal").as_metadata()),
            FLWR_CLIENT_METADATA_KEY: "cli",
        }

    def intercept(self, context, call_next):
        for key, value in self.headers.items():
            context.request.headers[key] = value
        return call_next(context)


def _client(conn: Connection, timeout: float):
    from flwr.supercore.control import ControlHttpClient

    entry = _connection_config(conn)
    insecure = bool(entry.get("insecure", False))
    root = entry.get("root-certificates")
    if root and not Path(root).is_absolute():
        root = str(Path(conn.flwr_home) / root)
    client = ControlHttpClient.from_server_address(
        server_address=str(entry["address"]),
        insecure=insecure,
        root_certificates=None if insecure else root,
        interceptors=[_VersionHeaders()],
    )
    client._client.timeout = httpx.Timeout(timeout)
    return client, str(entry["address"])


def _call(conn: Connection, method: str, request, *, timeout: float = REQUEST_TIMEOUT_SECONDS):
    """One Control API call; flwr's and httpx's errors become ``SuperLinkError``."""
    try:
        client, address = _client(conn, timeout)
    except ValueError as exc:  # e.g. insecure together with root certificates
        raise SuperLinkError(f"bad SuperLink connection: {exc}") from None
    try:
        return getattr(client, method)(request)
    except (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError) as exc:
        raise SuperLinkUnreachable(
            f"the SuperLink at {address} did not answer ({type(exc).__name__}: {exc})"
        ) from None
    except httpx.HTTPStatusError as exc:
        code = exc.response.status_code
        kind = RunUnknown if code == 404 else SuperLinkError
        raise kind(
            f"the SuperLink refused {method} (HTTP {code}): {_error_text(exc.response)}"
        ) from None
    except httpx.HTTPError as exc:
        raise SuperLinkError(f"{method} failed: {type(exc).__name__}: {exc}") from None
    finally:
        client.close()


def _error_text(response: httpx.Response) -> str:
    """The SuperLink's reason: the ``detail`` of its JSON error body, else the body's start."""
    text = (response.text or "").strip()
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail or text[:500] or response.reason_phrase)


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def _run_statuses(response) -> list[RunStatus]:
    """``RunStatus`` per run of a ``ListRunsResponse``, newest first, with the fields ``flwr ls``
    prints."""
    from flwr.common.serde import run_from_proto

    out = []
    now = datetime.fromisoformat(response.now) if response.now else datetime.now(UTC)
    for proto in response.run_dict.values():
        run = run_from_proto(proto)
        running = datetime.fromisoformat(run.running_at) if run.running_at else None
        finished = datetime.fromisoformat(run.finished_at) if run.finished_at else None
        elapsed = ((finished or now) - running).total_seconds() if running else 0.0
        raw = {
            "run-id": str(run.run_id),
            "status": run.status.status
            + (f":{run.status.sub_status}" if run.status.sub_status else ""),
            "status-details": run.status.details,
            "pending-at": run.pending_at,
            "starting-at": run.starting_at,
            "running-at": run.running_at,
            "finished-at": run.finished_at,
            "elapsed": elapsed,
            "network-traffic": {
                "inbound-bytes": int(run.bytes_recv),
                "outbound-bytes": int(run.bytes_sent),
            },
            "compute-time": {
                "serverapp-seconds": elapsed,  # as flwr's `ls` reports it (run_utils.format_runs)
                "clientapp-seconds": float(run.clientapp_runtime),
            },
        }
        out.append(
            RunStatus(
                run_id=str(run.run_id),
                status=run.status.status,
                sub_status=run.status.sub_status,
                details=run.status.details or "",
                raw=raw,
                run_config=dict(run.override_config),
            )
        )
    return sorted(out, key=lambda r: r.raw["pending-at"], reverse=True)  # newest first


def run_submit(conn: Connection, run_config: dict[str, str | int | float | bool]) -> str:
    """Build the Flower App in ``conn.app_dir`` and start one run with ``run_config`` overrides
    (keys of its ``[tool.flwr.app.config]``); return the run id (str)."""
    from flwr.cli.build import build_fab_from_disk
    from flwr.common.serde import fab_to_proto, user_config_to_proto
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.supercore.fab import Fab

    try:
        fab_bytes = build_fab_from_disk(Path(conn.app_dir))
    except Exception as exc:  # flwr raises click/ValueError types for a bad app folder
        raise SuperLinkError(f"cannot build the Flower App in {conn.app_dir}: {exc}") from None
    fab = Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
    request = StartRunRequest(
        fab=fab_to_proto(fab), override_config=user_config_to_proto(dict(run_config))
    )
    response = _call(conn, "StartRun", request, timeout=SUBMIT_TIMEOUT_SECONDS)
    if not response.HasField("run_id"):
        note = response.note if response.HasField("note") else "no reason given"
        raise SuperLinkError(f"the SuperLink started no run: {note}")
    return str(response.run_id)


def run_status(conn: Connection, run_id: str) -> RunStatus:
    """Read one run's status. Raises ``SuperLinkError`` when the SuperLink does not know it."""
    from flwr.proto.control_pb2 import ListRunsRequest

    try:
        response = _call(conn, "ListRuns", ListRunsRequest(run_id=int(run_id)))
    except RunUnknown as exc:
        raise RunUnknown(f"the SuperLink does not know run {run_id} ({exc})") from None
    runs = _run_statuses(response)
    if not runs:
        raise RunUnknown(f"the SuperLink does not know run {run_id}")
    return runs[0]


def runs_list(conn: Connection, *, limit: int = 100) -> list[RunStatus]:
    """The ``limit`` newest runs the SuperLink knows (by ``pending_at``), with their run configs,
    in one request (the SuperLink lists 20 unless told otherwise)."""
    from flwr.proto.control_pb2 import ListRunsRequest

    return _run_statuses(_call(conn, "ListRuns", ListRunsRequest(limit=max(1, int(limit)))))


def runs_status(
    conn: Connection, run_ids: list[str], *, newest: list[RunStatus] | None = None
) -> dict[str, RunStatus]:
    """Status of several runs: one listing of the newest runs (``newest`` when the caller has it),
    then one request per run that is older than that page. Returns run id → ``RunStatus`` for the
    runs the SuperLink knows; runs it does not know are left out."""
    if newest is None:
        newest = runs_list(conn, limit=max(100, 2 * len(run_ids)))
    found = {r.run_id: r for r in newest if r.run_id in set(run_ids)}
    for run_id in run_ids:
        if run_id not in found:
            try:
                found[run_id] = run_status(conn, run_id)
            except RunUnknown:
                continue
    return found


def run_stop(conn: Connection, run_id: str) -> None:
    """Ask the SuperLink to stop a run (idempotent on the portal side)."""
    from flwr.proto.control_pb2 import StopRunRequest

    response = _call(conn, "StopRun", StopRunRequest(run_id=int(run_id)))
    if not response.success:
        raise SuperLinkError(f"the SuperLink did not stop run {run_id}")


# ---------------------------------------------------------------------------------------------
# SuperNodes
# ---------------------------------------------------------------------------------------------


def _when(text: str) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def nodes_list(conn: Connection) -> list[NodeState]:
    """Every SuperNode the SuperLink knows, by node id (one request)."""
    from flwr.proto.control_pb2 import ListNodesRequest

    response = _call(conn, "ListNodes", ListNodesRequest())
    out = []
    for info in response.nodes_info:
        out.append(
            NodeState(
                node_id=str(info.node_id),
                status=info.status,
                registered_at=_when(info.registered_at),
                last_activated_at=_when(info.last_activated_at),
                last_deactivated_at=_when(info.last_deactivated_at),
                unregistered_at=_when(info.unregistered_at),
                online_until=(
                    datetime.fromtimestamp(info.online_until, UTC) if info.online_until else None
                ),
                heartbeat_seconds=float(info.heartbeat_interval),
                name=info.name,
            )
        )
    return sorted(out, key=lambda n: n.node_id)


def node_register(conn: Connection, public_key: str, *, name: str) -> str:
    """Register a SuperNode's public key (OpenSSH line, an EC key on a NIST curve) under ``name``;
    return its node id. Raises ``SuperLinkError`` when the key is not such a key or the SuperLink
    refuses it (already registered, authentication off, …)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.proto.control_pb2 import RegisterNodeRequest
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    try:
        key = serialization.load_ssh_public_key(public_key.strip().encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SuperLinkError(f"not an OpenSSH public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SuperLinkError("not an EC public key (flwr node authentication needs one)")
    response = _call(
        conn, "RegisterNode", RegisterNodeRequest(public_key=public_key_to_bytes(key), name=name)
    )
    if not response.node_id:
        raise SuperLinkError("the SuperLink registered the key but returned no node id")
    return str(response.node_id)


def node_unregister(conn: Connection, node_id: str) -> None:
    """Unregister SuperNode ``node_id``: the SuperLink refuses it from then on."""
    from flwr.proto.control_pb2 import UnregisterNodeRequest

    _call(conn, "UnregisterNode", UnregisterNodeRequest(node_id=int(node_id)))
