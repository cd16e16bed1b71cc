"""Whether the database still keeps the ledger append-only: its triggers, as the migrations made
them (``portal.0003``, ``0004``, ``0007``, ``0009``).

Whoever owns the tables can drop, disable, weaken or bypass a trigger, change leaves, and put
the trigger back; only the signed checkpoints and the witnesses' cosignatures detect a change
after the fact (``ledger_verify``). What can be checked in the database is that the guards are
there *now*, so that a guard removed and left removed does not go unsaid (hostile re-tests of
issue 9: a dropped trigger; then one recreated under its own name with ``WHEN 0``, a function
replaced by one that returns ``NULL``, and ``session_replication_role = replica``, which skips
triggers that are not ``ENABLE ALWAYS``).
"""

from __future__ import annotations

import importlib
import re

from django.db import connection

_M0003 = "portal.migrations.0003_ledger_append_only"
_M0004 = "portal.migrations.0004_ledger_append_only_sqlite"
_M0007 = "portal.migrations.0007_ledger_truncate_replace_checkpoints"

#: PostgreSQL: trigger → the function it must call (migrations 0003 and 0007).
PG_TRIGGERS = {
    "portal_ledgerentry_append_only": "portal_ledgerentry_refuse_change",
    "portal_ledgerentry_no_truncate": "portal_ledger_refuse_change",
    "portal_ledgercheckpoint_append_only": "portal_ledger_refuse_change",
    "portal_ledgercheckpoint_no_truncate": "portal_ledger_refuse_change",
}


def _normal(sql: str) -> str:
    """SQL compared without case, runs of blanks, ``IF NOT EXISTS`` and a final ``;``."""
    text = re.sub(r"\s+", " ", sql).strip().rstrip(";").strip().lower()
    return text.replace(" if not exists", "")


def _sqlite_expected() -> dict[str, str]:
    """Trigger name → its CREATE statement (normalised) as migrations 0004 and 0007 made it."""
    out = {}
    for module in (_M0004, _M0007):
        m = importlib.import_module(module)
        for sql in getattr(m, "CREATE", None) or m.SQLITE_CREATE:
            name = re.search(r"create trigger (?:if not exists )?(\w+)", sql, re.IGNORECASE)
            out[name.group(1)] = _normal(sql)
    return out


def _pg_bodies() -> dict[str, str]:
    """Function name → its body (normalised) as migrations 0003 and 0007 made it."""
    out = {}
    for sql in (
        importlib.import_module(_M0003).CREATE,
        importlib.import_module(_M0007).PG_CREATE,
    ):
        for name, body in re.findall(
            r"FUNCTION (\w+)\(\) RETURNS trigger LANGUAGE plpgsql AS \$\$(.*?)\$\$", sql, re.S
        ):
            out[name] = _normal(body)
    return out


def guard_problems() -> tuple[str, ...]:
    """What is wrong with the ledger's append-only triggers, one sentence per trigger (``()``
    when every one is there as its migration made it, or on a database without them).

    SQLite: each trigger exists with its migration's statement (a ``WHEN 0`` added, or another
    body, is a change). PostgreSQL: each trigger exists, is ``ENABLE ALWAYS`` (so
    ``session_replication_role = replica`` does not skip it), calls its function, and the
    function's body is its migration's."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            present = {name: _normal(sql or "") for name, sql in cursor.fetchall()}
        out = []
        for name, sql in _sqlite_expected().items():
            if name not in present:
                out.append(f"{name}: missing")
            elif present[name] != sql:
                out.append(f"{name}: changed from its migration's definition")
        return tuple(out)
    if connection.vendor != "postgresql":
        return ()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.tgname, t.tgenabled, p.proname, p.prosrc FROM pg_trigger t "
            "JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgname = ANY(%s)",
            [list(PG_TRIGGERS)],
        )
        present = {name: (enabled, fn, src) for name, enabled, fn, src in cursor.fetchall()}
    bodies = _pg_bodies()
    out = []
    for name, function in PG_TRIGGERS.items():
        if name not in present:
            out.append(f"{name}: missing")
            continue
        enabled, fn, src = present[name]
        if enabled != "A":
            state = (
                "disabled" if enabled == "D" else "not ENABLE ALWAYS (a replica session skips it)"
            )
            out.append(f"{name}: {state}")
        if fn != function:
            out.append(f"{name}: calls {fn}() instead of {function}()")
        elif _normal(src) != bodies[function]:
            out.append(f"{name}: its function {fn}() was changed from its migration's")
    return tuple(out)
