"""The Fleet gateway (``federation/fleet_gateway.py``, ADR 0033) in front of a real SuperLink.

flwr 1.42 serves Fleet, Control and runtime APIs on one port; a federation that other hosts reach
publishes only nginx, which forwards ``POST /v1/fleet/…`` and refuses the rest. Here the gateway
runs in front of the loopback SuperLink of a real two-site federation (``flower_world`` with
``fleet_gateway_on``): requests through the public address reach the Fleet API and nothing else,
the portal's own Control client works on the loopback address and fails on the public one, and a
job submitted through the web form completes with both SuperNodes dialling the gateway.

What a host that reaches the port gets without a key (issues 9 and 13, a hostile re-test): no body
above the cap reaches the SuperLink, one client address holds no more than its share of requests,
a slow or idle connection is closed within the gateway's timeouts, and the SuperLink sees the
client's real address, not one the client wrote into ``X-Forwarded-For``. Client addresses are
told apart by dialling from other loopback addresses (127.0.0.0/8 is all local on Linux).
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from federation import fleet_gateway, pki, runtime, superlink
from federation.models import FederatedJob, JobStatus, SiteRoundMetric
from tests.federation.conftest import flower_world, wait_for

MIB = 1024 * 1024

SITES = ("hospital-a", "hospital-b")
ROUNDS = 1

pytestmark = pytest.mark.skipif(
    not shutil.which("nginx") and not Path("/usr/sbin/nginx").exists(),
    reason="needs Debian's nginx",
)


# ---------------------------------------------------------------------------------------------
# Without a SuperLink
# ---------------------------------------------------------------------------------------------


def test_config_forwards_only_the_fleet_prefix(tmp_path):
    text = fleet_gateway.config_text(
        tmp_path,
        listen_host="0.0.0.0",  # noqa: S104
        listen_port=9092,
        upstream_port=40000,
        cert=tmp_path / "c.crt",
        key=tmp_path / "c.key",
        ca=tmp_path / "ca.crt",
    )
    forwarded = [line.strip() for line in text.splitlines() if "proxy_pass" in line]
    assert forwarded == ["proxy_pass https://flwr_superlink/v1/fleet/;"]
    assert "server 127.0.0.1:40000;" in text
    assert (
        "proxy_ssl_verify on;" in text
        and f"proxy_ssl_trusted_certificate {tmp_path / 'ca.crt'};" in text
    )
    assert "daemon off;" in text


def test_default_body_cap_holds_the_largest_body_a_portal_model_sends():
    """The cap is measured, not guessed: the largest Fleet request body (a ``PushObjectRequest``)
    of the largest models the portal offers — an XGBoost booster of ``MAX_BOOSTER_BYTES`` (flwr
    pushes it in ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` chunks) and an MLP of
    ``MAX_MODEL_VALUES`` float64 weights — fits at least twice under the default cap."""
    import numpy as np
    from flwr.app import ArrayRecord, RecordDict
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from frp_flwr import contract, trees

    def largest_push_body(record: ArrayRecord) -> int:
        return max(
            PushObjectRequest(
                node=Node(node_id=2**63 - 1),
                run_id=2**63 - 1,
                session_id="x" * 64,
                object_id=object_id,
                object_content=obj.deflate(),
            ).ByteSize()
            for object_id, obj in get_all_nested_objects(RecordDict({"arrays": record})).items()
        )

    booster = trees.to_record(np.ones(trees.MAX_BOOSTER_BYTES, dtype=np.uint8).tobytes())
    mlp = ArrayRecord([np.ones((contract.MAX_MODEL_VALUES // 100, 100)), np.ones(100)])
    largest = max(largest_push_body(booster), largest_push_body(mlp))

    assert FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE < largest < FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + 1024
    assert (
        2 * largest
        <= fleet_gateway.MAX_BODY_MB * MIB
        == fleet_gateway.GatewayLimits().max_body_mb * MIB
    )


def _tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    ca = pki.ca_load_or_create(tmp_path / "pki")
    leaf = pki.server_certificate_issue(
        ca, tmp_path / "pki", name="gw", hosts=["localhost", "127.0.0.1"]
    )
    return Path(leaf.cert), Path(leaf.key), Path(ca.cert)


@pytest.mark.parametrize(
    "limits",
    [
        fleet_gateway.GatewayLimits(),
        fleet_gateway.GatewayLimits(
            max_body_mb=1, connections_per_address=2, requests_per_minute=1, request_burst=1
        ),
    ],
    ids=["default", "small"],
)
def test_config_with_its_limits_passes_nginx_t(tmp_path, limits):
    cert, key, ca = _tls_files(tmp_path)
    nginx = fleet_gateway.nginx_binary()
    (tmp_path / "tmp").mkdir()
    conf = tmp_path / "nginx.conf"
    text = fleet_gateway.config_text(
        tmp_path,
        listen_host="127.0.0.1",
        listen_port=runtime.free_port(),
        upstream_port=runtime.free_port(),
        cert=cert,
        key=key,
        ca=ca,
        limits=limits,
        ssl_handshake_timeout=(
            fleet_gateway.nginx_version(nginx) >= fleet_gateway.SSL_HANDSHAKE_TIMEOUT_SINCE
        ),
    )
    conf.write_text(text)
    done = subprocess.run(
        [nginx, "-p", f"{tmp_path}/", "-c", str(conf), "-e", str(tmp_path / "e.log"), "-t"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"client_max_body_size {limits.max_body_mb}m;" in text
    assert f"limit_conn fleet_conn {limits.connections_per_address};" in text
    assert f"limit_req zone=fleet_req burst={limits.request_burst} nodelay;" in text
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in text


def test_start_without_nginx_names_the_package_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(fleet_gateway, "NGINX_SBIN", tmp_path / "no-nginx")

    with pytest.raises(runtime.RuntimeError_, match=r"install Debian's package `nginx`"):
        runtime.start(tmp_path / "federation", [], host="0.0.0.0")  # noqa: S104

    assert not (tmp_path / "federation" / "superlink.db").exists()


def test_insecure_federation_reached_from_other_hosts_is_refused(tmp_path):
    with pytest.raises(runtime.RuntimeError_, match="TLS only"):
        runtime.start(tmp_path / "federation", [], host="0.0.0.0", insecure=True)  # noqa: S104


def test_route_localnet_on_names_the_interfaces_that_route_loopback(tmp_path):
    conf = tmp_path / "conf"
    for name, value in (("all", "0"), ("default", "0"), ("eth0", "1"), ("lo", "0"), ("veth1", "1")):
        (conf / name).mkdir(parents=True)
        (conf / name / "route_localnet").write_text(f"{value}\n")
    assert fleet_gateway.route_localnet_on(conf) == ["eth0", "veth1"]
    assert fleet_gateway.route_localnet_on(tmp_path / "missing") == []


@pytest.mark.skipif(
    shutil.which("ip") is None or not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root and iproute2 to make a network namespace",
)
def test_route_localnet_is_read_from_the_hosts_own_kernel_settings(tmp_path):
    """In a network namespace made here (its own /proc/sys/net), with route_localnet switched on
    for every interface, the check run inside it names them; outside it, this host's names none
    (route_localnet is 0 on a normal host)."""
    ns = f"frp-rl-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1"],
            check=True,
        )
        subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.conf.lo.route_localnet=1"],
            check=True,
        )
        code = "from federation.fleet_gateway import route_localnet_on; print(route_localnet_on())"
        inside = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code],
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.strip()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert inside == "['all', 'lo']"
    assert fleet_gateway.route_localnet_on() == []


def test_a_host_that_routes_loopback_addresses_starts_no_gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet_gateway, "route_localnet_on", lambda: ["eth0"])
    with pytest.raises(runtime.RuntimeError_, match=r"net.ipv4.conf.\{eth0\}.route_localnet is 1"):
        runtime.start(tmp_path / "federation", [], host="0.0.0.0")  # noqa: S104
    assert not (tmp_path / "federation" / "superlink.db").exists()


def test_site_kit_address_is_the_gateways_not_the_superlinks(tmp_path, settings):
    from federation import onboarding

    settings.VAR_DIR = tmp_path
    settings.FRP_SUPERLINK_PUBLIC_ADDRESS = ""
    state = runtime.FederationState(
        root=str(tmp_path / "federation"),
        superlink_address="127.0.0.1:40001",
        superlink_pid=0,
        gateway_pid=0,
        public_address="10.1.2.3:40002",
    )
    (tmp_path / "federation").mkdir()
    runtime.save_state(state)

    assert onboarding.superlink_public_address() == "10.1.2.3:40002"

    state.public_address = ""  # a loopback federation: one address
    runtime.save_state(state)
    assert onboarding.superlink_public_address() == "127.0.0.1:40001"


# ---------------------------------------------------------------------------------------------
# A real federation behind the gateway
# ---------------------------------------------------------------------------------------------


@dataclass
class Gated:
    """The federation behind the gateway and the job it ran (read before any flush)."""

    world: object
    federation: runtime.FederationState
    job: FederatedJob
    ok_rounds: dict[str, list[int]]


@pytest.fixture(scope="module")
def gated(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    """A two-site federation behind the gateway, and a job from the web form run to its end
    first (every test of this module flushes the database when it ends: live server)."""
    with (
        flower_world(
            SITES,
            root=tmp_path_factory.mktemp("fleet-gateway"),
            live_server=live_server,
            django_db_blocker=django_db_blocker,
            fleet_gateway_on=True,
        ) as world,
        django_db_blocker.unblock(),
    ):
        client = Client()
        client.force_login(world.researcher)
        response = client.post(
            reverse("federation:job_create"),
            {
                "title": "behind the gateway",
                "project": world.project.pk,
                "datasets": [v.pk for v in world.versions],
                "target_column": "diagnosis",
                "feature_columns": "",
                "num_rounds": ROUNDS,
                "local_epochs": 1,
                "learning_rate": 0.1,
            },
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        job = FederatedJob.objects.latest("pk")

        def done():
            j = FederatedJob.objects.get(pk=job.pk)
            return j if j.is_terminal else None

        job = wait_for(done, timeout=900, what="the job to finish")
        ok_rounds = {
            site: sorted(
                SiteRoundMetric.objects.filter(
                    job_site__job=job, job_site__site__slug=site, ok=True
                ).values_list("round", flat=True)
            )
            for site in SITES
        }
        yield Gated(world, world.federation, job, ok_rounds)


def _post(
    address: str,
    cafile: str,
    path: str,
    method: str = "POST",
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, bytes]:
    """One request with the request line exactly as given (no client-side normalisation), from
    the loopback address ``source``."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPSConnection(
        host,
        int(port),
        context=ssl.create_default_context(cafile=cafile),
        timeout=30,
        source_address=(source, 0),
    )
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={"content-type": "application/protobuf", **(headers or {})},
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


#: The head of an unsigned Fleet call announcing a 10-byte body.
_REQUEST_HEAD = (
    b"POST /v1/fleet/get-run HTTP/1.1\r\nHost: superlink\r\n"
    b"Content-Type: application/protobuf\r\nContent-Length: 10\r\n\r\n"
)


def _tls_connect(address: str, cafile: str, source: str = "127.0.0.1") -> ssl.SSLSocket:
    host, _, port = address.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    return ssl.create_default_context(cafile=cafile).wrap_socket(raw, server_hostname=host)


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True once the peer closes ``sock`` (EOF or reset) within ``timeout`` seconds, reading and
    dropping whatever it sends first; False when it is still open then."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            return True
    return False


def _superlink_log_line(state: runtime.FederationState, client: str) -> str:
    """The SuperLink's (uvicorn's) access log line of a request from ``client`` (the address it
    took from the gateway's ``X-Forwarded-For``; port 0), or ``""``."""
    for line in Path(state.logs["superlink"]).read_text(errors="replace").splitlines():
        if f"] {client}:" in line:
            return line
    return ""


def _push_object_body(size: int) -> bytes:
    """An unsigned Fleet ``PushObjectRequest`` of exactly ``size`` bytes."""
    from flwr.proto.message_pb2 import PushObjectRequest

    content = size
    while True:
        body = PushObjectRequest(object_id="0" * 64, object_content=b"\0" * content)
        excess = body.ByteSize() - size
        if excess == 0:
            return body.SerializeToString()
        content -= excess


def _connection(tmp_path: Path, state: runtime.FederationState, address: str):
    runtime.write_control_config(tmp_path, "probe", address, root_certificates=state.ca_cert)
    return superlink.Connection(flwr_home=tmp_path, federation="probe", app_dir=tmp_path)


_SUPERLINK_AUTH_REFUSAL = b"Invalid SuperNode authentication"  # flwr's node_auth.py answer


@pytest.mark.integration
def test_the_superlink_itself_listens_on_loopback_only(gated):
    state = gated.federation
    assert state.gateway_pid and state.public_address
    assert state.superlink_address.startswith("127.0.0.1:")
    assert state.public_address != state.superlink_address
    assert runtime.is_running(state)


@pytest.mark.integration
def test_fleet_api_through_the_gateway_reaches_the_superlink(gated):
    state = gated.federation
    status, body = _post(state.public_address, state.ca_cert, "/v1/fleet/get-run")
    # An unsigned Fleet call is answered by the SuperLink's node authentication, not by nginx.
    assert status == 401 and _SUPERLINK_AUTH_REFUSAL in body


@pytest.mark.integration
@pytest.mark.parametrize(
    "path",
    [
        "/v1/control/list-runs",
        "/v1/control/start-run",
        "/v1/control/register-node",
        "/v1/runtime/pull-app-inputs",
        "/health",
        "/docs",
        "/openapi.json",
        "/v1/fleet/../control/list-runs",
        "/v1/fleet/%2e%2e/control/list-runs",
        "/v1/fleetx/get-run",
    ],
)
def test_every_other_path_is_refused_by_the_gateway(gated, path):
    state = gated.federation
    status, body = _post(state.public_address, state.ca_cert, path)
    assert status == 404 and b"nginx" in body, (path, status, body[:200])
    # The same path on the SuperLink's own (loopback) port is not a gateway answer: the
    # refusal above is the gateway's doing.
    direct_status, direct_body = _post(state.superlink_address, state.ca_cert, path)
    assert b"<center>nginx</center>" not in direct_body, (path, direct_status)


@pytest.mark.integration
def test_a_control_path_dressed_as_fleet_reaches_only_fleet(gated):
    """nginx forwards its normalised path: a request line that a server not resolving ``%2F``
    would route to the Control API arrives as a Fleet call."""
    state = gated.federation
    status, body = _post(
        state.public_address, state.ca_cert, "/v1/control/list-runs/..%2F..%2Ffleet/get-run"
    )
    assert status == 401 and _SUPERLINK_AUTH_REFUSAL in body
    assert '"POST /v1/fleet/get-run ' in Path(state.logs["gateway-access"]).read_text()


@pytest.mark.integration
def test_other_methods_on_fleet_are_refused(gated):
    state = gated.federation
    status, _ = _post(state.public_address, state.ca_cert, "/v1/fleet/get-run", method="GET")
    assert status == 403


@pytest.mark.integration
def test_control_client_fails_at_the_public_address_and_works_on_loopback(gated, tmp_path):
    state = gated.federation
    public = _connection(tmp_path / "public", state, state.public_address)
    loopback = _connection(tmp_path / "loopback", state, state.superlink_address)

    assert isinstance(superlink.runs_list(loopback), list)  # the portal's own connection
    with pytest.raises(superlink.SuperLinkError):
        superlink.runs_list(public)  # `flwr ls`
    with pytest.raises(superlink.SuperLinkError):
        superlink.nodes_list(public)  # `flwr supernode ls`
    with pytest.raises(superlink.SuperLinkError):
        superlink.node_register(public, "ecdsa-sha2-nistp384 AAAA rogue", name="rogue")
    with pytest.raises(superlink.SuperLinkError):
        superlink.run_stop(public, "1")  # `flwr stop`


@pytest.mark.integration
def test_gateway_refuses_a_superlink_its_ca_did_not_sign(gated, tmp_path):
    """nginx verifies the SuperLink's certificate: with another CA the Fleet call fails (502)."""
    state = gated.federation
    other = pki.ca_load_or_create(tmp_path / "other-pki")
    cert = Path(state.root) / "pki" / "superlink.crt"
    gw = fleet_gateway.gateway_start(
        tmp_path / "gw",
        listen_host="127.0.0.1",
        listen_port=runtime.free_port(),
        upstream_port=int(state.superlink_address.rpartition(":")[2]),
        cert=cert,
        key=cert.with_suffix(".key"),
        ca=Path(other.cert),
    )
    try:
        status, _ = _post(gw.address, state.ca_cert, "/v1/fleet/get-run")
    finally:
        fleet_gateway.gateway_stop(gw.pid)
    assert status == 502
    assert "upstream SSL certificate verify error" in Path(gw.error_log).read_text()


@pytest.mark.integration
def test_a_body_above_the_cap_never_reaches_the_superlink(gated):
    """Over the cap: nginx answers 413 on the declared length, and a chunked body (no length to
    check first) 411; the SuperLink logs no request from that client. A body of exactly the cap
    from another client reaches it (its node authentication answers 401)."""
    state = gated.federation
    cap = fleet_gateway.MAX_BODY_MB * MIB
    over, within = "127.0.0.51", "127.0.0.52"

    with _tls_connect(state.public_address, state.ca_cert, source=over) as sock:
        sock.sendall(
            b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: superlink\r\n"
            b"Content-Type: application/protobuf\r\n"
            b"Content-Length: " + str(cap + 1).encode() + b"\r\n\r\n"
        )
        sock.settimeout(30)
        assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")
    chunked, _ = _post(
        state.public_address,
        state.ca_cert,
        "/v1/fleet/push-object",
        body=iter([b"\0" * 1024]),  # http.client sends an iterable of unknown length chunked
        source=over,
    )
    assert chunked == 411
    status, body = _post(
        state.public_address,
        state.ca_cert,
        "/v1/fleet/push-object",
        body=_push_object_body(cap),
        source=within,
    )
    assert status == 401 and _SUPERLINK_AUTH_REFUSAL in body

    wait_for(
        lambda: _superlink_log_line(state, within), timeout=60, interval=0.2, what="its log line"
    )
    assert _superlink_log_line(state, over) == ""
    access = Path(state.logs["gateway-access"]).read_text().splitlines()
    refused = [line for line in access if line.startswith(f"{over} ")]
    assert [line.split('" ')[1].split()[0] for line in refused] == ["413", "411"]
    assert all(line.endswith(" -") for line in refused)  # no upstream status: never forwarded


@pytest.mark.integration
def test_a_forged_x_forwarded_for_is_replaced_by_the_client_address(gated):
    """The SuperLink's uvicorn takes the client's address from ``X-Forwarded-For`` when the
    gateway (127.0.0.1) sends it: the gateway writes the address it saw, never the client's own."""
    state = gated.federation
    client, forged = "127.0.0.53", "203.0.113.9"
    status, _ = _post(
        state.public_address,
        state.ca_cert,
        "/v1/fleet/get-run",
        headers={"x-forwarded-for": forged},
        source=client,
    )
    assert status == 401
    line = wait_for(
        lambda: _superlink_log_line(state, client), timeout=60, interval=0.2, what="its log line"
    )
    assert "/v1/fleet/get-run" in line and " 401" in line
    assert forged not in Path(state.logs["superlink"]).read_text(errors="replace")
    assert any(
        line.startswith(f"{client} ")
        for line in Path(state.logs["gateway-access"]).read_text().splitlines()
    )


def _gateway_before(gated, root: Path, limits: fleet_gateway.GatewayLimits):
    """Another gateway, with ``limits``, in front of the federation's real SuperLink."""
    state = gated.federation
    cert = Path(state.root) / "pki" / "superlink.crt"
    return fleet_gateway.gateway_start(
        root,
        listen_host="127.0.0.1",
        listen_port=runtime.free_port(),
        upstream_port=int(state.superlink_address.rpartition(":")[2]),
        cert=cert,
        key=cert.with_suffix(".key"),
        ca=Path(state.ca_cert),
        limits=limits,
    )


@pytest.mark.integration
def test_requests_above_the_per_address_limit_are_refused(gated, tmp_path):
    """One address holding its limit of requests in progress (headers sent, body not) gets 503
    for more, while another address still reaches the SuperLink; once it lets go it is served."""
    state = gated.federation
    gw = _gateway_before(
        gated,
        tmp_path / "gw",
        fleet_gateway.GatewayLimits(connections_per_address=3, body_timeout=300),
    )
    greedy, other = "127.0.0.61", "127.0.0.62"

    def status(source: str) -> int:
        return _post(gw.address, state.ca_cert, "/v1/fleet/get-run", source=source)[0]

    held = []
    try:
        for _ in range(3):
            held.append(_tls_connect(gw.address, state.ca_cert, source=greedy))
            held[-1].sendall(_REQUEST_HEAD)  # its body never comes
        # Until nginx has read the held requests' headers a probe passes (401): wait for the 503.
        wait_for(lambda: status(greedy) == 503, timeout=60, interval=0.2, what="a 503")
        assert status(other) == 401
        for sock in held:
            sock.close()
        wait_for(lambda: status(greedy) == 401, timeout=60, interval=0.2, what="the limit freed")
    finally:
        for sock in held:
            sock.close()
        fleet_gateway.gateway_stop(gw.pid)
    assert 'limiting connections by zone "fleet_conn"' in Path(gw.error_log).read_text()


@pytest.mark.integration
def test_requests_above_the_per_address_rate_are_refused(gated, tmp_path):
    """One request a minute and a burst of two: the fourth request in a row from one address is
    refused (503), another address is still served."""
    state = gated.federation
    gw = _gateway_before(
        gated,
        tmp_path / "gw",
        fleet_gateway.GatewayLimits(requests_per_minute=1, request_burst=2),
    )
    try:
        statuses = [
            _post(gw.address, state.ca_cert, "/v1/fleet/get-run", source="127.0.0.63")[0]
            for _ in range(4)
        ]
        other, _ = _post(gw.address, state.ca_cert, "/v1/fleet/get-run", source="127.0.0.64")
    finally:
        fleet_gateway.gateway_stop(gw.pid)
    assert statuses[:3] == [401, 401, 401] and statuses[3] == 503
    assert other == 401


@pytest.mark.integration
@pytest.mark.parametrize(
    "stall",
    ["tls-handshake", "request-header", "request-body", "idle-keepalive"],
)
def test_a_stalled_connection_is_closed_within_the_gateways_timeouts(gated, tmp_path, stall):
    """Timeouts of 2 s (nginx's defaults are 60–75 s): a connection stalled in its TLS
    handshake, its request header or its body, or idle after a response, is closed by the
    gateway well within 30 s."""
    state = gated.federation
    gw = _gateway_before(
        gated,
        tmp_path / "gw",
        fleet_gateway.GatewayLimits(header_timeout=2, body_timeout=2, keepalive_timeout=2),
    )
    host, _, port = gw.address.rpartition(":")
    try:
        if stall == "tls-handshake":
            sock = socket.create_connection((host, int(port)), timeout=30)
        else:
            sock = _tls_connect(gw.address, state.ca_cert)
        with sock:
            if stall == "request-header":
                sock.sendall(_REQUEST_HEAD[:40])
            elif stall == "request-body":
                sock.sendall(_REQUEST_HEAD + b"\0" * 4)
            elif stall == "idle-keepalive":
                sock.sendall(_REQUEST_HEAD.replace(b"Length: 10", b"Length: 0"))
                sock.settimeout(30)
                assert sock.recv(65536).startswith(b"HTTP/1.1 401 ")
            closed = _closed_by_peer(sock, timeout=30)
    finally:
        fleet_gateway.gateway_stop(gw.pid)
    assert closed, stall


@pytest.mark.integration
@pytest.mark.slow
def test_job_from_the_web_form_completes_with_supernodes_behind_the_gateway(gated):
    state = gated.federation
    for site in SITES:
        cmdline = Path(f"/proc/{state.supernodes[site]}/cmdline").read_bytes().split(b"\0")
        assert f"--superlink={state.public_address}".encode() in cmdline, (site, cmdline)
    assert gated.job.status == JobStatus.COMPLETED, gated.job.failure_reason
    assert gated.ok_rounds == {site: list(range(1, ROUNDS + 1)) for site in SITES}
    # The messages went through nginx: both sites pulled and pushed through the gateway.
    access = Path(state.logs["gateway-access"]).read_text()
    for call in ("activate-node", "pull-messages", "push-messages", "pull-object", "push-object"):
        assert f'"POST /v1/fleet/{call} HTTP/1.1" 200' in access, call
