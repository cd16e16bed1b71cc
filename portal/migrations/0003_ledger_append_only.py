"""The ledger is append-only in the database too: PostgreSQL refuses UPDATE and DELETE on its leaves.

A statement-level ``BEFORE UPDATE OR DELETE`` trigger raises SQLSTATE 23001 (restrict_violation,
which Django reports as ``IntegrityError``), so raw SQL and other clients are refused as well as the
ORM (whose own guard is ``portal.ledger.models.LedgerEntryQuerySet``). TRUNCATE is left alone: the test
suite's flush between transactional tests uses it, and only the table's owner may truncate.

It also creates ``portal_ledger_append(kind, data, leaf_hash, created_at)``, the one-round-trip
append the service calls on PostgreSQL (lock, then insert at the next index).

Only on PostgreSQL; on other databases (the embedded SQLite default) this migration does nothing.
"""

from django.db import migrations

TABLE = "portal_ledgerentry"
FUNCTION = "portal_ledgerentry_refuse_change"
TRIGGER = "portal_ledgerentry_append_only"
LOCK_ID = 0x4C454447  # "LEDG": the advisory lock of portal.ledger.services

CREATE = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = 'ledger is append-only: ' || TG_OP || ' on {TABLE} refused',
        ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER {TRIGGER} BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}();
"""

# One round trip per append (portal.ledger.services.ledger_append): take the ledger's
# transaction-scoped advisory lock, then insert at MAX(index) + 1. A VOLATILE PL/pgSQL function
# takes a fresh snapshot per statement, so the MAX read after the lock sees every committed append.
APPEND = f"""
CREATE OR REPLACE FUNCTION portal_ledger_append(
    p_kind varchar, p_data text, p_hash bytea, p_at timestamptz,
    OUT new_id bigint, OUT new_index bigint
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_ID});
    INSERT INTO {TABLE} ("index", kind, data, leaf_hash, created_at)
        SELECT COALESCE(MAX("index") + 1, 0), p_kind, p_data, p_hash, p_at FROM {TABLE}
        RETURNING id, "index" INTO new_id, new_index;
END
$$;
"""

DROP = f"""
DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE};
DROP FUNCTION IF EXISTS {FUNCTION}();
DROP FUNCTION IF EXISTS portal_ledger_append(varchar, text, bytea, timestamptz);
"""


def _run(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0002_user_email_ci_unique")]

    operations = [migrations.RunPython(_run(CREATE + APPEND), _run(DROP), elidable=False)]
