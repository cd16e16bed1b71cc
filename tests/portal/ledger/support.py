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
        switch("ENABLE")


def raw_sql(sql: str, params=()) -> None:
    """Run SQL behind the ORM's back, with the append-only triggers disabled."""
    with append_only_trigger_disabled(), connection.cursor() as cursor:
        cursor.execute(sql, params)
