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

TLS is on by default: a platform CA under ``<root>/pki`` (``federation.pki``, made on first start)
signs the SuperLink's certificate for its host (and ``127.0.0.1``/``localhost``, which its own
SuperExec dials); every SuperNode and the portal's flwr CLI verify it with ``--root-certificates`` /
``root-certificates``. ``insecure=True`` (plain HTTP, ``--insecure``) exists only for development and
is reached only through an explicit flag (``manage.py federation_up --insecure-development``).

A federation that other hosts reach (``host`` not a loopback address, e.g. ``0.0.0.0``) does not
publish the SuperLink: flwr 1.42 serves the Fleet, Control and runtime APIs on one port, and the
Control API has no authentication, so the SuperLink listens on ``127.0.0.1`` and a Fleet gateway
(``federation.fleet_gateway``, nginx) listens on ``host`` and forwards only ``/v1/fleet/`` to it
(ADR 0033). ``FederationState.superlink_address`` is then the loopback address (the portal's
Control connection, the ServerApps) and ``public_address`` the gateway's (SuperNodes, site kits).
A loopback-only federation (the embedded default) needs no gateway and has one address.

In a multi-host deployment each institution runs its own SuperNode (see docker-compose.yml and the
site package, ``frp_site``) and this module is not used there.
"""

from __future__ import annotations

import contextlib
import ipaddress
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

from federation import fleet_gateway, pki, superlink
from frp_flwr.checkpoints import STORE_ENV
from frp_flwr.signing import KEY_ENV, KEY_FILE_ENV
from frp_site import nodekey, supernode

#: Never passed to a SuperNode: the ServerApp's callback key (see frp_flwr.signing).
_SERVERAPP_ONLY = (KEY_ENV, KEY_FILE_ENV, STORE_ENV)

#: Every process this module starts carries ``FRP_FEDERATION_ROOT=<root>`` in its environment, and
#: so does everything those processes start (Flower's SuperExec, ServerApps, ClientApps). flwr 1.42
#: starts the SuperLink's SuperExec in a session of its own, so a ServerApp is in no process group
#: ``stop`` signals, and it outlives its SuperLink reparented to init; ``stop`` finds it by this.
FEDERATION_MARK_ENV = "FRP_FEDERATION_ROOT"

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
    auth_key: str = ""  # the SuperNode's private key (made on first start when missing)
    netns: str = ""  # a network namespace standing for the site's own host (multi-host test)
    superlink_host: str = ""  # the SuperLink's address as that host dials it (default: ours)


@dataclass
class FederationState:
    """What ``federation.json`` holds: the SuperLink address and every process started."""

    root: str
    superlink_address: str  # where the portal's Control connection dials (loopback with a gateway)
    superlink_pid: int
    supernodes: dict[str, int] = field(default_factory=dict)  # site → pid
    logs: dict[str, str] = field(default_factory=dict)  # process name → log file
    ca_cert: str = ""  # the CA that signed the SuperLink's certificate ("" when insecure)
    insecure: bool = False
    node_auth: bool = False  # SuperNode authentication on (--enable-supernode-auth)
    node_ids: dict[str, str] = field(default_factory=dict)  # site → registered node id
    sites: dict[str, dict] = field(default_factory=dict)  # site → its LocalSite fields
    host: str = "127.0.0.1"
    node_env: dict[str, str] = field(default_factory=dict)  # extra environment of every SuperNode
    # The Fleet gateway (nginx) in front of the SuperLink when other hosts reach it (0: none), and
    # the address SuperNodes and site kits use ("": the SuperLink's own, a loopback federation).
    gateway_pid: int = 0
    public_address: str = ""

    @property
    def fleet_address(self) -> str:
        """The address a SuperNode dials: the gateway's, or the SuperLink's without one."""
        return self.public_address or self.superlink_address


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
    """The process environment: ours without the ServerApp-only variables, plus ``extra`` and
    the federation's mark (:data:`FEDERATION_MARK_ENV`: ``flwr_home``'s parent, the root)."""
    flwr_home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(flwr_home, 0o700)
    env = {k: v for k, v in os.environ.items() if k not in _SERVERAPP_ONLY}
    env.update(extra or {})
    env[FEDERATION_MARK_ENV] = str(flwr_home.parent)
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


def write_control_config(
    flwr_home: Path, name: str, address: str, *, root_certificates: str | Path | None = None
) -> Path:
    """Write ``$FLWR_HOME/config.toml`` naming the SuperLink connection ``name`` at ``address``.

    ``root_certificates``: the CA certificate (PEM file) the CLI verifies the SuperLink with; without
    it the connection is ``insecure = true`` (development only).
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    tls = (
        f"root-certificates = {json.dumps(str(root_certificates))}\n"
        if root_certificates
        else "insecure = true\n"
    )
    text = f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{tls}'
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path


def write_state_control_config(flwr_home: Path, name: str, state: FederationState) -> Path:
    """``write_control_config`` for the federation ``state`` (its address and CA, if any)."""
    return write_control_config(
        flwr_home, name, state.superlink_address, root_certificates=state.ca_cert or None
    )


def superlink_tls(
    root: Path, host: str, extra_names: list[str] | None = None
) -> tuple[pki.CertificateAuthority, pki.ServerCertificate]:
    """The CA under ``<root>/pki`` (made on first use) and a fresh SuperLink certificate for
    ``host``, ``127.0.0.1``, ``localhost`` and ``extra_names`` (a wildcard bind address is left
    out: nobody dials it)."""
    ca = pki.ca_load_or_create(root / "pki")
    names = [h for h in [host, "127.0.0.1", "localhost", *(extra_names or [])] if h != "0.0.0.0"]  # noqa: S104
    cert = pki.server_certificate_issue(
        ca, root / "pki", name="superlink", hosts=names, replace=True
    )
    return ca, cert


def start(
    root: Path,
    sites: list[LocalSite],
    *,
    host: str = "127.0.0.1",
    superlink_env: dict[str, str] | None = None,
    insecure: bool = False,
    node_auth: bool | None = None,
    tls_names: list[str] | None = None,
    superexec_poll: float | None = SUPEREXEC_POLL_SECONDS,
    fleet_gateway_on: bool = False,
    gateway_limits: fleet_gateway.GatewayLimits | None = None,
) -> FederationState:
    """Start a SuperLink and one SuperNode per site under ``root``; return their state.

    ``superlink_env``: extra environment of the SuperLink alone (its ServerApp processes inherit
    it), e.g. ``federation.callbacks.serverapp_environment()``. TLS with the CA of ``<root>/pki``
    unless ``insecure`` (development only). ``node_auth`` (default: on unless ``insecure``): the
    SuperLink runs with ``--enable-supernode-auth`` and each site's key (``LocalSite.auth_key``, or
    ``<root>/node-keys/<site>.key``, made on first start) is registered before its SuperNode
    starts (``register_nodes``). ``superexec_poll``: seconds between the SuperExecs' task polls
    (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``); ``None`` leaves Flower's default (1.0 s, or what this
    environment sets). Raises ``RuntimeError_`` (after stopping what it started) when a process
    does not come up or a key cannot be registered, ``pki.PkiError`` when the CA is unusable.

    ``host`` other than a loopback address (e.g. ``"0.0.0.0"``: every interface; sites in other
    network namespaces dial it at the addresses in ``tls_names``, which the certificate names):
    the SuperLink listens on ``127.0.0.1`` only and a Fleet gateway (nginx) on ``host`` forwards
    only the Fleet API to it (ADR 0033); ``fleet_gateway_on`` puts the gateway in front of a
    loopback SuperLink too (tests); ``gateway_limits``: what one client address may hold of it
    (body size, connections, rate, timeouts; ``fleet_gateway.GatewayLimits()`` by default). There
    is no way to publish the SuperLink itself. Raises
    ``RuntimeError_`` (saying to install Debian's ``nginx``) when a gateway is needed and nginx is
    not installed, when an interface routes loopback addresses (``route_localnet``, which would
    let other hosts around the gateway), and for a gateway without TLS (``insecure``).
    """
    fleet_gateway_on = fleet_gateway_on or not _is_loopback(host)
    if fleet_gateway_on and insecure:
        raise RuntimeError_(
            "a federation other hosts reach runs with TLS only (its Fleet gateway terminates TLS): "
            "drop --insecure-development or listen on 127.0.0.1"
        )
    if fleet_gateway_on:
        try:
            fleet_gateway.nginx_binary()
        except fleet_gateway.NginxMissing as exc:
            raise RuntimeError_(str(exc)) from exc
        if localnet := fleet_gateway.route_localnet_on():
            raise RuntimeError_(
                "net.ipv4.conf.{" + ",".join(localnet) + "}.route_localnet is 1: other hosts "
                "could reach the SuperLink's loopback listener around the Fleet gateway; set it "
                "to 0 (sysctl -w net.ipv4.conf.all.route_localnet=0 and per interface)"
            )
    public_host = host
    if fleet_gateway_on:
        host = "127.0.0.1"  # the SuperLink itself: only this host reaches it
    node_auth = (not insecure) if node_auth is None else node_auth
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
    if insecure:
        ca_cert, tls_args = "", ["--insecure"]
    else:
        ca, cert = superlink_tls(root, public_host, tls_names)
        ca_cert = str(ca.cert)
        tls_args = [
            f"--ssl-ca-certfile={ca.cert}",
            f"--ssl-certfile={cert.cert}",
            f"--ssl-keyfile={cert.key}",
        ]
    superlink_proc = subprocess.Popen(
        [
            _bin("flower-superlink"),
            *tls_args,
            *(["--enable-supernode-auth"] if node_auth else []),
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
        superlink_pid=superlink_proc.pid,
        logs={"superlink": str(sl_log)},
        ca_cert=ca_cert,
        insecure=insecure,
        node_auth=node_auth,
        host=host,
        node_env=poll_env,
    )
    try:
        _wait_port(state.superlink_address.rpartition(":")[0], port, 60, superlink_proc, sl_log)
        if fleet_gateway_on:
            public_port = free_port(public_host)
            try:
                gw = fleet_gateway.gateway_start(
                    root / "gateway",
                    listen_host=public_host,
                    listen_port=public_port,
                    upstream_port=port,
                    cert=Path(cert.cert),
                    key=Path(cert.key),
                    ca=Path(ca.cert),
                    limits=gateway_limits,
                )
            except fleet_gateway.GatewayError as exc:
                raise RuntimeError_(f"the Fleet gateway did not start: {exc}") from exc
            state.gateway_pid = gw.pid
            state.public_address = f"{_dial_host(public_host)}:{public_port}"
            state.logs["gateway"] = gw.error_log
            state.logs["gateway-access"] = gw.access_log
        if node_auth:
            state.node_ids = register_nodes(state, sites)
        wait_for_stale_nodes(state)
        for site in sites:
            start_supernode(state, site)
    except Exception:
        stop(state)
        raise
    save_state(state)
    return state


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _dial_host(host: str) -> str:
    """The address this host dials to reach a socket bound to ``host`` (a wildcard: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104


def save_state(state: FederationState) -> None:
    """Write ``<root>/federation.json`` (0600; through a temporary file and a rename, so a reader
    never sees half a file)."""
    path = Path(state.root) / "federation.json"
    tmp = path.with_suffix(".json.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(json.dumps(asdict(state), indent=2))
    os.replace(tmp, path)


def site_auth_key(state: FederationState, site: LocalSite) -> Path:
    """The private key ``site``'s SuperNode authenticates with (made on first use, 0600)."""
    path = (
        Path(site.auth_key)
        if site.auth_key
        else Path(state.root) / "node-keys" / f"{site.site}.key"
    )
    if not path.exists():
        nodekey.key_pair_create(path, comment=site.site)
        os.chmod(f"{path}.pub", 0o600)  # everything under the runtime's root is private
    return path


def control_connection(state: FederationState) -> superlink.Connection:
    """A connection of the flwr CLI to this federation's SuperLink (its own ``FLWR_HOME``)."""
    home = Path(state.root) / "control-home"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    write_state_control_config(home, "local", state)
    return superlink.Connection(flwr_home=home, federation="local", app_dir=Path(state.root))


def register_nodes(state: FederationState, sites: list[LocalSite]) -> dict[str, str]:
    """Register each site's public key with the SuperLink, once; return site → node id.

    ``<root>/nodes.json`` remembers what was registered (site → node id, public key): a key the
    SuperLink still lists under that id is not registered again (the SuperLink's database
    outlives a restart). Raises ``RuntimeError_`` when the SuperLink refuses a key.
    """
    path = Path(state.root) / "nodes.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    conn = control_connection(state)
    try:
        listed = {n.node_id: n for n in superlink.nodes_list(conn)} if known else {}
        ids: dict[str, str] = {}
        for site in sites:
            public = nodekey.public_key_of(site_auth_key(state, site))
            entry = known.get(site.site) or {}
            node = listed.get(str(entry.get("node_id")))
            if entry.get("public_key") == public and node and node.status != "unregistered":
                ids[site.site] = node.node_id
                continue
            ids[site.site] = superlink.node_register(conn, public, name=site.site)
            known[site.site] = {"node_id": ids[site.site], "public_key": public}
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
                fh.write(json.dumps(known, indent=2))
    except (superlink.SuperLinkError, nodekey.NodeKeyError) as exc:
        raise RuntimeError_(f"SuperNode registration failed: {exc}") from exc
    return ids


def start_supernode(state: FederationState, site: LocalSite) -> int:
    """Start ``site``'s SuperNode against ``state``'s SuperLink; record it (pid, log, how it was
    started, for ``supernode_restart``) and return its pid.

    TLS with ``--root-certificates`` (the state's CA) unless the federation is ``insecure``; its
    key with ``--auth-supernode-private-key`` when SuperNode authentication is on; the SuperExec
    poll setting of ``state.node_env``. It dials ``state.fleet_address`` (the Fleet gateway's
    port when there is one). With ``site.netns`` it runs inside that network namespace
    (``ip netns exec``) and dials ``site.superlink_host`` at that port. Raises ``RuntimeError_``
    when it does not come up.
    """
    logs = Path(state.root) / "logs"
    # Its ClientAppIo port is local only: a wildcard SuperLink bind does not widen it.
    host = "127.0.0.1" if site.netns or not _is_loopback(state.host) else state.host
    node_port = free_port(host)
    log = logs / f"supernode-{site.site}.log"
    config = {"site": site.site, "store": site.store_url, "keyring": site.keyring}
    if site.received_log:
        config["received-log"] = site.received_log
    port = state.fleet_address.rpartition(":")[2]
    address = f"{site.superlink_host}:{port}" if site.superlink_host else state.fleet_address
    args = supernode.command(
        address,
        node_config=config,
        ca_cert=state.ca_cert or None,
        auth_key=site_auth_key(state, site) if state.node_auth else None,
        port=node_port,
        host=host,
        executable=_bin("flower-supernode"),
        insecure=state.insecure,
    )
    if site.netns:
        args = ["ip", "netns", "exec", site.netns, *args]
    proc = subprocess.Popen(
        args,
        env=_env(Path(state.root) / f"supernode-{site.site}-home", state.node_env),
        stdout=_log(log),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        umask=0o077,
    )
    state.supernodes[site.site] = proc.pid
    state.logs[f"supernode-{site.site}"] = str(log)
    if site.netns:
        _wait_port_in(site.netns, node_port, 60, proc, log)
    else:
        _wait_port(host, node_port, 60, proc, log)
    state.sites[site.site] = asdict(site)
    return proc.pid


def _wait_port_in(netns: str, port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    """``_wait_port`` on 127.0.0.1 inside network namespace ``netns``."""
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError_(f"process exited with {proc.returncode}; log tail:\n{tail}")
        done = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-c", probe],
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError_(f"nothing listening on {netns}:127.0.0.1:{port} after {timeout:.0f} s")


def _end_group(pid: int, timeout: float) -> None:
    """SIGTERM to ``pid``'s process group, SIGKILL when it has not ended within ``timeout`` s."""
    _end_groups([pid], timeout)


def _end_groups(pids: list[int], timeout: float) -> None:
    """SIGTERM to each of ``pids``' process groups at once, then SIGKILL to those whose leader
    has not ended within ``timeout`` s (one deadline for all); reaps the ones that are ours."""
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


_NODE_ID_RE = re.compile(rb"SuperNode ID: (\d+)")


def node_sites(state: FederationState) -> dict[str, str]:
    """Node id → site of every SuperNode this federation started (restarts included), read from
    the SuperNodes' logs (flwr 1.42 logs ``SuperNode ID: N`` when it registers)."""
    out: dict[str, str] = {node_id: site for site, node_id in state.node_ids.items()}
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
    pid = start_supernode(state, LocalSite(**state.sites[site]))
    save_state(state)
    return pid


def load_state(root: Path) -> FederationState:
    """Read ``federation.json``. Raises ``RuntimeError_`` when the federation was never started."""
    path = root / "federation.json"
    if not path.exists():
        raise RuntimeError_(
            f"no local federation at {root} (start it with `manage.py federation_up`)"
        )
    return FederationState(**json.loads(path.read_text()))


def _end_marked(root: str, timeout: float) -> None:
    """SIGTERM to every process marked with ``root``, SIGKILL to those left after ``timeout`` s."""
    stray = marked_processes(root)
    for pid in stray:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while stray and time.monotonic() < deadline:
        for pid in stray:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        stray = [pid for pid in stray if pid in marked_processes(root)]
        if stray:
            time.sleep(0.1)
    for pid in stray:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def is_running(state: FederationState) -> bool:
    """True when the SuperLink, its Fleet gateway (if any) and every SuperNode process is alive."""
    gateway = [state.gateway_pid] if state.gateway_pid else []
    return all(_alive(p) for p in [state.superlink_pid, *gateway, *state.supernodes.values()])


def marked_processes(root: str | Path) -> list[int]:
    """Pids of the live processes whose environment carries this federation's mark
    (``FRP_FEDERATION_ROOT=<root>``, read from ``/proc/<pid>/environ``): everything the federation
    at ``root`` started, at any depth, reparented or not. Empty where there is no ``/proc``."""
    needle = f"{FEDERATION_MARK_ENV}={root}".encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def wait_for_stale_nodes(state: FederationState, *, bound: float = 90.0) -> float:
    """Wait until no node of the SuperLink just started counts as online; returns the seconds
    waited (0.0 when none did, or the SuperLink did not answer within 30 s).

    A SuperNode that ended without deactivating itself (killed, or its SuperLink gone first)
    stays "online" in the SuperLink's database until its heartbeat lapses (``online_until``, two
    heartbeat intervals: 60 s), and the SuperLink refuses to activate the same node meanwhile
    (Flower error 2004: the SuperNode exits). No SuperNode of this root runs yet, so every node
    online now is such a leftover. ``bound``: the most seconds waited."""
    from datetime import UTC, datetime

    deadline = time.monotonic() + 30.0
    while True:
        try:
            nodes = superlink.nodes_list(control_connection(state))
            break
        except superlink.SuperLinkError:
            if time.monotonic() >= deadline:
                return 0.0
            time.sleep(0.5)
    until = max(
        (n.online_until for n in nodes if n.status == "online" and n.online_until), default=None
    )
    if until is None:
        return 0.0
    wait = min(max((until - datetime.now(UTC)).total_seconds() + 1.0, 0.0), bound)
    if wait:
        print(
            f"A SuperNode of the last run did not sign off; waiting {wait:.0f} s until the "
            "SuperLink counts it offline.",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(wait)
    return wait


def stop(state: FederationState, *, timeout: float = 10.0) -> None:
    """Stop every process of ``state``: the SuperNodes, the Fleet gateway and the SuperLink (SIGTERM
    to each process group, then SIGKILL after ``timeout`` s); then the same to every process still
    carrying the federation's mark (``marked_processes``), such as a ServerApp whose SuperExec ran
    in a session of its own.

    The SuperNodes go first, and the SuperLink only once they have ended: a SuperNode that exits
    on SIGTERM deactivates itself at the SuperLink, which must still answer. A node stopped
    with the SuperLink stayed "online" in its database for two heartbeat intervals (60 s), and
    the same SuperNode started again within them was refused ("could not be activated", Flower
    error 2004): a second ``./run.sh`` right after ``--exit-after-job`` had no site connected."""
    gateway = [state.gateway_pid] if state.gateway_pid else []
    _end_groups(list(state.supernodes.values()), timeout)
    _end_groups([*gateway, state.superlink_pid], timeout)
    _end_marked(state.root, timeout)
    path = Path(state.root) / "federation.json"
    if path.exists():
        path.unlink()
