"""Issue 9, finding 8: secrets where they belong.

Reproduced on main: the console e-mail backend wrote password-reset and confirmation links into
``var/logs/web.log`` (compose used it too), ``var/portal.sqlite3`` was 0644, and OIDC client secrets
sat in it in plain text. The embedded default is exercised in fresh interpreters (its settings run
at import) with an empty environment of ours and its own ``FRP_VAR_DIR``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from portal import secretbox, services
from portal.models import IdentityProvider
from tests.factories import InstitutionFactory

ROOT = Path(__file__).parents[2]


def _run(tmp_path, code: str, **env) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRP_", "DATABASE_", "CACHE_", "CELERY_", "EMAIL_", "DJANGO_"))
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        env={
            **clean,
            "FRP_VAR_DIR": str(tmp_path / "var"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "PYTHONPATH": str(ROOT),
            **env,
        },
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_embedded_default_writes_mail_to_a_private_folder_never_to_the_log(tmp_path):
    link = "https://portal.example/accounts/password/reset/key/1-SECRET-RESET-TOKEN/"
    out = _run(
        tmp_path,
        # under the usual umask 022, with which Django's file backend wrote messages 0644
        "import os; os.umask(0o022); import django; django.setup(); "
        "from django.core.mail import send_mail; "
        f"send_mail('Password reset', 'Reset it here: {link}', None, ['ada@example.org'])",
    )

    assert out.returncode == 0, out.stderr
    assert "SECRET-RESET-TOKEN" not in out.stdout + out.stderr  # what a log would have caught
    mail_dir = tmp_path / "var" / "mail"
    (message,) = list(mail_dir.iterdir())
    assert link in message.read_text()
    assert _mode(mail_dir) == 0o700 and _mode(tmp_path / "var") == 0o700
    assert _mode(message) == 0o600  # hostile re-test C: the message itself, too


def test_production_refuses_the_console_mail_backend(tmp_path):
    out = _run(
        tmp_path,
        "import portal.settings",
        DEBUG="False",
        SECRET_KEY="x" * 50,
        FRP_LEDGER_SIGNER_KEY="unused-here",
        FRP_CALLBACK_KEY="k" * 40,
        FRP_FIELD_KEYS="unused-here",
        DATABASE_URL="postgres://frp@db/frp",
        CELERY_BROKER_URL="redis://redis:6379/0",
        EMAIL_BACKEND="django.core.mail.backends.console.EmailBackend",
    )

    assert out.returncode != 0 and "console e-mail backend" in out.stderr


def test_email_url_configures_smtp(tmp_path):
    out = _run(
        tmp_path,
        "import portal.settings as s; print(s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT)",
        EMAIL_URL="smtp://mailpit:1025",
    )

    assert out.stdout.split() == ["django.core.mail.backends.smtp.EmailBackend", "mailpit", "1025"]


def test_sqlite_database_and_its_wal_are_0600_in_a_0700_folder(tmp_path):
    out = _run(
        tmp_path,
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0)",
    )

    assert out.returncode == 0, out.stderr
    var = tmp_path / "var"
    files = sorted(var.glob("portal.sqlite3*"))
    assert [f.name for f in files][:1] == ["portal.sqlite3"]
    assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
    assert _mode(var) == 0o700


def test_an_existing_readable_sqlite_file_is_made_private(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    (var / "portal.sqlite3").touch(mode=0o644)

    out = _run(tmp_path, "import portal.settings")

    assert out.returncode == 0, out.stderr
    assert _mode(var / "portal.sqlite3") == 0o600 and _mode(var) == 0o700


@pytest.mark.django_db
def test_oidc_client_secret_is_sealed_in_the_database(settings, tmp_path):
    from cryptography.fernet import Fernet

    settings.FRP_FIELD_KEYS = [Fernet.generate_key().decode()]
    settings.FRP_OIDC_ALLOWED_HOSTS = ["idp.inst-a.example"]
    idp = services.identity_provider_configure(
        by=None,
        institution=InstitutionFactory(),
        protocol="oidc",
        issuer="https://idp.inst-a.example",
        client_id="portal",
        client_secret="very-secret-client-secret-42",
    )

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.client_secret, a.secret FROM portal_identityprovider i "
            "JOIN socialaccount_socialapp a ON a.id = i.social_app_id WHERE i.id = %s",
            [idp.pk],
        )
        stored, app_secret = cursor.fetchone()
    assert "very-secret" not in stored and stored.startswith("fernet:")
    assert app_secret == ""  # allauth's copy is not kept: the adapter unseals in memory
    assert secretbox.unseal(stored) == "very-secret-client-secret-42"

    from portal.adapters import SocialAccountAdapter

    (app,) = SocialAccountAdapter().list_apps(None, provider=idp.provider_id)
    assert app.secret == "very-secret-client-secret-42"

    settings.FRP_FIELD_KEYS = [Fernet.generate_key().decode()]  # another key opens nothing
    with pytest.raises(secretbox.SecretBoxError, match="does not open"):
        secretbox.unseal(IdentityProvider.objects.get(pk=idp.pk).client_secret)


def test_rotated_keys_still_open_old_secrets(settings):
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FRP_FIELD_KEYS = [old]
    sealed = secretbox.seal("s3cret")
    settings.FRP_FIELD_KEYS = [new, old]

    assert secretbox.unseal(sealed) == "s3cret"
    assert Fernet(new.encode()).decrypt(secretbox.seal("x")[7:].encode()) == b"x"
