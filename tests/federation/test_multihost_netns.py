"""Integration: sites on their own hosts, one Linux network namespace per site host.

The test makes three namespaces, each joined to the portal's host (the test's own namespace: the
live server, PostgreSQL, Redis, the Celery worker and the SuperLink) by its own veth pair, and
captures every packet on those links with tcpdump. Each site's SuperNode runs inside its namespace
with its own store, keyring and authentication key and dials the SuperLink across its veth (TLS,
node authentication). A real job is submitted through the web form and completes at all three
sites. Then:

- the residency canaries planted in hospital-a's rows appear nowhere that reached the portal's
  host: the SuperLink's database, the portal's database, the logs, the replies and the capture;
- the capture holds TLS records and no plaintext of the job: no run-config key, no column name,
  no canary;
- a SuperNode with a key the portal never registered, started in a site's namespace, is refused;
- from a site's namespace only the Fleet gateway answers (ADR 0033): the Control API at the
  published address is refused (``flwr ls`` fails, a Control path gets the gateway's 404) while
  the same ``flwr ls`` on the portal's host succeeds, and the SuperLink's own port (loopback on the
  portal's host) is unreachable.

Needs root (``ip netns``) and tcpdump (Debian's); skipped where either is missing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from federation import runtime
from federation.models import FederatedJob, JobStatus, SiteRoundMetric
from frp_site import nodekey, supernode
from tests.federation.conftest import CANARY_NUMBER, CANARY_TEXT, flower_world, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tcpdump"),
        reason="needs root, iproute2 and tcpdump",
    ),
]

SITES = ("hospital-a", "hospital-b", "hospital-c")
ROUNDS = 2
_TAG = f"{os.getpid() % 10000:04d}"
_NET = 20 + os.getpid() % 200  # 10.<_NET>.<i>.0/24 per site: unlikely to meet another run's


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def site_hosts():
    """One namespace per site joined by a veth pair; yields slug → (namespace, portal-side IP)."""
    made: list[tuple[str, str]] = []
    hosts = {}
    try:
        for i, slug in enumerate(SITES, start=1):
            ns, outer, inner = f"frp{_TAG}-{i}", f"fv{_TAG}{i}p", f"fv{_TAG}{i}s"
            _ip("netns", "add", ns)
            made.append((ns, outer))
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("addr", "add", f"10.{_NET}.{i}.1/24", "dev", outer)
            _ip("link", "set", outer, "up")
            _ip("addr", "add", f"10.{_NET}.{i}.2/24", "dev", inner, netns=ns)
            _ip("link", "set", inner, "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)
            hosts[slug] = (ns, f"10.{_NET}.{i}.1")
        yield hosts
    finally:
        for ns, outer in made:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", outer)
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", ns)


@pytest.fixture(scope="module")
def netns_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("netns-world")
    with site_hosts() as hosts:
        capture = root / "veth.pcap"
        tcpdump = subprocess.Popen(
            ["tcpdump", "-i", "any", "-U", "-w", str(capture), "net", f"10.{_NET}.0.0/16"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda: capture.exists(), timeout=30, interval=0.2, what="tcpdump to start")
        try:
            with flower_world(
                SITES,
                root=root,
                live_server=live_server,
                django_db_blocker=django_db_blocker,
                site_netns=hosts,
                superlink_host="0.0.0.0",  # noqa: S104 — every veth; the test's own namespace
                tls_names=[ip for _, ip in hosts.values()],
            ) as world:
                yield world, hosts, capture, tcpdump
        finally:
            tcpdump.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                tcpdump.wait(timeout=20)
            if tcpdump.poll() is None:
                tcpdump.kill()


@pytest.fixture(scope="module")
def finished(netns_world, django_db_blocker):
    world, hosts, capture, tcpdump = netns_world
    with django_db_blocker.unblock():
        client = Client()
        client.force_login(world.researcher)
        response = client.post(
            reverse("federation:job_create"),
            {
                "title": "three hosts",
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
        rounds = {
            slug: sorted(
                SiteRoundMetric.objects.filter(
                    job_site__job=job, job_site__site__slug=slug, ok=True
                ).values_list("round", flat=True)
            )
            for slug in SITES
        }
        dump = io.StringIO()
        call_command("dumpdata", stdout=dump)
    return job, rounds, dump.getvalue(), capture, hosts, world


def test_job_from_the_web_form_completes_at_three_hosts(finished):
    job, rounds, *_ = finished
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert rounds == {slug: list(range(1, ROUNDS + 1)) for slug in SITES}


def test_supernodes_ran_in_their_namespaces(finished):
    *_, hosts, world = finished
    for slug, (ns, _) in hosts.items():
        pid = world.federation.supernodes[slug]
        ours = os.readlink("/proc/self/ns/net")
        theirs = os.readlink(f"/proc/{pid}/ns/net")
        assert theirs != ours, slug
        listed = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, check=True
        ).stdout.split()
        assert str(pid) in listed, slug


def test_canaries_never_reached_the_portals_host(finished):
    job, rounds, dump, capture, hosts, world = finished
    places = {"portal database": dump.encode()}
    fed = Path(world.federation.root)
    places["superlink database"] = (fed / "superlink.db").read_bytes()
    for wal in fed.glob("superlink.db-*"):
        places[wal.name] = wal.read_bytes()
    places["superlink log"] = Path(world.federation.logs["superlink"]).read_bytes()
    places["worker log"] = world.worker_log.read_bytes()
    for name in ("gateway", "gateway-access"):
        places[f"{name} log"] = Path(world.federation.logs[name]).read_bytes()
    for path in world.reply_log_dir.glob("*"):
        places[f"reply log {path.name}"] = path.read_bytes()
    places["veth capture"] = capture.read_bytes()
    for where, data in places.items():
        for canary in (CANARY_TEXT, CANARY_NUMBER):
            assert canary.encode() not in data, f"{canary} in {where}"


def test_capture_is_tls_without_plaintext(finished):
    *_, capture, hosts, world = finished
    data = capture.read_bytes()
    assert len(data) > 20_000  # three sites, two rounds: models went both ways
    assert b"\x16\x03\x01" in data or b"\x16\x03\x03" in data  # TLS handshake records
    for plain in (
        b"job-spec",
        b"num-rounds",
        b"mean_radius",
        b"diagnosis",
        b"hospital-a",
        b"HTTP/1.1",
    ):
        assert plain not in data, plain


def test_unregistered_supernode_refused_from_a_site_host(finished, tmp_path):
    *_, hosts, world = finished
    ns, ip = hosts["hospital-b"]
    nodekey.key_pair_create(tmp_path / "rogue.key")
    state = world.federation
    port = state.public_address.rpartition(":")[2]
    args = supernode.command(
        f"{ip}:{port}",
        node_config={"site": "hospital-b"},
        ca_cert=state.ca_cert,
        auth_key=tmp_path / "rogue.key",
        port=runtime.free_port(),
        executable=runtime._bin("flower-supernode"),
        extra=["--max-retries=2"],
    )
    log = tmp_path / "rogue.log"
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, *args],
        env=runtime._env(tmp_path / "home"),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert proc.wait(timeout=300) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Failed to activate SuperNode" in log.read_text()


def _in_netns(ns: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


_PROBE = """
import http.client, json, socket, ssl, sys
ip, public, direct, ca = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {}
def post(path):
    c = http.client.HTTPSConnection(ip, public, context=ssl.create_default_context(cafile=ca), timeout=30)
    c.request("POST", path, body=b"", headers={"content-type": "application/protobuf"})
    r = c.getresponse()
    return [r.status, r.read().decode(errors="replace")[:300]]
out["fleet"] = post("/v1/fleet/get-run")
out["control"] = post("/v1/control/list-runs")
out["runtime"] = post("/v1/runtime/pull-app-inputs")
for name, port in (("public_port", public), ("superlink_port", direct)):
    try:
        socket.create_connection((ip, port), timeout=10).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


def _flwr_ls(home: Path, address: str, ca: str, ns: str | None) -> dict:
    """``flwr ls`` (the real CLI) against ``address``, from namespace ``ns`` or from here."""
    runtime.write_control_config(home, "probe", address, root_certificates=ca)
    env = runtime._env(home)
    cmd = [runtime._bin("flwr"), "ls", "probe", "--format", "json"]
    done = (
        _in_netns(ns, *cmd, env=env)
        if ns
        else subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    )
    return json.loads(done.stdout)


def test_only_the_fleet_gateway_answers_a_site_host(finished):
    *_, hosts, world = finished
    ns, ip = hosts["hospital-c"]
    state = world.federation
    public = state.public_address.rpartition(":")[2]
    direct = state.superlink_address.rpartition(":")[2]
    assert state.superlink_address.startswith("127.0.0.1:")

    done = _in_netns(ns, sys.executable, "-c", _PROBE, ip, public, direct, state.ca_cert)

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["public_port"] == "connected"
    assert seen["superlink_port"] == "ConnectionRefusedError"
    # Fleet reaches the SuperLink (its node authentication answers); the rest is the gateway's.
    assert seen["fleet"][0] == 401 and "Invalid SuperNode authentication" in seen["fleet"][1]
    for api in ("control", "runtime"):
        assert seen[api][0] == 404 and "nginx" in seen[api][1], (api, seen[api])


def test_flwr_ls_fails_from_a_site_host_and_works_on_the_portals(finished, tmp_path):
    *_, hosts, world = finished
    ns, ip = hosts["hospital-a"]
    state = world.federation
    public = f"{ip}:{state.public_address.rpartition(':')[2]}"

    from_site = _flwr_ls(tmp_path / "site", public, state.ca_cert, ns)
    from_portal = _flwr_ls(tmp_path / "portal", state.superlink_address, state.ca_cert, None)

    assert from_site["success"] is False, from_site
    assert from_portal["success"] is True, from_portal
    assert from_portal["runs"], from_portal  # the job's run, seen only from the portal's host
