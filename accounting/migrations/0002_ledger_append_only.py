"""The ledger is append-only in the database too: PostgreSQL refuses UPDATE and DELETE on its leaves.

A statement-level ``BEFORE UPDATE OR DELETE`` trigger raises SQLSTATE 23001 (restrict_violation,
which Django reports as ``IntegrityError``), so raw SQL and other clients are refused as well as the
ORM (whose own guard is ``accounting.models.LedgerEntryQuerySet``). TRUNCATE is left alone: the test
suite's flush between transactional tests uses it, and only the table's owner may truncate.

Only on PostgreSQL; on other databases (the embedded SQLite default) this migration does nothing.
"""

from django.db import migrations

TABLE = "accounting_ledgerentry"
FUNCTION = "accounting_ledgerentry_refuse_change"
TRIGGER = "accounting_ledgerentry_append_only"

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

DROP = f"""
DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE};
DROP FUNCTION IF EXISTS {FUNCTION}();
"""


def _run(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("accounting", "0001_initial")]

    operations = [migrations.RunPython(_run(CREATE), _run(DROP), elidable=False)]
