"""Boundary to nginx as the Fleet gateway: the only door from site hosts to the SuperLink.

flwr 1.42 serves the Fleet API (``/v1/fleet/…``, SuperNodes), the Control API (``/v1/control/…``,
no authentication in the free distribution) and the ServerAppIo/runtime API (``/v1/runtime/…``) on
one port (``flwr/superlink/main.py``). A SuperLink that site hosts reach therefore listens on
loopback only, and this gateway listens on the published address: it terminates TLS with the
SuperLink's own certificate, forwards ``POST /v1/fleet/…`` to the SuperLink over TLS (verified
with the federation CA under the name ``localhost``, which the SuperLink's certificate carries) and
answers everything else itself: 404 for any other path, 403 for another method (ADR 0033).

What the SuperNode's client needs, read from flwr 1.42 (``supercore/protobuf/client.py``,
``supernode/fleet_http_connection.py``): httpx over HTTP/1.1 (no HTTP/2), unary protobuf POSTs with
a 30 s client timeout (no long poll, no streaming on the Fleet routes; an idle SuperNode pulls every
3 s), node authentication in the headers ``flwr-public-key``, ``flwr-signature`` and
``flwr-timestamp`` (``superlink/routers/fleet/node_auth.py``: they pass through unchanged; no
underscore, so nginx keeps them), and bodies up to one object each (arrays are pushed in chunks of
``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, 5 MiB by default; a FAB up to 10 MiB comes back as a
response). So: bodies streamed both ways (no request or response buffering, so no temporary file
is written), upstream read and send timeouts of :data:`UPSTREAM_TIMEOUT_SECONDS`, keep-alive
connections to the SuperLink.

What one client address may hold (:class:`GatewayLimits`, ADR 0033): the SuperLink reads a whole
body before it authenticates the node (``supercore/protobuf/translation.py``), so whoever reaches
the port could make it hold large bodies without any key. The gateway therefore refuses a body
declared above ``max_body_mb`` (16 MiB by default: the largest body a portal model sends is one
5 MiB array chunk plus ~100 bytes of protobuf, a 64 MiB XGBoost booster being 13 such chunks; the
portal's MLPs are at most 100 000 float64 weights, 0.8 MiB) with 413 before it contacts the
SuperLink, and a chunked body (no length to check first; httpx always sends one) with 411. Per
client address: at most ``connections_per_address`` requests in progress and
``requests_per_minute`` (burst ``request_burst``), both answered 503 above that: flwr's SuperNode
retries 502/503/504 with backoff but gives up on 429 (``supercore/retry/http_retry.py``). Short
``client_header_timeout`` (the TLS handshake included, nginx < 1.25.3), body and send timeouts and
keep-alive close slow or idle clients; a SuperNode polls every 3 s and heartbeats every 30 s, and
every Fleet call is unary. ``X-Forwarded-For`` is overwritten with the client's address (uvicorn
in the SuperLink trusts it from 127.0.0.1, so a client could otherwise write its own into the
SuperLink's log) and the access log records the client's address and the upstream's status (``-``:
nginx answered alone).

The forwarded path is the one nginx normalised (``proxy_pass`` with a URI part), so a request line
such as ``/v1/control/x/..%2F..%2Ffleet/y`` reaches the SuperLink as ``/v1/fleet/y``, never as a
Control path.

Contract: ``gateway_start(root, listen_host=…, listen_port=…, upstream_port=…, cert=…, key=…,
ca=…, limits=GatewayLimits())`` writes ``<root>/nginx.conf`` (logs, pid and temporary folders
under ``root``), checks it with ``nginx -t``, starts nginx in the foreground (``daemon off;``) as a
child in its own process group and returns a ``Gateway`` once the address answers; stopping it is
ending that process group (the local runtime does so with its other processes). Raises
``NginxMissing`` when nginx is not installed, ``GatewayError`` when the configuration is refused or
nginx does not come up. Imports no Django.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: Where Debian installs nginx (not on every user's PATH).
NGINX_SBIN = Path("/usr/sbin/nginx")
#: The largest request body forwarded by default (MiB): three times flwr's default array chunk
#: (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, 5 MiB), the largest body a portal model sends; the
#: portal's ``FRP_FLEET_MAX_BODY_MB`` (sites that raise the chunk size need it raised too).
MAX_BODY_MB = 16
#: Seconds nginx waits on the SuperLink between two reads or writes (the client gives up at 30 s).
UPSTREAM_TIMEOUT_SECONDS = 120
#: The prefix of the only API forwarded.
FLEET_PREFIX = "/v1/fleet/"
#: The name nginx verifies the SuperLink's certificate against (the runtime's certificate names it).
UPSTREAM_TLS_NAME = "localhost"


class GatewayError(Exception):
    """The Fleet gateway could not be configured or started."""


class NginxMissing(GatewayError):
    """nginx is not installed on this host."""


@dataclass(frozen=True)
class GatewayLimits:
    """What one client address may hold of the gateway (ADR 0033); times in seconds.

    ``max_body_mb``: the largest request body (MiB; larger: 413, never forwarded).
    ``connections_per_address``: requests in progress at once from one address (more: 503; a
    SuperNode has at most ~5: its loop, its heartbeat, two object pushes or pulls).
    ``requests_per_minute``/``request_burst``: the average rate and the burst above it one address
    may send (more: 503; two SuperNodes of a job peak at ~10 a second together).
    ``header_timeout``: to receive the TLS handshake and the whole request header.
    ``body_timeout``/``send_timeout``: the longest pause between two reads of the body / two writes
    of the response. ``keepalive_timeout``: an idle connection is closed after it (a SuperNode
    polls every 3 s). ``worker_connections``: connections nginx holds at once (clients and
    upstream; ``worker_rlimit_nofile`` is twice that).
    """

    max_body_mb: int = MAX_BODY_MB
    connections_per_address: int = 16
    requests_per_minute: int = 1200
    request_burst: int = 200
    header_timeout: int = 10
    body_timeout: int = 20
    send_timeout: int = 30
    keepalive_timeout: int = 20
    worker_connections: int = 4096


@dataclass(frozen=True)
class Gateway:
    """A running gateway: nginx's master pid, its configuration and its logs."""

    pid: int
    address: str  # host:port it listens on
    config: str
    error_log: str
    access_log: str


def nginx_binary() -> str:
    """The path of nginx (``PATH``, then ``/usr/sbin/nginx``). Raises ``NginxMissing``."""
    found = shutil.which("nginx") or (str(NGINX_SBIN) if NGINX_SBIN.exists() else "")
    if not found:
        raise NginxMissing(
            "nginx is not installed: a SuperLink that other hosts reach is served only through "
            "a Fleet gateway (nginx, docs/adr/0033-fleet-only-gateway.md); install Debian's "
            "package `nginx` (apt-get install nginx)"
        )
    return found


def route_localnet_on(conf: Path = Path("/proc/sys/net/ipv4/conf")) -> list[str]:
    """The interfaces of this host (``conf``: the kernel's per-interface IPv4 settings) whose
    ``route_localnet`` is 1, sorted; ``[]`` when none is or the folder cannot be read.

    With ``route_localnet`` on, the kernel routes packets addressed to 127.0.0.0/8 that arrive
    on that interface, so a host on its network could reach the SuperLink's loopback listener
    (Control API without authentication) around the gateway (ADR 0033)."""
    try:
        entries = sorted(conf.iterdir())
    except OSError:
        return []
    on = []
    for entry in entries:
        try:
            if (entry / "route_localnet").read_text().strip() == "1":
                on.append(entry.name)
        except OSError:
            continue
    return on


def _listen(host: str, port: int) -> str:
    try:
        is_v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_v6 = False
    return f"[{host}]:{port}" if is_v6 else f"{host}:{port}"


def config_text(
    root: Path,
    *,
    listen_host: str,
    listen_port: int,
    upstream_port: int,
    cert: Path,
    key: Path,
    ca: Path,
    limits: GatewayLimits | None = None,
    ssl_handshake_timeout: bool = False,
) -> str:
    """nginx's configuration (text) for a gateway under ``root`` on ``listen_host:listen_port``
    that forwards ``POST /v1/fleet/…`` to ``https://127.0.0.1:upstream_port`` and refuses the rest.

    ``cert``/``key``: the SuperLink's certificate and key (PEM; the clients verify the gateway as
    the SuperLink); ``ca``: the federation CA (PEM) the SuperLink's certificate is verified with;
    ``limits``: what one client address may hold (default ``GatewayLimits()``).
    ``ssl_handshake_timeout``: nginx has that directive (1.25.3 and later; before, the TLS
    handshake counts against ``client_header_timeout``), which then gets the header timeout too.
    """
    lim = limits or GatewayLimits()
    per_minute = lim.requests_per_minute
    rate = f"{per_minute // 60}r/s" if per_minute % 60 == 0 else f"{per_minute}r/m"
    handshake = (
        f"\n        ssl_handshake_timeout {lim.header_timeout}s;" if ssl_handshake_timeout else ""
    )
    tmp = root / "tmp"
    return f"""# The Fleet gateway (federation/fleet_gateway.py, ADR 0033). Written on every start.
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {2 * lim.worker_connections};
pid {root / "nginx.pid"};
error_log {root / "error.log"} warn;

events {{
    worker_connections {lim.worker_connections};
}}

http {{
    server_tokens off;
    default_type application/octet-stream;
    log_format fleet '$remote_addr [$time_local] "$request_method $uri $server_protocol" $status '
                     '$request_length $body_bytes_sent $request_time $upstream_status';
    access_log {root / "access.log"} fleet;
    client_body_temp_path {tmp / "body"};
    proxy_temp_path {tmp / "proxy"};
    fastcgi_temp_path {tmp / "fastcgi"};
    uwsgi_temp_path {tmp / "uwsgi"};
    scgi_temp_path {tmp / "scgi"};

    # Per client address: requests in progress and their rate.
    limit_conn_zone $binary_remote_addr zone=fleet_conn:10m;
    limit_req_zone $binary_remote_addr zone=fleet_req:10m rate={rate};

    upstream flwr_superlink {{
        server 127.0.0.1:{upstream_port};
        keepalive 16;
    }}

    server {{
        listen {_listen(listen_host, listen_port)} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        client_max_body_size {lim.max_body_mb}m;
        client_header_timeout {lim.header_timeout}s;{handshake}
        client_body_timeout {lim.body_timeout}s;
        send_timeout {lim.send_timeout}s;
        keepalive_timeout {lim.keepalive_timeout}s;
        reset_timedout_connection on;
        limit_conn fleet_conn {lim.connections_per_address};
        # 503, not 429: flwr's SuperNode retries 503 with backoff and gives up on 429.
        limit_conn_status 503;
        limit_req_status 503;
        limit_conn_log_level warn;
        limit_req_log_level warn;
        # A chunked body has no length to check before it is forwarded (SuperNodes send one).
        if ($http_transfer_encoding) {{
            return 411;
        }}

        # The Fleet API only: SuperNodes' protobuf POSTs, their authentication headers unchanged.
        location {FLEET_PREFIX} {{
            limit_except POST {{
                deny all;
            }}
            limit_req zone=fleet_req burst={lim.request_burst} nodelay;
            # With a URI part, nginx sends its normalised path (no dot segments, no %2F tricks).
            proxy_pass https://flwr_superlink{FLEET_PREFIX};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host {UPSTREAM_TLS_NAME};
            # Overwritten, never appended: the SuperLink (uvicorn) trusts them from 127.0.0.1.
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto https;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_verify_depth 4;
            proxy_ssl_name {UPSTREAM_TLS_NAME};
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
            proxy_request_buffering off;
            proxy_buffering off;
            proxy_connect_timeout 10s;
            proxy_send_timeout {UPSTREAM_TIMEOUT_SECONDS}s;
            proxy_read_timeout {UPSTREAM_TIMEOUT_SECONDS}s;
        }}

        # Control (/v1/control/), runtime (/v1/runtime/), health, docs: never from here.
        location / {{
            return 404;
        }}
    }}
}}
"""


def nginx_version(nginx: str) -> tuple[int, ...]:
    """The version of the nginx binary at ``nginx`` (``nginx -v``), e.g. ``(1, 22, 1)``; ``()``
    when it cannot be read."""
    try:
        out = subprocess.run(
            [nginx, "-v"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return ()
    found = re.search(r"nginx/(\d+(?:\.\d+)*)", out)
    return tuple(int(part) for part in found[1].split(".")) if found else ()


#: The first nginx with ``ssl_handshake_timeout``.
SSL_HANDSHAKE_TIMEOUT_SINCE = (1, 25, 3)


def _write_private(path: Path, text: str) -> None:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def _wait_listening(host: str, port: int, timeout: float, proc: subprocess.Popen, log: Path):
    dial = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)  # noqa: S104
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise GatewayError(f"nginx exited with {proc.returncode}; log tail:\n{tail}")
        try:
            with socket.create_connection((dial, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise GatewayError(f"the Fleet gateway does not listen on {host}:{port} after {timeout:.0f} s")


def gateway_start(
    root: Path,
    *,
    listen_host: str,
    listen_port: int,
    upstream_port: int,
    cert: Path,
    key: Path,
    ca: Path,
    limits: GatewayLimits | None = None,
    timeout: float = 60.0,
) -> Gateway:
    """Write ``<root>/nginx.conf`` (see ``config_text``; ``limits``: ``GatewayLimits()`` by
    default), check it with ``nginx -t`` and start
    nginx in the foreground in its own process group (umask 077); return once
    ``listen_host:listen_port`` accepts connections (at most ``timeout`` seconds).

    Raises ``NginxMissing`` (no nginx), ``GatewayError`` (configuration refused, nginx exited,
    or nothing listening in time; nginx is ended first).
    """
    nginx = nginx_binary()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)
    (root / "tmp").mkdir(exist_ok=True, mode=0o700)
    conf = root / "nginx.conf"
    _write_private(
        conf,
        config_text(
            root,
            listen_host=listen_host,
            listen_port=listen_port,
            upstream_port=upstream_port,
            cert=cert,
            key=key,
            ca=ca,
            limits=limits,
            ssl_handshake_timeout=nginx_version(nginx) >= SSL_HANDSHAKE_TIMEOUT_SINCE,
        ),
    )
    error_log = root / "error.log"
    base = [nginx, "-p", f"{root}/", "-c", str(conf), "-e", str(error_log)]
    checked = subprocess.run(
        [*base, "-t", "-q"], capture_output=True, text=True, timeout=60, check=False
    )
    if checked.returncode != 0:
        raise GatewayError(f"nginx refused the gateway's configuration {conf}: {checked.stderr}")
    out = root / "nginx.out"
    with open(out, "ab") as fh:
        proc = subprocess.Popen(
            base,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0o077,
        )
    try:
        _wait_listening(listen_host, listen_port, timeout, proc, error_log)
    except GatewayError:
        gateway_stop(proc.pid)
        raise
    return Gateway(
        pid=proc.pid,
        address=f"{_listen(listen_host, listen_port)}",
        config=str(conf),
        error_log=str(error_log),
        access_log=str(root / "access.log"),
    )


def gateway_stop(pid: int, timeout: float = 10.0) -> None:
    """End the gateway whose nginx master is ``pid`` (SIGTERM to its process group: nginx's fast
    shutdown; SIGKILL after ``timeout`` seconds). A gateway already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
