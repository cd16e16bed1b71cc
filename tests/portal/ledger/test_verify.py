"""``manage.py ledger_verify``: a clean ledger passes; rows changed in the database are named."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction

from portal.ledger import checkpoint as notes
from portal.ledger.leaves import canonical_json
from portal.ledger.models import LedgerCheckpoint
from portal.ledger.services import (
    ledger_append_many,
    ledger_checkpoint_cosign,
    ledger_checkpoint_create,
    ledger_witness_add,
)
from portal.models import Role
from tests.factories import MembershipFactory
from tests.portal.ledger.support import (
    append_only_trigger_disabled,
    isolated_ledger_key,
    raw_sql,
    sqlite_env,
    sqlite_ledger,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ledger_key")]


@pytest.fixture
def ledger_key(settings, tmp_path):
    return isolated_ledger_key(settings, tmp_path)


def _ledger(n: int = 10, checkpoints: tuple[int, ...] = (4, 10)) -> None:
    records = [("usage", {"job": j, "site": j % 3, "cpu_seconds": "2.5"}) for j in range(n)]
    done = 0
    for size in checkpoints:
        ledger_append_many(entries=records[done:size])
        ledger_checkpoint_create()
        done = size
    ledger_append_many(entries=records[done:])


def _verify() -> str:
    out = StringIO()
    call_command("ledger_verify", stdout=out, stderr=StringIO())
    return out.getvalue()


def _verify_all() -> str:
    """stdout and stderr of a passing ``ledger_verify``."""
    out, err = StringIO(), StringIO()
    call_command("ledger_verify", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def _failure() -> str:
    with pytest.raises(CommandError) as caught:
        _verify()
    return str(caught.value)


def test_ledger_verify_passes_a_clean_ledger_with_cosignatures():
    _ledger(12)
    admin = MembershipFactory(role=Role.INSTITUTION_ADMIN)
    key = Ed25519PrivateKey.generate()
    ledger_witness_add(
        by=admin.user,
        institution=admin.institution,
        verifier_key=notes.encode_verifier_key("w", key.public_key()),
    )
    checkpoint = LedgerCheckpoint.objects.get(size=10)
    ledger_checkpoint_cosign(
        by=admin.user,
        checkpoint=checkpoint,
        note=notes.cosign(checkpoint.note, key_name="w", private_key=key),
    )

    assert "ledger OK: 12 leaves, 2 checkpoints, 1 cosignatures verified" in _verify()
    # … and says how far the witness vouches: up to checkpoint 10, not the 2 leaves after it.
    assert "Witnesses cosigned checkpoints up to 10 leaves" in _verify_all()
    assert "The 2 leaves after it rest on the platform's signature alone" in _verify_all()


def test_ledger_verify_says_a_shortened_ledger_is_undetectable_without_a_witness():
    """Issue 9, finding 10: the newest checkpoint and the leaves after it deleted still pass; the
    report must say plainly that it cannot see this without a witness."""
    _ledger(10, checkpoints=(4, 10))
    raw_sql("DELETE FROM portal_ledgercheckpoint WHERE size = 10")
    raw_sql('DELETE FROM portal_ledgerentry WHERE "index" >= 4')

    text = _verify_all()

    assert "ledger OK: 4 leaves, 1 checkpoints" in text  # nothing in the database disagrees
    assert "No checkpoint is cosigned by a witness" in text
    assert "cannot detect a ledger shortened from its end" in text


def test_ledger_verify_passes_an_empty_ledger():
    assert "ledger OK: 0 leaves" in _verify()


def test_ledger_verify_names_the_row_edited_in_the_database():
    _ledger(10)
    # Someone with database access changes leaf 6's figure and leaves its hash alone.
    raw_sql("UPDATE portal_ledgerentry SET data = replace(data, '2.5', '0.5') WHERE index = 6")

    message = _failure()

    assert message.startswith("ledger verification FAILED at index 6: leaf hash mismatch")


def test_ledger_verify_names_the_first_of_several_edited_rows():
    _ledger(10)
    raw_sql("UPDATE portal_ledgerentry SET kind = 'charge' WHERE index = 8")
    raw_sql("UPDATE portal_ledgerentry SET data = data || ' ' WHERE index = 3")

    assert "FAILED at index 3: leaf hash mismatch" in _failure()


def test_ledger_verify_finds_a_kind_column_that_disagrees_with_the_data():
    _ledger(10)
    raw_sql("UPDATE portal_ledgerentry SET kind = 'charge' WHERE index = 8")

    assert "FAILED at index 8: kind column 'charge'" in _failure()


def test_ledger_verify_finds_a_rewritten_leaf_with_a_fresh_hash_through_the_checkpoint_root():
    _ledger(10)
    forged = canonical_json({"job": 5, "site": 2, "cpu_seconds": "0.1", "kind": "usage"})
    raw_sql(
        "UPDATE portal_ledgerentry SET data = %s, leaf_hash = %s WHERE index = 5",
        [forged.decode(), hashlib.sha256(b"\x00" + forged).digest()],
    )

    message = _failure()

    # Checkpoint 4 still matches, checkpoint 10 does not: the change is in leaves [4, 10).
    assert "FAILED at index 4: checkpoint 10: root mismatch" in message
    assert "[4, 10)" in message


def test_ledger_verify_finds_a_deleted_row():
    _ledger(10)
    raw_sql("DELETE FROM portal_ledgerentry WHERE index = 7")

    assert "FAILED at index 7: leaf missing (the next stored index is 8)" in _failure()


def test_ledger_verify_finds_a_forged_checkpoint_signature():
    _ledger(10)
    forger = Ed25519PrivateKey.generate()
    checkpoint = LedgerCheckpoint.objects.get(size=4)
    text, _ = notes.parse_note(checkpoint.note)
    forged_note = notes.sign_note(text, key_name="portal.example.org/ledger", private_key=forger)
    raw_sql("UPDATE portal_ledgercheckpoint SET note = %s WHERE size = 4", [forged_note])

    assert "FAILED at index 0: checkpoint 4: signature: note has no verifiable" in _failure()


def test_ledger_verify_finds_a_checkpoint_row_that_disagrees_with_its_note():
    _ledger(10)
    raw_sql("UPDATE portal_ledgercheckpoint SET root_hash = %s WHERE size = 10", [b"\1" * 32])

    assert "FAILED at index 4: checkpoint 10: the signed note names another" in _failure()


def test_ledger_verify_exits_non_zero_from_the_command_line(monkeypatch):
    # The command's own command-line path (``run_from_argv``: CommandError → exit 1 on stderr).
    # Not ``execute_from_command_line``: it runs ``django.setup()`` again, whose logging
    # configuration binds a handler to the captured stderr of this test, closed after it, and
    # every later test of the process (a pytest-xdist worker) then failed on that closed file.
    from portal.management.commands.ledger_verify import Command

    _ledger(6, checkpoints=(6,))
    raw_sql("UPDATE portal_ledgerentry SET data = data || ' ' WHERE index = 2")
    err = StringIO()
    monkeypatch.setattr("sys.stderr", err)

    with pytest.raises(SystemExit) as caught:
        Command().run_from_argv(["manage.py", "ledger_verify"])

    assert caught.value.code == 1
    assert "FAILED at index 2" in err.getvalue()


def test_ledger_verify_fails_while_an_append_only_trigger_is_disabled():
    # Hostile re-test C: whoever can drop or disable the triggers can then rewrite leaves; the
    # signed checkpoints catch a rewrite below them, but the guard's absence itself went unsaid.
    _ledger(4, checkpoints=(4,))
    assert "ledger OK" in _verify()
    with append_only_trigger_disabled():
        message = _failure()
    assert message.startswith("ledger verification FAILED: the database no longer refuses")
    assert "portal_ledgerentry_append_only: disabled" in message
    assert "portal_ledgercheckpoint_no_truncate: disabled" in message
    assert "ledger OK" in _verify()  # enabled again


@pytest.mark.slow
def test_ledger_verify_on_sqlite_fails_when_a_trigger_is_dropped(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    con = sqlite_ledger(tmp_path, leaves=3)
    env = sqlite_env(tmp_path)
    manage = [sys.executable, str(Path(__file__).parents[3] / "manage.py"), "ledger_verify"]
    ok = subprocess.run(manage, env=env, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    con.execute("DROP TRIGGER portal_ledgerentry_no_update")
    # …and one recreated under its own name so that it never fires (hostile re-test).
    con.execute("DROP TRIGGER portal_ledgerentry_no_delete")
    con.execute(
        "CREATE TRIGGER portal_ledgerentry_no_delete BEFORE DELETE ON portal_ledgerentry "
        "WHEN 0 BEGIN SELECT RAISE(ABORT, 'x'); END"
    )
    con.commit()

    failed = subprocess.run(manage, env=env, capture_output=True, text=True, check=False)

    assert failed.returncode == 1
    assert "portal_ledgerentry_no_update: missing" in failed.stderr
    assert "portal_ledgerentry_no_delete: changed from its migration's definition" in failed.stderr


def test_ledger_verify_fails_when_a_trigger_function_is_replaced():
    # Hostile re-test: the function's owner replaced its body with RETURN NULL (no superuser
    # needed), deleted every checkpoint, and ledger_verify said "ledger OK".
    _ledger(4, checkpoints=(4,))
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION portal_ledger_refuse_change() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
        )

    message = _failure()

    assert "portal_ledgercheckpoint_append_only: its function portal_ledger_refuse_change()" in (
        message
    )


def test_a_replica_session_cannot_skip_the_triggers():
    # Hostile re-test: SET session_replication_role = replica skipped the triggers, so a
    # superuser deleted the newest checkpoint and leaves unseen. They are ENABLE ALWAYS now.
    _ledger(4, checkpoints=(4,))
    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("DELETE FROM portal_ledgercheckpoint")
    assert LedgerCheckpoint.objects.count() == 1
