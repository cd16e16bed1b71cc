"""Integration: onboarding by site kit against a real SuperLink (TLS, SuperNode authentication on).

The admin adds a site and downloads its kit; the site makes its key pair, uploads only the public
key with the kit's credential, and the portal registers it (``flwr supernode register``). That
SuperNode comes online over TLS; one with a key nobody registered is refused; revoking the site
unregisters it, the SuperLink drops its SuperNode, and the kit's credential stops working. The
admin's panel shows each state as the SuperLink reports it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from federation import runtime, superlink
from federation.models import SiteNode, SiteNodeStatus
from frp_site import nodekey
from portal.models import Role, Site
from tests.factories import InstitutionFactory, MembershipFactory, UserFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "onboarding"


@pytest.fixture(scope="module")
def superlink_world(tmp_path_factory):
    """A SuperLink with TLS and SuperNode authentication, no SuperNode yet."""
    root = tmp_path_factory.mktemp("onboarding")
    state = runtime.start(root / "federation", [])
    assert state.node_auth and state.ca_cert
    home = root / "flwr-control"
    runtime.write_state_control_config(home, FEDERATION, state)
    yield state, home
    runtime.stop(state)


@pytest.fixture
def world(superlink_world, settings, tmp_path):
    state, home = superlink_world
    settings.FRP_FLWR_HOME = home
    settings.FRP_FEDERATION_NAME = FEDERATION
    settings.FRP_SUPERLINK_PUBLIC_ADDRESS = state.superlink_address
    settings.FRP_FEDERATION_CA_FILE = state.ca_cert
    settings.FRP_PORTAL_URL = "https://portal.example.org"
    return state, superlink.Connection(flwr_home=home, federation=FEDERATION, app_dir=tmp_path)


def _nodes(conn) -> dict:
    """The SuperLink's SuperNodes by node id."""
    return {n.node_id: n for n in superlink.nodes_list(conn)}


def _wait(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _admin_client(institution) -> Client:
    user = UserFactory()
    MembershipFactory(user=user, institution=institution, role=Role.INSTITUTION_ADMIN)
    client = Client()
    client.force_login(user)
    return client


def _kit(client, site) -> dict[str, bytes]:
    response = client.post(reverse("sites:kit", args=[site.slug]))
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(response.content)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _supernode(state, site_slug: str, key: Path, root: Path, *, max_retries: int | None = None):
    """Start a SuperNode for ``site_slug`` with ``key`` (not through the runtime's registration)."""
    site = runtime.LocalSite(
        site=site_slug,
        store_url=f"file://{root / 'store'}",
        keyring=str(root / "keyring"),
        auth_key=str(key),
    )
    if max_retries is None:
        runtime.start_supernode(state, site)
        return state.supernodes[site_slug], Path(state.logs[f"supernode-{site_slug}"])
    log = root / "supernode.log"
    from frp_site import supernode

    args = supernode.command(
        state.superlink_address,
        node_config={"site": site_slug},
        ca_cert=state.ca_cert,
        auth_key=key,
        port=runtime.free_port(),
        executable=runtime._bin("flower-supernode"),
        extra=[f"--max-retries={max_retries}"],
    )
    env = runtime._env(root / "home")  # the venv's bin first: it starts flower-superexec by name
    proc = subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, log


@pytest.mark.django_db
def test_kit_enrol_online_revoke(world, tmp_path, django_capture_on_commit_callbacks, eager_celery):
    state, conn = world
    inst = InstitutionFactory()
    client = _admin_client(inst)
    client.post(
        reverse("portal:institution_sites", args=[inst.slug]),
        {"slug": "hospital-k", "name": "Hospital K"},
    )
    site = Site.objects.get(slug="hospital-k")

    # The kit: address, CA, the site's configuration, its credential and the steps; no key.
    kit = _kit(client, site)
    assert sorted(kit) == ["README.md", "ca.crt", "credential", "site.toml"]
    cfg = tomllib.loads(kit["site.toml"].decode())
    assert cfg["site"]["id"] == "hospital-k"
    assert cfg["superlink"]["address"] == state.superlink_address
    assert kit["ca.crt"] == Path(state.ca_cert).read_bytes()
    assert b"PRIVATE KEY" not in b"".join(kit.values())
    token = kit["credential"].decode().strip()

    # The site makes its key pair and sends only the public key, as the site.
    public = nodekey.key_pair_create(tmp_path / "supernode.key", comment="hospital-k")
    api = Client()
    assert (
        api.post(
            reverse("sites:api_supernode_key"),
            json.dumps({"public_key": public}),
            content_type="application/json",
        ).status_code
        == 401
    )
    response = api.post(
        reverse("sites:api_supernode_key"),
        json.dumps({"public_key": public}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 201, response.content
    node_id = response.json()["node_id"]
    assert response.json()["fingerprint"] == nodekey.fingerprint(public)
    assert _nodes(conn)[node_id].status == "registered"
    panel = client.get(reverse("sites:node_state", args=[site.slug])).content.decode()
    assert node_id in panel and "registered" in panel and "never connected" in panel

    # Its SuperNode connects over TLS with that key and comes online.
    _supernode(state, "hospital-k", tmp_path / "supernode.key", tmp_path)
    _wait(lambda: _nodes(conn)[node_id].status == "online", "the SuperNode online")
    status = api.get(reverse("sites:api_status"), HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert status["supernode"]["state"] == "online" and status["supernode"]["last_seen"]
    panel = client.get(reverse("sites:node_state", args=[site.slug])).content.decode()
    assert "online" in panel and "never" not in panel

    # Revoking the site unregisters it: the SuperLink drops its SuperNode, the credential dies.
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("portal:institution_site_revoke", args=[inst.slug, site.slug]))
    assert SiteNode.objects.get(node_id=node_id).status == SiteNodeStatus.UNREGISTERED
    assert _nodes(conn)[node_id].status == "unregistered"
    pid = state.supernodes["hospital-k"]
    _wait(lambda: not runtime._alive(pid) or _reaped(pid), "the revoked SuperNode to stop")
    assert (
        api.get(reverse("sites:api_status"), HTTP_AUTHORIZATION=f"Bearer {token}").status_code
        == 401
    )


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


@pytest.mark.django_db
def test_unregistered_supernode_refused(world, tmp_path):
    state, conn = world
    before = set(_nodes(conn))
    nodekey.key_pair_create(tmp_path / "rogue.key")
    proc, log = _supernode(state, "rogue", tmp_path / "rogue.key", tmp_path, max_retries=2)
    try:
        assert proc.wait(timeout=180) != 0
    finally:
        proc.kill()
    assert "Failed to activate SuperNode" in log.read_text()
    assert set(_nodes(conn)) == before  # nothing new joined


@pytest.mark.django_db
def test_bad_keys_refused_before_the_superlink(world):
    from portal.sites import site_credential_issue
    from tests.factories import SiteFactory

    site = SiteFactory()
    token = site_credential_issue(by=None, site=site)
    api = Client()
    for body, message in (
        (b"not json", "send JSON"),
        (json.dumps({"public_key": 3}).encode(), "must be a string"),
        (json.dumps({"public_key": "ssh-rsa AAAAB3NzaC1yc2E"}).encode(), "OpenSSH"),
    ):
        response = api.post(
            reverse("sites:api_supernode_key"),
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert response.status_code == 400 and message in response.json()["error"]
    assert not SiteNode.objects.exists()
