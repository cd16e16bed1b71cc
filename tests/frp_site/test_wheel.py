"""The site package: built as a wheel, installed in a fresh venv without Django, joins a real job.

The wheel (``scripts/build_site_wheel.py``) goes into a new virtual environment that has no Django.
There, with a kit downloaded from the portal, the site tool (``frp-site``) makes its key
pair and sends only the public key (``enroll``), checks its host (``doctor``), encrypts a CSV with
its own key and registers only its metadata (``ingest``), and runs its SuperNode (``supernode``,
TLS and node authentication). The portal (test database, live server behind a TLS front, a real
Celery worker) runs a real job on that site and two local ones; it completes, and the wheel's site
trained in every round. The portal's database never held the site's key.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as dj_settings
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from federation import pki, runtime, services, superlink
from federation.models import ComputePool, FederatedJob, JobStatus, SiteRoundMetric
from portal.models import Membership, Role, Site
from sandbox import demo_data
from sandbox import services as sandbox_services
from sandbox.models import DatasetVersion
from tests.federation.conftest import flower_world, wait_for
from tests.support.tls_proxy import tls_proxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SITE = "hospital-w"
ROUNDS = 2


def _nodes(conn) -> dict:
    """The SuperLink's SuperNodes by node id."""
    return {n.node_id: n for n in superlink.nodes_list(conn)}


def _run(args, *, env=None, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def site_venv(tmp_path_factory) -> Path:
    """A fresh venv with only the site wheel (and its dependencies) installed."""
    root = tmp_path_factory.mktemp("site-venv")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_site_wheel
    finally:
        sys.path.pop(0)
    wheel = build_site_wheel.build(root / "dist")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)])
    return venv


def test_wheel_has_no_django_and_imports(site_venv):
    py = str(site_venv / "bin" / "python")
    no_django = subprocess.run([py, "-c", "import django"], capture_output=True, check=False)
    assert no_django.returncode != 0
    modules = [
        "frp_site.cli",
        "frp_site.portal_api",
        "frp_flwr.client_app",
        "frp_flwr.server_app",
        "sandbox.ingest",
        "sandbox.loader",
        "sandbox.keyring",
    ]
    code = f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; " + (
        "assert 'django' not in sys.modules"
    )
    _run([py, "-c", code])
    assert (site_venv / "bin" / "frp-site").exists()
    assert (site_venv / "bin" / "flower-supernode").exists()


@pytest.fixture(scope="module")
def wheel_world(site_venv, django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("wheel-world"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as world:
        yield world


def test_site_from_kit_joins_a_real_job(site_venv, wheel_world, django_db_blocker, tmp_path):
    w = wheel_world
    state = w.federation
    tls = pki.server_certificate_issue(
        pki.CertificateAuthority(
            cert=Path(state.ca_cert), key=Path(state.ca_cert).with_name("ca.key")
        ),
        tmp_path / "portal-tls",
        name="portal",
        hosts=["127.0.0.1"],
    )
    host, port = w_live(live_server_url=dj_settings.FRP_CALLBACK_BASE_URL)
    frp_site = str(site_venv / "bin" / "frp-site")
    env = {
        "PATH": f"{site_venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    supernode = None
    with tls_proxy(cert=tls.cert, key=tls.key, upstream=(host, port)) as portal_url:
        saved = {
            k: getattr(dj_settings, k)
            for k in ("FRP_SUPERLINK_PUBLIC_ADDRESS", "FRP_FEDERATION_CA_FILE", "FRP_PORTAL_URL")
        }
        dj_settings.FRP_SUPERLINK_PUBLIC_ADDRESS = state.superlink_address
        dj_settings.FRP_FEDERATION_CA_FILE = Path(state.ca_cert)
        dj_settings.FRP_PORTAL_URL = portal_url
        try:
            with django_db_blocker.unblock():
                inst = w.versions[0].dataset.site.institution
                admin = w.researcher.__class__.objects.create_user("ina", password="pw-123456!")
                Membership.objects.create(user=admin, institution=inst, role=Role.INSTITUTION_ADMIN)
                client = Client()
                client.force_login(admin)
                client.post(
                    reverse("portal:institution_sites", args=[inst.slug]),
                    {"slug": SITE, "name": "Hospital W"},
                )
                site = Site.objects.get(slug=SITE)
                ComputePool.objects.create(site=site, name="cpu", slots=1)
                kit_zip = client.post(reverse("sites:kit", args=[SITE])).content
            kit = tmp_path / "kit"
            with zipfile.ZipFile(io.BytesIO(kit_zip)) as zf:
                zf.extractall(kit)

            # On the site's host: enrol (key pair made here, public key sent), ingest, doctor.
            out = _run([frp_site, "--kit", str(kit), "enroll"], env=env).stdout
            assert "registered SuperNode" in out
            csv_path = demo_data.write_site_csvs(tmp_path / "incoming", (SITE,))[SITE]
            out = _run(
                [
                    frp_site,
                    "--kit",
                    str(kit),
                    "ingest",
                    str(csv_path),
                    "--dataset",
                    "bc",
                    "--title",
                    "BC",
                ],
                env=env,
            ).stdout
            assert f"Registered {SITE}/bc version 1" in out
            doctor = _run([frp_site, "--kit", str(kit), "doctor"], env=env).stdout
            assert "7 of 7 checks passed" in doctor, doctor

            # Its SuperNode, from the wheel's venv, dials the SuperLink over TLS with its key.
            cmd = json.loads(
                _run([frp_site, "--kit", str(kit), "supernode", "--print"], env=env).stdout
            )
            assert cmd[0] == str(site_venv / "bin" / "flower-supernode")
            log = tmp_path / "supernode.log"
            supernode = subprocess.Popen(
                [frp_site, "--kit", str(kit), "supernode", "--port", str(runtime.free_port())],
                env=env,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with django_db_blocker.unblock():
                node_id = site.supernodes.get().node_id
                conn = services.superlink_connection()
                wait_for(
                    lambda: _nodes(conn)[node_id].status == "online",
                    timeout=180,
                    what="the wheel's SuperNode online",
                )
                dv = DatasetVersion.objects.get(dataset__site=site)
                assert dv.row_count > 0 and len(dv.ciphertext_sha256) == 64
                steward = w.researcher.__class__.objects.get(username="steve")
                Membership.objects.create(user=steward, institution=inst, role=Role.DATA_STEWARD)
                req = sandbox_services.access_request_create(
                    by=w.researcher, dataset=dv.dataset, project=w.project, purpose="wheel test"
                )
                sandbox_services.access_request_approve(
                    by=steward, request=req, expires_at=timezone.now() + timedelta(days=1)
                )
                job = services.job_submit(
                    by=w.researcher,
                    project=w.project,
                    dataset_versions=[*w.versions, dv],
                    title="with a site from its kit",
                    target_column="diagnosis",
                    num_rounds=ROUNDS,
                    local_epochs=1,
                    learning_rate=0.1,
                )

                def done():
                    j = FederatedJob.objects.get(pk=job.pk)
                    return j if j.is_terminal else None

                job = wait_for(done, timeout=600, what="the job to finish")
                assert job.status == JobStatus.COMPLETED, job.failure_reason
                rounds = sorted(
                    SiteRoundMetric.objects.filter(
                        job_site__job=job, job_site__site=site, ok=True
                    ).values_list("round", flat=True)
                )
                assert rounds == list(range(1, ROUNDS + 1))
                # The site's key never reached the portal: in no row of its database.
                kek = (kit / "keyring" / f"{SITE}.kek").read_bytes()
                dump = io.StringIO()
                call_command("dumpdata", stdout=dump)
                for form in (kek.hex(), base64.b64encode(kek).decode()):
                    assert form not in dump.getvalue()
        finally:
            if supernode is not None:
                os.killpg(supernode.pid, signal.SIGTERM)
                supernode.wait(timeout=30)
            for k, v in saved.items():
                setattr(dj_settings, k, v)


def w_live(*, live_server_url: str) -> tuple[str, int]:
    """The live server's host and port from its URL."""
    hostport = live_server_url.split("://", 1)[1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    return host, int(port)
