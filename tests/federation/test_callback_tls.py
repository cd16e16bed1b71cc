"""The callback link over TLS (issue 13, point 3): the ServerApp's real ``Reporter``
(``frp_flwr.server_app``) posts a signed event to the portal's live server behind HTTPS (a
certificate from the platform CA, ``federation.pki``; ``tests.support.tls_proxy`` terminates
TLS as nginx does in compose), with the callback URL and key the portal itself hands the
ServerApp (``services.job_run_config``, ``callbacks.serverapp_environment``).

An untrusted certificate is refused at once (no retry: it will not verify later), and the
answer says why; the portal records nothing. And the configuration rule: outside ``DEBUG`` the
callback URL must be ``https://`` unless ``FRP_CALLBACK_ALLOW_HTTP`` says otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from federation import callbacks, pki, services
from federation.models import FederatedJob, JobSite, JobStatus, RoundMetric
from frp_flwr import server_app
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
)
from tests.federation.callback_support import event_of
from tests.support.tls_proxy import tls_proxy

ROOT = Path(__file__).parents[2]


@pytest.fixture
def portal_https(transactional_db, live_server, settings, tmp_path):
    """The live server behind HTTPS on 127.0.0.1 (certificate from a fresh platform CA), set as
    the portal's ``FRP_CALLBACK_BASE_URL``; yields ``(base_url, ca)``."""
    ca = pki.ca_create(tmp_path / "pki")
    cert = pki.server_certificate_issue(ca, tmp_path / "pki", name="portal", hosts=["127.0.0.1"])
    host, port = live_server.url.split("://")[1].split(":")
    settings.FRP_CALLBACK_KEY_FILE = tmp_path / "secrets" / "callback.key"
    with tls_proxy(cert=cert.cert, key=cert.key, upstream=(host, int(port))) as url:
        settings.FRP_CALLBACK_BASE_URL = url
        yield url, ca


@pytest.fixture
def running_job():
    from portal.models import ProjectRole

    project = ProjectFactory()
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=pi,
        title="over TLS",
        target_column="label",
        num_rounds=2,
        status=JobStatus.RUNNING,
        flower_run_id="4242",
    )
    for title in ("Cohort Alpha", "Cohort Beta"):
        version = DatasetVersionFactory(dataset__title=title)
        GrantFactory(project=project, dataset=version.dataset)
        JobSite.objects.create(job=job, site=version.dataset.site, dataset_version=version)
    return job


def _round_event(job: FederatedJob):
    sites = {
        js.site.slug: {"ok": True, "train_examples": 40, "eval_examples": 10}
        for js in job.sites.select_related("site")
    }
    return event_of(
        {
            "event": "round",
            "round": 1,
            "train_loss": 0.61,
            "eval_loss": 0.52,
            "eval_accuracy": 0.875,
            "train_examples": 80,
            "wall_seconds": 3.5,
            "sites": sites,
        }
    )


def _reporter(job: FederatedJob) -> server_app.Reporter:
    """The ServerApp's reporter as ``server_app.main`` builds it: the run config the portal
    launches with, the key from the SuperLink's environment as the portal sets it."""
    cfg = services.job_run_config(job)
    return server_app.reporter_for(
        cfg, run_id=int(job.flower_run_id), environ=callbacks.serverapp_environment()
    )


@pytest.fixture
def no_backoff(monkeypatch):
    """Records the reporter's back-off sleeps instead of sleeping (a retry shows as an entry)."""
    slept: list[float] = []
    monkeypatch.setattr(server_app.time, "sleep", slept.append)
    return slept


@pytest.mark.integration
def test_an_event_over_https_verified_with_the_platform_ca_is_recorded(
    portal_https, running_job, monkeypatch, no_backoff
):
    url, ca = portal_https
    monkeypatch.setenv(server_app.CALLBACK_CA_ENV, str(ca.cert))
    reporter = _reporter(running_job)
    assert reporter.url.startswith(url + "/")  # the https URL the portal hands the ServerApp

    answer = reporter.post(_round_event(running_job))

    assert (answer.ok, answer.error, no_backoff) == (True, "", [])
    metric = RoundMetric.objects.get(job=running_job)
    assert (metric.round, metric.eval_accuracy, metric.num_examples) == (1, 0.875, 80)


@pytest.mark.integration
def test_a_certificate_from_another_ca_is_refused_with_a_readable_error(
    portal_https, running_job, monkeypatch, no_backoff, tmp_path, caplog
):
    other = pki.ca_create(tmp_path / "other-ca")
    monkeypatch.setenv(server_app.CALLBACK_CA_ENV, str(other.cert))

    answer = _reporter(running_job).post(_round_event(running_job))

    assert answer.ok is False
    assert "certificate verify failed" in answer.error
    assert str(other.cert) in answer.error and server_app.CALLBACK_CA_ENV in answer.error
    assert "127.0.0.1" in answer.error
    assert no_backoff == []  # not retried: the certificate will not verify on a second try
    assert any("certificate verify failed" in r.getMessage() for r in caplog.records)
    assert not RoundMetric.objects.filter(job=running_job).exists()


@pytest.mark.integration
def test_without_a_ca_file_the_system_trust_store_refuses_the_platform_ca(
    portal_https, running_job, monkeypatch, no_backoff
):
    monkeypatch.delenv(server_app.CALLBACK_CA_ENV, raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)

    answer = _reporter(running_job).post(_round_event(running_job))

    assert answer.ok is False and "certificate verify failed" in answer.error
    assert "system trust store" in answer.error and server_app.CALLBACK_CA_ENV in answer.error
    assert no_backoff == []
    assert not RoundMetric.objects.filter(job=running_job).exists()


def test_an_unreadable_ca_file_is_a_readable_error_not_a_retry(monkeypatch, no_backoff, tmp_path):
    missing = tmp_path / "nope.crt"
    monkeypatch.setenv(server_app.CALLBACK_CA_ENV, str(missing))
    reporter = server_app.Reporter("https://127.0.0.1:9/jobs/callback/1/", b"k" * 32)

    answer = reporter.post(event_of({"event": "failed", "reason": "x"}))

    assert answer.ok is False and str(missing) in answer.error
    assert server_app.CALLBACK_CA_ENV in answer.error
    assert no_backoff == []


# --- the configuration rule ------------------------------------------------------------------


def _settings(tmp_path, **env) -> subprocess.CompletedProcess:
    """Import ``portal.settings`` in a fresh interpreter as a deployment would (DEBUG=False)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRP_", "DATABASE_", "CACHE_", "CELERY_", "DJANGO_"))
    }
    production = {
        "DEBUG": "False",
        "SECRET_KEY": "x" * 50,
        "FRP_LEDGER_SIGNER_KEY": "unused-here",
        "FRP_CALLBACK_KEY": "k" * 64,
        "FRP_FIELD_KEYS": "unused-here",
        "DATABASE_URL": "postgres://frp@db/frp",
        "CELERY_BROKER_URL": "redis://redis:6379/0",
        "EMAIL_URL": "smtp://mailpit:1025",
        "ALLOWED_HOSTS": "portal.example.org",
    }
    return subprocess.run(
        [sys.executable, "-c", "import portal.settings as s; print(s.FRP_CALLBACK_BASE_URL)"],
        env={**clean, **production, "FRP_VAR_DIR": str(tmp_path / "var"), **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_outside_debug_a_plain_http_callback_url_is_refused(tmp_path):
    out = _settings(tmp_path, FRP_CALLBACK_BASE_URL="http://portal.example.org")

    assert out.returncode != 0
    assert "FRP_CALLBACK_BASE_URL" in out.stderr and "https://" in out.stderr
    assert "FRP_CALLBACK_ALLOW_HTTP" in out.stderr


def test_outside_debug_the_default_callback_url_is_refused(tmp_path):
    out = _settings(tmp_path)

    assert out.returncode != 0 and "FRP_CALLBACK_BASE_URL" in out.stderr


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({"FRP_CALLBACK_BASE_URL": "https://portal.example.org"}, "https://portal.example.org"),
        (  # compose: the SuperLink posts to gunicorn on the stack's own network, one host
            {"FRP_CALLBACK_BASE_URL": "http://web:8000", "FRP_CALLBACK_ALLOW_HTTP": "True"},
            "http://web:8000",
        ),
        (
            {"DEBUG": "True", "FRP_CALLBACK_BASE_URL": "http://127.0.0.1:8000"},
            "http://127.0.0.1:8000",
        ),
    ],
    ids=["https", "explicit-http", "debug"],
)
def test_an_https_url_an_explicit_flag_or_debug_is_accepted(tmp_path, env, url):
    out = _settings(tmp_path, **env)

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == url


def test_something_else_than_http_or_https_is_refused_even_while_debugging(tmp_path):
    out = _settings(tmp_path, DEBUG="True", FRP_CALLBACK_BASE_URL="ftp://portal.example.org")

    assert out.returncode != 0 and "FRP_CALLBACK_BASE_URL" in out.stderr
