"""The ledger's PostgreSQL triggers fire in every session: ``ENABLE ALWAYS``.

A trigger enabled the default way (``ENABLE``, origin) is skipped by a session that sets
``session_replication_role = replica`` (a superuser's, or a replication role's): a hostile
re-test of issue 9 deleted the newest checkpoint and leaves that way, and ``ledger_verify`` said
"ledger OK". ``ENABLE ALWAYS`` triggers fire in replica sessions too; ``portal.ledger.guards``
reports one that is not.

Only on PostgreSQL; on other databases this migration does nothing.
"""

from django.db import migrations

TRIGGERS = [
    ("portal_ledgerentry", "portal_ledgerentry_append_only"),
    ("portal_ledgerentry", "portal_ledgerentry_no_truncate"),
    ("portal_ledgercheckpoint", "portal_ledgercheckpoint_append_only"),
    ("portal_ledgercheckpoint", "portal_ledgercheckpoint_no_truncate"),
]


def _run(state: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for table, trigger in TRIGGERS:
                schema_editor.execute(f"ALTER TABLE {table} {state} TRIGGER {trigger}")

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0008_site_revoked_at_sitecredential")]

    operations = [migrations.RunPython(_run("ENABLE ALWAYS"), _run("ENABLE"), elidable=False)]
