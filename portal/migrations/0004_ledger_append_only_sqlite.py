"""The ledger is append-only on SQLite too (the embedded default): triggers refuse UPDATE and DELETE.

Migration 0003 made PostgreSQL refuse changes to ``portal_ledgerentry``; SQLite has no
statement triggers or PL/pgSQL, so here two row triggers ``RAISE(ABORT, …)`` (Django reports it as
``IntegrityError``). As on PostgreSQL, whoever can drop a trigger can still change the file: the
signed checkpoints and witnesses' cosignatures are what detect that (``ledger_verify``).

Only on SQLite; on other databases this migration does nothing.
"""

from django.db import migrations

TABLE = "portal_ledgerentry"

CREATE = [
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_no_{op.lower()} BEFORE {op} ON {TABLE}
    BEGIN SELECT RAISE(ABORT, 'ledger is append-only: {op} on {TABLE} refused'); END;"""
    for op in ("UPDATE", "DELETE")
]
DROP = [f"DROP TRIGGER IF EXISTS {TABLE}_no_{op.lower()};" for op in ("update", "delete")]


def _run(statements: list[str]):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0003_ledger_append_only")]

    operations = [migrations.RunPython(_run(CREATE), _run(DROP), elidable=False)]
