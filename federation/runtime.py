"""The local federation of the embedded default: one SuperLink and one SuperNode per local site.

Each process gets its own ``FLWR_HOME`` and a free loopback port; each SuperNode is told its site id,
its store URL and its keyring directory through ``--node-config`` (so the ClientApp opens only that
site's data). Only the SuperLink gets the environment its ServerApps sign callbacks with
(``superlink_env``, ADR 0014): the callback key's variables are removed from every SuperNode's
environment. Every process runs with umask 077, so the SuperLink's database, the homes and the logs
are 0600 files in 0700 folders. The state file (``<root>/federation.json``) records pids, ports, log files
and how each SuperNode was started, so other processes (the portal, tests, benchmarks) can find and
stop it, and restart one site's SuperNode alone (``supernode_restart``). Imports no Django.

Each SuperLink and SuperNode starts a SuperExec child that polls for a task to launch (a ServerApp
or ClientApp process, one per message in flwr 1.42) every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``
seconds (flwr's ``supercore/superexec/run_superexec.py``: 1.0 s by default, 0.01–60 allowed); the
processes here get ``superexec_poll`` (:data:`SUPEREXEC_POLL_SECONDS` by default), which takes
about 0.4 s off every train or evaluate message on every site (issue 12, ADR 0017).

In a multi-host deployment each institution runs its own SuperNode (see docker-compose.yml) and this
module is not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from frp_flwr.signing import KEY_ENV, KEY_FILE_ENV

#: Never passed to a SuperNode: the ServerApp's callback key (see frp_flwr.signing).
_SERVERAPP_ONLY = (KEY_ENV, KEY_FILE_ENV)

#: flwr 1.42's setting of the SuperExec's task poll interval, in seconds (1.0 when unset).
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
#: The interval the local federation's SuperExecs poll at (seconds): a task waits 0.1 s on average
#: instead of 0.5 s, for 5 small gRPC calls per second per idle process.
SUPEREXEC_POLL_SECONDS = 0.2


class RuntimeError_(Exception):
    """The local federation could not be started or found."""


@dataclass
class LocalSite:
    """A site of the local federation: its id, its store URL and its keyring directory."""

    site: str
    store_url: str
    keyring: str
    received_log: str = ""  # optional: the ClientApp appends every message it receives here


@dataclass
class FederationState:
    """What ``federation.json`` holds: the SuperLink address and every process started."""

    root: str
    superlink_address: str
    superlink_pid: int
    supernodes: dict[str, int] = field(default_factory=dict)  # site → pid
    logs: dict[str, str] = field(default_factory=dict)  # process name → log file
    sites: dict[str, dict] = field(default_factory=dict)  # site → its LocalSite fields
    host: str = "127.0.0.1"
    node_env: dict[str, str] = field(default_factory=dict)  # extra environment of every SuperNode


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    """The console script ``name`` of this Python environment (falls back to PATH)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def _env(flwr_home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment: ours without the ServerApp-only variables, plus ``extra``."""
    flwr_home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(flwr_home, 0o700)
    env = {k: v for k, v in os.environ.items() if k not in _SERVERAPP_ONLY}
    env.update(extra or {})
    # Flower starts its own helpers (flower-superexec, …) by name: put this environment first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update({"FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0"})
    return env


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError_(f"process exited with {proc.returncode}; log tail:\n{tail}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError_(f"nothing listening on {host}:{port} after {timeout:.0f} s")


def _log(path: Path):
    """A log file opened for appending, created 0600."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def write_control_config(flwr_home: Path, name: str, address: str) -> Path:
    """Write ``$FLWR_HOME/config.toml`` naming the SuperLink connection ``name`` at ``address``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n'
        f'address = "{address}"\ninsecure = true\n'
    )
    return path


def start(
    root: Path,
    sites: list[LocalSite],
    *,
    host: str = "127.0.0.1",
    superlink_env: dict[str, str] | None = None,
    superexec_poll: float | None = SUPEREXEC_POLL_SECONDS,
) -> FederationState:
    """Start a SuperLink and one SuperNode per site under ``root``; return their state.

    ``superlink_env``: extra environment of the SuperLink alone (its ServerApp processes inherit
    it), e.g. ``federation.callbacks.serverapp_environment()``. ``superexec_poll``: seconds
    between the SuperExecs' task polls (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``); ``None`` leaves
    Flower's default (1.0 s, or what this environment sets). Raises ``RuntimeError_`` (after
    stopping what it started) when a process does not come up.
    """
    if superexec_poll is not None and not 0.01 <= superexec_poll <= 60:
        raise RuntimeError_(
            f"superexec_poll must be 0.01–60 s (flwr's range), not {superexec_poll}"
        )
    poll_env = {} if superexec_poll is None else {SUPEREXEC_POLL_ENV: f"{superexec_poll:g}"}
    for folder in (root, root / "logs"):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
    logs = root / "logs"
    port = free_port(host)
    sl_log = logs / "superlink.log"
    superlink = subprocess.Popen(
        [
            _bin("flower-superlink"),
            "--insecure",
            "--disable-runtime-dependency-installation",
            "--database",
            str(root / "superlink.db"),
            "--host",
            host,
            "--port",
            str(port),
        ],
        env=_env(root / "superlink-home", {**poll_env, **(superlink_env or {})}),
        stdout=_log(sl_log),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        umask=0o077,
    )
    state = FederationState(
        root=str(root),
        superlink_address=f"{host}:{port}",
        superlink_pid=superlink.pid,
        logs={"superlink": str(sl_log)},
        host=host,
        node_env=poll_env,
    )
    try:
        _wait_port(host, port, 60, superlink, sl_log)
        for site in sites:
            _start_supernode(state, site)
    except Exception:
        stop(state)
        raise
    _save(state)
    return state


def _save(state: FederationState) -> None:
    path = Path(state.root) / "federation.json"
    tmp = path.with_suffix(".json.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(json.dumps(asdict(state), indent=2))
    os.replace(tmp, path)


def _start_supernode(state: FederationState, site: LocalSite) -> int:
    """Start ``site``'s SuperNode against the state's SuperLink; record it; return its pid."""
    root, host = Path(state.root), state.host
    node_port = free_port(host)
    log = root / "logs" / f"supernode-{site.site}.log"
    node_config = f'site="{site.site}" store="{site.store_url}" keyring="{site.keyring}"'
    if site.received_log:
        node_config += f' received-log="{site.received_log}"'
    proc = subprocess.Popen(
        [
            _bin("flower-supernode"),
            "--insecure",
            "--superlink",
            state.superlink_address,
            "--host",
            host,
            "--port",
            str(node_port),
            "--node-config",
            node_config,
        ],
        env=_env(root / f"supernode-{site.site}-home", state.node_env),
        stdout=_log(log),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        umask=0o077,
    )
    state.supernodes[site.site] = proc.pid
    state.logs[f"supernode-{site.site}"] = str(log)
    state.sites[site.site] = asdict(site)
    _wait_port(host, node_port, 60, proc, log)
    return proc.pid


def _end_group(pid: int, timeout: float) -> None:
    """SIGTERM to ``pid``'s process group, SIGKILL when it has not ended within ``timeout`` s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


_NODE_ID_RE = re.compile(rb"SuperNode ID: (\d+)")


def node_sites(state: FederationState) -> dict[str, str]:
    """Node id → site of every SuperNode this federation started (restarts included), read from
    the SuperNodes' logs (flwr 1.42 logs ``SuperNode ID: N`` when it registers)."""
    out: dict[str, str] = {}
    for site in state.supernodes:
        path = Path(state.logs.get(f"supernode-{site}", ""))
        if path.is_file():
            with contextlib.suppress(OSError):
                for node_id in _NODE_ID_RE.findall(path.read_bytes()):
                    out[node_id.decode()] = site
    return out


def supernode_restart(root: Path, site: str, *, timeout: float = 10.0) -> int:
    """Restart ``site``'s SuperNode alone: the SuperLink and the other sites' SuperNodes (and the
    runs they serve) are not touched. Its old process group (if still alive) is ended first
    (SIGTERM, then SIGKILL after ``timeout`` s). Returns the new pid.

    The SuperNode registers again and gets a new node id from the SuperLink (flwr 1.42); the
    next job's discovery maps the site to it. Raises ``RuntimeError_`` for a site the local
    federation does not run, or when the new process does not come up.
    """
    state = load_state(root)
    if site not in state.supernodes:
        known = ", ".join(sorted(state.supernodes)) or "none"
        raise RuntimeError_(f"the local federation runs no SuperNode for site {site!r} ({known})")
    if site not in state.sites:
        raise RuntimeError_(
            f"{root / 'federation.json'} does not record how site {site!r} was started "
            "(it predates restarts): restart the federation once with federation_down/up"
        )
    _end_group(state.supernodes[site], timeout)
    pid = _start_supernode(state, LocalSite(**state.sites[site]))
    _save(state)
    return pid


def load_state(root: Path) -> FederationState:
    """Read ``federation.json``. Raises ``RuntimeError_`` when the federation was never started."""
    path = root / "federation.json"
    if not path.exists():
        raise RuntimeError_(
            f"no local federation at {root} (start it with `manage.py federation_up`)"
        )
    return FederationState(**json.loads(path.read_text()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def is_running(state: FederationState) -> bool:
    """True when the SuperLink and every SuperNode process is alive."""
    return all(_alive(p) for p in [state.superlink_pid, *state.supernodes.values()])


def stop(state: FederationState, *, timeout: float = 10.0) -> None:
    """Stop every process of ``state`` (SIGTERM to each process group, then SIGKILL)."""
    pids = [*state.supernodes.values(), state.superlink_pid]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    path = Path(state.root) / "federation.json"
    if path.exists():
        path.unlink()
