"""The Fleet gateway (``federation/fleet_gateway.py``, ADR 0033) in front of a real SuperLink.

flwr 1.42 serves Fleet, Control and runtime APIs on one port; a federation that other hosts reach
publishes only nginx, which forwards ``POST /v1/fleet/…`` and refuses the rest. Here the gateway
runs in front of the loopback SuperLink of a real two-site federation (``flower_world`` with
``fleet_gateway_on``): requests through the public address reach the Fleet API and nothing else,
the portal's own Control client works on the loopback address and fails on the public one, and a
job submitted through the web form completes with both SuperNodes dialling the gateway.
"""

from __future__ import annotations

import http.client
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from federation import fleet_gateway, pki, runtime, superlink
from federation.models import FederatedJob, JobStatus, SiteRoundMetric
from tests.federation.conftest import flower_world, wait_for

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


def test_start_without_nginx_names_the_package_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(fleet_gateway, "NGINX_SBIN", tmp_path / "no-nginx")

    with pytest.raises(runtime.RuntimeError_, match=r"install Debian's package `nginx`"):
        runtime.start(tmp_path / "federation", [], host="0.0.0.0")  # noqa: S104

    assert not (tmp_path / "federation" / "superlink.db").exists()


def test_insecure_federation_reached_from_other_hosts_is_refused(tmp_path):
    with pytest.raises(runtime.RuntimeError_, match="TLS only"):
        runtime.start(tmp_path / "federation", [], host="0.0.0.0", insecure=True)  # noqa: S104


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


def _post(address: str, cafile: str, path: str, method: str = "POST") -> tuple[int, bytes]:
    """One request with the request line exactly as given (no client-side normalisation)."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPSConnection(
        host, int(port), context=ssl.create_default_context(cafile=cafile), timeout=30
    )
    try:
        conn.request(method, path, body=b"", headers={"content-type": "application/protobuf"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


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
