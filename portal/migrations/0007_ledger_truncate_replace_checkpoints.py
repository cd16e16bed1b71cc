"""The ledger's append-only guard closes the bypasses a hostile re-test found (issue 9, finding 10).

- **SQLite ``INSERT OR REPLACE``** (10a): REPLACE conflict resolution deletes the clashing rows
  without firing DELETE triggers (``recursive_triggers`` is off), so it rewrote a leaf in place and
  shortened the ledger. A ``BEFORE INSERT`` trigger now refuses a leaf whose id or index exists, or
  whose index is not the next one (``MAX(index) + 1``); a checkpoint whose id or size exists is
  refused the same way. It fires for every client of the file, not only Django's connections.
- **PostgreSQL ``TRUNCATE``** (10b): the app's role owns the tables, so it could truncate the
  leaves and insert a shorter ledger. A statement-level ``BEFORE TRUNCATE`` trigger now refuses it
  (SQLSTATE 23001). The test suite's flush between transactional tests disables the trigger for
  its own TRUNCATE (``tests/conftest.py``; only the table's owner can).
- **Checkpoints** get the same guard as leaves on both databases: UPDATE, DELETE (and TRUNCATE on
  PostgreSQL) are refused.

Whoever can drop or disable a trigger (the tables' owner) can still change the tables: only a
witness's cosigned checkpoint detects that (README, ``ledger_verify``).
"""

from django.db import migrations

LEAVES = "portal_ledgerentry"
CHECKPOINTS = "portal_ledgercheckpoint"
FUNCTION = "portal_ledger_refuse_change"

PG_CREATE = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = 'ledger is append-only: ' || TG_OP || ' on ' || TG_TABLE_NAME || ' refused',
        ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER {LEAVES}_no_truncate BEFORE TRUNCATE ON {LEAVES}
    FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}();
CREATE TRIGGER {CHECKPOINTS}_append_only BEFORE UPDATE OR DELETE ON {CHECKPOINTS}
    FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}();
CREATE TRIGGER {CHECKPOINTS}_no_truncate BEFORE TRUNCATE ON {CHECKPOINTS}
    FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}();
"""
PG_DROP = f"""
DROP TRIGGER IF EXISTS {LEAVES}_no_truncate ON {LEAVES};
DROP TRIGGER IF EXISTS {CHECKPOINTS}_append_only ON {CHECKPOINTS};
DROP TRIGGER IF EXISTS {CHECKPOINTS}_no_truncate ON {CHECKPOINTS};
DROP FUNCTION IF EXISTS {FUNCTION}();
"""

SQLITE_CREATE = [
    f"""CREATE TRIGGER IF NOT EXISTS {LEAVES}_insert_next BEFORE INSERT ON {LEAVES}
    WHEN EXISTS (SELECT 1 FROM {LEAVES} WHERE id = NEW.id OR "index" = NEW."index")
      OR NEW."index" IS NOT (SELECT COALESCE(MAX("index") + 1, 0) FROM {LEAVES})
    BEGIN SELECT RAISE(ABORT,
      'ledger is append-only: INSERT of an existing or out-of-sequence leaf on {LEAVES} refused');
    END;""",
    f"""CREATE TRIGGER IF NOT EXISTS {CHECKPOINTS}_insert_new BEFORE INSERT ON {CHECKPOINTS}
    WHEN EXISTS (SELECT 1 FROM {CHECKPOINTS} WHERE id = NEW.id OR size = NEW.size)
    BEGIN SELECT RAISE(ABORT,
      'ledger is append-only: INSERT of an existing checkpoint on {CHECKPOINTS} refused');
    END;""",
] + [
    f"""CREATE TRIGGER IF NOT EXISTS {CHECKPOINTS}_no_{op.lower()} BEFORE {op} ON {CHECKPOINTS}
    BEGIN SELECT RAISE(ABORT, 'ledger is append-only: {op} on {CHECKPOINTS} refused'); END;"""
    for op in ("UPDATE", "DELETE")
]
SQLITE_DROP = [
    f"DROP TRIGGER IF EXISTS {LEAVES}_insert_next;",
    f"DROP TRIGGER IF EXISTS {CHECKPOINTS}_insert_new;",
    f"DROP TRIGGER IF EXISTS {CHECKPOINTS}_no_update;",
    f"DROP TRIGGER IF EXISTS {CHECKPOINTS}_no_delete;",
]


def _run(postgresql: str, sqlite: list[str]):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            schema_editor.execute(postgresql)
        elif vendor == "sqlite":
            for sql in sqlite:
                schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0006_audit_institution_newest_index")]

    operations = [
        migrations.RunPython(
            _run(PG_CREATE, SQLITE_CREATE), _run(PG_DROP, SQLITE_DROP), elidable=False
        )
    ]
