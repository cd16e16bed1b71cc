"""The site tool (frp_site.cli) against the live portal behind real TLS: ingest, key rotate, status,
doctor, and the refusal of plain HTTP. (Enrolment and the SuperNode: tests/frp_site/test_wheel.py.)
"""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest
from django.test import Client
from django.urls import reverse

from federation import pki
from frp_site import cli
from portal.models import Role, Site
from sandbox import demo_data
from sandbox.keyring import SiteKeyring
from sandbox.models import DatasetVersion
from sandbox.storage import store_from_url
from tests.factories import InstitutionFactory, MembershipFactory, UserFactory
from tests.support.tls_proxy import tls_proxy

SITE = "hospital-t"


@pytest.fixture
def kit(transactional_db, live_server, settings, tmp_path):
    """A site's unpacked kit, its portal behind TLS (a certificate from the platform CA)."""
    ca = pki.ca_create(tmp_path / "pki")
    cert = pki.server_certificate_issue(ca, tmp_path / "pki", name="portal", hosts=["127.0.0.1"])
    host, port = live_server.url.split("://")[1].split(":")
    with tls_proxy(cert=cert.cert, key=cert.key, upstream=(host, int(port))) as url:
        settings.FRP_SUPERLINK_PUBLIC_ADDRESS = "127.0.0.1:9"
        settings.FRP_FEDERATION_CA_FILE = ca.cert
        settings.FRP_PORTAL_URL = url
        inst = InstitutionFactory()
        admin = UserFactory()
        MembershipFactory(user=admin, institution=inst, role=Role.INSTITUTION_ADMIN)
        client = Client()
        client.force_login(admin)
        client.post(reverse("portal:institution_sites", args=[inst.slug]), {"slug": SITE})
        zipped = client.post(reverse("sites:kit", args=[SITE])).content
        with zipfile.ZipFile(io.BytesIO(zipped)) as zf:
            zf.extractall(tmp_path / "kit")
        (tmp_path / "kit" / "credential").chmod(0o600)
        yield tmp_path / "kit"


def _run(kit, *args) -> tuple[int, str]:
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(["--kit", str(kit), *args])
    return code, out.getvalue()


def test_ingest_then_key_rotate_through_the_portal(kit, tmp_path):
    csv_path = demo_data.write_site_csvs(tmp_path / "in", (SITE,))[SITE]
    code, out = _run(kit, "ingest", str(csv_path), "--dataset", "bc", "--title", "BC")
    assert code == 0, out
    dv = DatasetVersion.objects.get(dataset__site__slug=SITE)
    store = store_from_url((kit / "store").as_uri())
    assert dv.ciphertext_sha256 == hashlib.sha256(store.get_bytes(dv.store_key)).hexdigest()
    old_kek = SiteKeyring(kit / "keyring").get(SITE)

    code, out = _run(kit, "key", "rotate")
    assert code == 0 and "1 object(s) re-wrapped" in out, out
    dv.refresh_from_db()
    new_bytes = store.get_bytes(dv.store_key)
    assert dv.ciphertext_sha256 == hashlib.sha256(new_bytes).hexdigest()
    ring = SiteKeyring(kit / "keyring")
    assert ring.get(SITE) != old_kek and ring.previous(SITE) == []

    code, out = _run(kit, "status")
    assert code == 0 and '"site": "hospital-t"' in out and '"state": "no key"' in out


def test_doctor_names_what_fails(kit):
    code, out = _run(kit, "doctor")
    assert code == 1
    # A fresh kit: one clear failure for "not enrolled", not one per missing key.
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert fails == [
        "FAIL  not enrolled yet: run `frp-site enroll` (it makes the SuperNode key pair and the "
        "key-encryption key here)",
        fails[1],
    ], out
    assert fails[1].startswith("FAIL  127.0.0.1:9 does not answer TLS"), out
    assert "ok    portal" in out and "accepts site hospital-t" in out
    assert "4 of 6 checks passed" in out


def test_doctor_after_a_partial_enrolment_names_the_missing_key(kit):
    from frp_site import nodekey

    nodekey.key_pair_create(kit / "supernode.key", comment=SITE)  # the KEK is still missing
    code, out = _run(kit, "doctor")
    assert code == 1
    assert "ok    SuperNode key" in out
    assert "FAIL  no key-encryption key in" in out and "not enrolled" not in out, out


def test_documented_order_enrolls_before_doctor():
    """The kit's README and the repository's walkthrough run `enroll` before `doctor`."""
    from pathlib import Path

    from federation import onboarding

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    walkthrough = readme[readme.index("### Walkthrough for an institution") :]
    for text in (onboarding._README, walkthrough):
        assert text.index("frp-site") >= 0
        assert text.index(" enroll") < text.index(" doctor"), text[:400]


def test_plain_http_portal_refused_without_the_development_flag(kit):
    toml = (kit / "site.toml").read_text()
    (kit / "site.toml").write_text(toml.replace('url = "https://', 'url = "http://'))
    code, out = _run(kit, "status")
    assert code == 1 and "plain HTTP" in out


def test_revoked_site_refused(kit):
    from portal.sites import site_revoke

    site_revoke(by=None, site=Site.objects.get(slug=SITE))
    code, out = _run(kit, "status")
    assert code == 1 and "(401)" in out
