"""Shared helpers of the ledger tests: an isolated signing key per test, raw tampering."""

from __future__ import annotations

import contextlib

from django.db import connection

TABLE = "portal_ledgerentry"
TRIGGER = "portal_ledgerentry_append_only"
#: Every append-only trigger on the ledger's tables (migrations 0003 and 0007), table → triggers.
TRIGGERS = {
    TABLE: (TRIGGER, "portal_ledgerentry_no_truncate"),
    "portal_ledgercheckpoint": (
        "portal_ledgercheckpoint_append_only",
        "portal_ledgercheckpoint_no_truncate",
    ),
}


def isolated_ledger_key(settings, tmp_path):
    """A fresh key file per test (created on first use) and a fixed origin; returns the path.

    Each ledger test module wraps this in its own ``ledger_key`` fixture.
    """
    settings.FRP_LEDGER_SIGNER_KEY = ""
    settings.FRP_LEDGER_KEY_FILE = tmp_path / "ledger" / "signer.key"
    settings.FRP_LEDGER_ORIGIN = "portal.example.org/ledger"
    return settings.FRP_LEDGER_KEY_FILE


@contextlib.contextmanager
def append_only_trigger_disabled():
    """Disable the PostgreSQL append-only triggers of leaves and checkpoints (the tests run as the
    superuser that owns them)."""

    def switch(state: str) -> None:
        with connection.cursor() as cursor:
            # Deferred foreign-key checks of the tampering (a deleted checkpoint) run first:
            # PostgreSQL refuses ALTER TABLE while trigger events are pending.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for table, triggers in TRIGGERS.items():
                for trigger in triggers:
                    cursor.execute(f"ALTER TABLE {table} {state} TRIGGER {trigger}")

    switch("DISABLE")
    try:
        yield
    finally:
        switch("ENABLE ALWAYS")  # as migration 0009 leaves them


def raw_sql(sql: str, params=()) -> None:
    """Run SQL behind the ORM's back, with the append-only triggers disabled."""
    with append_only_trigger_disabled(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def sqlite_env(tmp_path) -> dict:
    """The environment of a ``manage.py`` on the SQLite ledger of :func:`sqlite_ledger`."""
    import os

    return {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'portal.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "FRP_VAR_DIR": str(tmp_path / "var"),
        "FRP_LEDGER_SIGNER_KEY": "",
        "FRP_LEDGER_KEY_FILE": str(tmp_path / "signer.key"),
    }


def sqlite_ledger(tmp_path, leaves: int):
    """A real ``migrate`` on a fresh SQLite file, ``leaves`` appended through the service (its
    one-statement batches and single appends) with checkpoints; returns a ``sqlite3`` connection."""
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    db = tmp_path / "portal.sqlite3"
    env = sqlite_env(tmp_path)
    manage = Path(__file__).parents[3] / "manage.py"
    subprocess.run(
        [sys.executable, str(manage), "migrate", "--noinput", "-v0"], env=env, check=True
    )
    code = (
        "from portal.ledger.services import ledger_append, ledger_append_many, "
        "ledger_checkpoint_create as c\n"
        f"ledger_append_many(entries=[('usage', {{'job': i}}) for i in range({leaves - 1})]); c()\n"
        f"ledger_append(kind='usage', record={{'job': {leaves - 1}}}); c()\n"
    )
    subprocess.run([sys.executable, str(manage), "shell", "-c", code], env=env, check=True)
    return sqlite3.connect(db)
