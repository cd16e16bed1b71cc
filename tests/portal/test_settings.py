"""The settings module under the deployments' environments (each in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _settings(tmp_path, **env) -> subprocess.CompletedProcess:
    """Import ``portal.settings`` with ``env`` (and nothing else of ours) and print its CACHES."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRP_", "DATABASE_", "CACHE_", "CELERY_"))
    }
    code = "import json, portal.settings as s; print(json.dumps(s.CACHES['default']))"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "FRP_VAR_DIR": str(tmp_path / "var"), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


@pytest.mark.parametrize("value", ["0", "61", "-1"])
def test_a_serverapp_poll_interval_outside_the_run_configs_range_is_refused(tmp_path, value):
    out = _settings(tmp_path, FRP_SERVERAPP_POLL_SECONDS=value)

    assert out.returncode != 0
    assert "FRP_SERVERAPP_POLL_SECONDS must be 0.001–60 s" in out.stderr


def test_embedded_default_uses_the_local_memory_cache(tmp_path):
    out = _settings(tmp_path)

    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["BACKEND"].endswith("LocMemCache")


def test_postgresql_with_redis_shares_one_redis_cache(tmp_path):
    """Issue 9, finding 9: rate limits counted per worker process without a shared cache."""
    out = _settings(
        tmp_path,
        DATABASE_URL="postgres://frp@db:5432/frp",
        CELERY_BROKER_URL="redis://:pw@redis:6379/0",
    )

    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert config["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert config["LOCATION"] == "redis://:pw@redis:6379/0"


def test_compose_cache_url_is_used(tmp_path):
    out = _settings(
        tmp_path,
        DATABASE_URL="postgres://frp@db:5432/frp",
        CELERY_BROKER_URL="redis://:pw@redis:6379/0",
        CACHE_URL="redis://:pw@redis:6379/1",
    )

    assert json.loads(out.stdout)["LOCATION"] == "redis://:pw@redis:6379/1"


@pytest.mark.parametrize("cache_url", [None, "locmemcache://"])
def test_postgresql_refuses_a_per_process_cache(tmp_path, cache_url):
    env = {"DATABASE_URL": "postgres://frp@db:5432/frp", "CELERY_BROKER_URL": "filesystem://"}
    if cache_url:
        env["CACHE_URL"] = cache_url

    out = _settings(tmp_path, **env)

    assert out.returncode != 0 and "set CACHE_URL" in out.stderr


@pytest.mark.parametrize("database_url", ["postgres://frp@db:5432/frp", None])
def test_a_dummy_cache_is_refused_outside_debug(tmp_path, database_url):
    """Hostile re-test, finding 9: ``CACHE_URL=dummycache://`` was accepted with PostgreSQL and
    silently turned the sign-in rate limits off."""
    env = {"CACHE_URL": "dummycache://", "DEBUG": "False", "SECRET_KEY": "x" * 50}
    env["ALLOWED_HOSTS"] = "portal.example.org"
    env["FRP_FIELD_KEY_FILE"] = str(tmp_path / "field.key")  # the checks before the cache's
    if database_url:
        env.update(DATABASE_URL=database_url, CELERY_BROKER_URL="redis://redis:6379/0")

    out = _settings(tmp_path, **env)

    assert out.returncode != 0
    assert "dummycache" in out.stderr and "rate limits" in out.stderr


def test_a_dummy_cache_is_allowed_while_debugging(tmp_path):
    out = _settings(tmp_path, CACHE_URL="dummycache://", DEBUG="True")

    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["BACKEND"].endswith("DummyCache")


@pytest.mark.django_db
def test_failed_sign_ins_are_counted_in_redis(client):
    """The test settings (PostgreSQL) count allauth's sign-in failures in the shared Redis."""
    import redis
    from django.conf import settings

    client.post("/accounts/login/", {"login": "nobody", "password": "wrong-password-1"})

    server = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    prefix = settings.CACHES["default"]["KEY_PREFIX"]
    keys = [k.decode() for k in server.scan_iter(f"{prefix}:*")]
    assert any("rl" in k or "login" in k for k in keys), keys
    server.delete(*keys)  # not cache.clear(): that would flush the Redis database


def test_check_deploy_reports_only_what_the_shipped_proxy_covers(tmp_path):
    """Issue 9, done-when: ``check --deploy`` with the compose environment reports nothing the
    compose nginx does not do itself (HSTS header, HTTP → HTTPS redirect); the README says so."""
    import re
    import secrets

    import yaml
    from cryptography.fernet import Fernet

    env = {
        "DEBUG": "False",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "portal.example.org,web,localhost",
        "CSRF_TRUSTED_ORIGINS": "https://portal.example.org",
        "FRP_BEHIND_TLS_PROXY": "True",
        "DATABASE_URL": "postgres://frp:pw@127.0.0.1:5432/frp",
        "CELERY_BROKER_URL": "redis://:pw@127.0.0.1:6379/0",
        "FRP_LEDGER_SIGNER_KEY": "set",
        "FRP_CALLBACK_KEY": secrets.token_hex(32),
        "FRP_FIELD_KEYS": Fernet.generate_key().decode(),
        "EMAIL_URL": "smtp://mailpit:1025",
        "FRP_CALLBACK_BASE_URL": "https://portal.example.org",  # through the proxy, as in compose
    }
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRP_", "DATABASE_", "CACHE_", "CELERY_", "EMAIL_", "DJANGO_"))
    }
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy"],
        env={**clean, **env, "FRP_VAR_DIR": str(tmp_path / "var")},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )

    reported = set(re.findall(r"\((security\.[WE]\d+)\)", out.stdout + out.stderr))
    assert reported == {"security.W004", "security.W008"}, out.stdout + out.stderr
    nginx = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["configs"]["nginx"]["content"]
    assert 'add_header Strict-Transport-Security "max-age=31536000" always;' in nginx  # W004
    assert "listen 80;" in nginx and "return 301 https://" in nginx  # W008
    readme = (ROOT / "README.md").read_text()
    assert "security.W004" in readme and "security.W008" in readme


def _client_ip_under_compose(tmp_path, xff: str) -> str:
    """The client address allauth's rate limits count, for a request that reached gunicorn
    through compose's nginx (REMOTE_ADDR = nginx's container, X-Forwarded-For = ``xff``)."""
    import secrets

    from cryptography.fernet import Fernet

    env = {  # as test_check_deploy_reports_only_what_the_shipped_proxy_covers
        "DEBUG": "False",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "portal.example.org,web,localhost",
        "CSRF_TRUSTED_ORIGINS": "https://portal.example.org",
        "FRP_BEHIND_TLS_PROXY": "True",  # as docker-compose.yml sets it for web
        "DATABASE_URL": "postgres://frp:pw@127.0.0.1:5432/frp",
        "CELERY_BROKER_URL": "redis://:pw@127.0.0.1:6379/0",
        "FRP_LEDGER_SIGNER_KEY": "set",
        "FRP_CALLBACK_KEY": secrets.token_hex(32),
        "FRP_FIELD_KEYS": Fernet.generate_key().decode(),
        "EMAIL_URL": "smtp://mailpit:1025",
        "FRP_CALLBACK_BASE_URL": "http://web:8000",
        "FRP_CALLBACK_ALLOW_HTTP": "True",
        "FRP_VAR_DIR": str(tmp_path / "var"),
    }
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRP_", "DATABASE_", "CACHE_", "CELERY_", "EMAIL_", "DJANGO_"))
    }
    code = (
        "import django; django.setup(); from django.test import RequestFactory; "
        "from allauth.account.adapter import get_adapter; "
        f"r = RequestFactory().post('/accounts/login/', REMOTE_ADDR='172.18.0.9', "
        f"HTTP_X_FORWARDED_FOR={xff!r}); print(get_adapter().get_client_ip(r))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_behind_compose_nginx_rate_limits_count_each_client_not_the_proxy(tmp_path):
    """Issue 9, finding 9 (hostile re-test): behind nginx every request came from nginx's address,
    so allauth's per-address limits (10 failed sign-ins a minute) were one bucket for all users:
    one visitor's wrong passwords locked every other visitor out. nginx appends the client's
    address to X-Forwarded-For; that last entry is the one counted, and a client's own
    X-Forwarded-For entries before it change nothing."""
    assert _client_ip_under_compose(tmp_path, "203.0.113.7") == "203.0.113.7"
    assert _client_ip_under_compose(tmp_path, "10.9.9.9, 198.51.100.4") == "198.51.100.4"
