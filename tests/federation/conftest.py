"""Real parts for federation integration tests: a local Flower federation, a Celery worker on Redis.

``flower_job_world`` (module scope) seeds two hospitals from the demo data with canary values planted
in hospital-a's CSV, ingests them through the site-side ingest, starts a SuperLink and two SuperNodes
on free ports, and a real Celery worker (with beat) that uses the test database and Redis. The portal's
callback endpoint is pytest-django's live server. Everything is stopped and the database flushed after.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as dj_settings
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from demo.seed import ingest_site_dataset
from federation import callbacks, runtime
from federation.models import ComputePool
from portal.models import Institution, ProjectRole, Site
from portal.services import project_create, project_member_add
from sandbox import demo_data
from sandbox import services as sandbox_services
from sandbox.models import Dataset

CANARY_TEXT = "CANARY-ZX81-7f3a9c"
CANARY_NUMBER = "28.1122334455"  # planted as mean_radius of one row (the real maximum is 28.11)
#: The SuperExecs' task poll of the test federations (seconds): Flower's own default, not the
#: product's 0.2 s (``runtime.SUPEREXEC_POLL_SECONDS``, measured in test_runtime.py). CI runs three
#: federations at once on 2 cores; at 0.2 s an idle 3-site federation's SuperExecs and SuperLink
#: took 17 % of a core (measured: 5.0 CPU-s in 30 s), at 1.0 s 5.7 % (1.7 CPU-s), which the
#: ClientApps of the other modules need more than a message needs its 0.4 s.
TEST_SUPEREXEC_POLL = 1.0


@dataclass
class FlowerWorld:
    project: object
    researcher: object
    versions: list
    runtime_root: Path
    worker_log: Path
    sites_dir: Path
    reply_log_dir: Path
    received_log_dir: Path  # <site>.jsonl: every message each site's ClientApp received
    federation: runtime.FederationState
    worker: subprocess.Popen | None = None
    worker_env: dict | None = None

    def worker_start(self) -> subprocess.Popen:
        """Start a (new) Celery worker with embedded beat; it replaces ``self.worker``."""
        self.worker = _worker_start(self.worker_log, self.worker_env, self.runtime_root.parent)
        return self.worker

    def worker_kill(self) -> None:
        """SIGKILL the worker's main process alone, as the OOM killer would."""
        os.kill(self.worker.pid, signal.SIGKILL)
        self.worker.wait(timeout=30)


def _worker_start(log: Path, env: dict, root: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("celery")),
            "-A",
            "portal",
            "worker",
            "-B",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--schedule",
            str(root / "beat-schedule"),
        ],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _plant_number(path: Path) -> None:
    rows = list(csv.reader(path.open(encoding="utf-8")))
    col = rows[0].index("mean_radius")
    rows[2][col] = CANARY_NUMBER
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)


@pytest.fixture(scope="module")
def flower_job_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    """Two hospitals (canaries planted in hospital-a's data), a SuperLink, two SuperNodes, a worker."""
    with flower_world(
        ("hospital-a", "hospital-b"),
        root=tmp_path_factory.mktemp("flower-world"),
        live_server=live_server,
        django_db_blocker=django_db_blocker,
    ) as world:
        yield world


@contextlib.contextmanager
def flower_world(
    slugs,
    *,
    root: Path,
    live_server,
    django_db_blocker,
    env: dict | None = None,
    csvs=None,
    site_netns: dict[str, tuple[str, str]] | None = None,
    superlink_host: str = "127.0.0.1",
    tls_names: list[str] | None = None,
    fleet_gateway_on: bool = False,
):
    """Seed one site per slug (hospital-a's CSV with the canaries, or ``csvs``: slug → a CSV
    file of the caller's), ingest and grant each dataset, start a SuperLink, a SuperNode per site
    and a Celery worker with beat; stop and flush after.

    ``env``: extra environment of the worker (e.g. ``FRP_ROUND_TIMEOUT``). ``site_netns``: slug →
    (network namespace, SuperLink address seen from it): that site's SuperNode runs in its
    namespace (tests/federation/test_multihost_netns.py); the SuperLink then listens on
    ``superlink_host`` with a certificate also naming ``tls_names``, behind a Fleet gateway when
    that is not a loopback address or ``fleet_gateway_on`` (tests/federation/test_fleet_gateway.py)."""
    site_netns = site_netns or {}
    from django.contrib.auth import get_user_model

    saved = {
        k: getattr(dj_settings, k)
        for k in ("FRP_SITES_DIR", "FRP_FLWR_HOME", "FRP_CALLBACK_BASE_URL", "FRP_FEDERATION_DIR")
    }
    dj_settings.FRP_SITES_DIR = root / "sites"
    dj_settings.FRP_FLWR_HOME = root / "flwr-control"
    dj_settings.FRP_CALLBACK_BASE_URL = live_server.url
    dj_settings.FRP_FEDERATION_DIR = root / "federation"

    import redis

    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
    state = world = None
    env_extra = dict(env or {})
    with django_db_blocker.unblock():
        try:
            User = get_user_model()
            researcher = User.objects.create_user("rita", password="pw-for-tests-123")
            steward = User.objects.create_user("steve", password="pw-for-tests-123")
            sites = []
            for slug in slugs:
                inst = Institution.objects.create(slug=f"inst-{slug}", name=f"Institution {slug}")
                site = Site.objects.create(institution=inst, slug=slug, name=slug)
                ComputePool.objects.create(site=site, name="cpu", slots=1)
                sites.append(site)
            project = project_create(
                by=researcher, slug="it", title="Integration", institution=sites[0].institution
            )
            project_member_add(
                by=researcher, project=project, user=steward, role=ProjectRole.MEMBER
            )
            if csvs is not None:
                paths = dict(csvs)
            else:
                paths = demo_data.write_site_csvs(
                    root / "incoming", tuple(slugs), canary=CANARY_TEXT
                )
                if "hospital-a" in paths:
                    _plant_number(paths["hospital-a"])
            versions = []
            for site in sites:
                dv = ingest_site_dataset(
                    site=site, steward=steward, csv_path=paths[site.slug], slug="bc", title="BC"
                )
                req = sandbox_services.access_request_create(
                    by=researcher, dataset=dv.dataset, project=project, purpose="integration test"
                )
                sandbox_services.access_request_approve(
                    by=steward, request=req, expires_at=timezone.now() + timedelta(days=1)
                )
                # The stewards opt in to Shapley values (off by default, ADR 0036): these worlds
                # measure them; test_integration's opt-out job turns one off.
                Dataset.objects.filter(pk=dv.dataset_id).update(shapley_opt_in=True)
                versions.append(dv)
            for p in paths.values():
                p.unlink()
            (root / "received-logs").mkdir()
            state = runtime.start(
                root / "federation",
                [
                    runtime.LocalSite(
                        site=s.slug,
                        store_url=f"file://{dj_settings.FRP_SITES_DIR / s.slug / 'store'}",
                        keyring=str(dj_settings.FRP_SITES_DIR / s.slug / "keyring"),
                        received_log=str(root / "received-logs" / f"{s.slug}.jsonl"),
                        netns=site_netns.get(s.slug, ("", ""))[0],
                        superlink_host=site_netns.get(s.slug, ("", ""))[1],
                    )
                    for s in sites
                ],
                superlink_env=callbacks.serverapp_environment(),
                host=superlink_host,
                tls_names=tls_names,
                fleet_gateway_on=fleet_gateway_on,
                superexec_poll=TEST_SUPEREXEC_POLL,
            )
            runtime.write_state_control_config(
                dj_settings.FRP_FLWR_HOME, dj_settings.FRP_FEDERATION_NAME, state
            )
            db = connection.settings_dict
            env = dict(
                os.environ,
                DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
                FRP_FLWR_HOME=str(dj_settings.FRP_FLWR_HOME),
                FRP_CALLBACK_BASE_URL=live_server.url,
                FRP_RECONCILE_SECONDS="1",
                # The ServerApps pull replies every 0.5 s, not the product's 0.2 s: with three
                # federations on 2 cores the SuperLink's answers cost the ClientApps' CPU.
                FRP_SERVERAPP_POLL_SECONDS="0.5",
                # No periodic ledger checkpoint during a module (its task has its own tests): a
                # worker transaction must not overlap the live server's flush between tests.
                FRP_LEDGER_CHECKPOINT_SECONDS="3600",
                # Nor the accounting sweep (its worker test: tests/accounting/test_steps_worker.py);
                # the job's own hand-off accounts for it.
                FRP_ACCOUNTING_SWEEP_SECONDS="3600",
                FRP_VAR_DIR=str(root / "worker-var"),
                FRP_REPLY_LOG_DIR=str(root / "reply-logs"),
            )
            env.update(env_extra)
            (root / "reply-logs").mkdir()
            world = FlowerWorld(
                project,
                researcher,
                versions,
                root / "federation",
                root / "worker.log",
                root / "sites",
                root / "reply-logs",
                root / "received-logs",
                state,
                worker_env=env,
            )
            world.worker_start()
            yield world
        finally:
            worker = world.worker if world is not None else None
            if worker is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(worker.pid, signal.SIGKILL)
            if state is not None:
                with contextlib.suppress(runtime.RuntimeError_):
                    state = runtime.load_state(Path(state.root))  # pids after any restart
                runtime.stop(state)
            for k, v in saved.items():
                setattr(dj_settings, k, v)
            call_command("flush", interactive=False, verbosity=0)


def wait_for(predicate, *, timeout: float, interval: float = 1.0, what: str = "condition"):
    """Poll ``predicate()`` until truthy or ``timeout`` seconds; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
