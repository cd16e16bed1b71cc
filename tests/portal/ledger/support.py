"""Shared helpers of the ledger tests: an isolated signing key per test, raw tampering."""

from __future__ import annotations

import contextlib

from django.db import connection

TABLE = "portal_ledgerentry"
TRIGGER = "portal_ledgerentry_append_only"


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
    """Disable the PostgreSQL append-only trigger (the tests run as the superuser that owns it)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER {TRIGGER}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} ENABLE TRIGGER {TRIGGER}")


def raw_sql(sql: str, params=()) -> None:
    """Run SQL behind the ORM's back, with the append-only trigger disabled."""
    with append_only_trigger_disabled(), connection.cursor() as cursor:
        cursor.execute(sql, params)
