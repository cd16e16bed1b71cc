"""Ledger services: appends, the append-only guards, the signing key, checkpoints, cosignatures."""

from __future__ import annotations

import hashlib
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings
from django.db import IntegrityError, connection, transaction

from portal.ledger import checkpoint as notes
from portal.ledger.leaves import LedgerError, LedgerIntegrityError, canonical_json
from portal.ledger.merkle import root
from portal.ledger.models import (
    LedgerAppendOnlyError,
    LedgerCheckpoint,
    LedgerCosignature,
    LedgerEntry,
)
from portal.ledger.services import (
    ledger_append,
    ledger_append_many,
    ledger_checkpoint_cosign,
    ledger_checkpoint_create,
    ledger_witness_add,
)
from portal.ledger.signer import ledger_signer, ledger_verifier, ledger_verifier_key
from portal.models import AuditEvent, Role
from portal.tasks import ledger_checkpoint_create_task
from tests.factories import InstitutionFactory, MembershipFactory, UserFactory
from tests.portal.ledger.support import isolated_ledger_key, raw_sql, sqlite_ledger

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ledger_key")]

ORIGIN = "portal.example.org/ledger"


@pytest.fixture
def ledger_key(settings, tmp_path):
    return isolated_ledger_key(settings, tmp_path)


def _records(n: int, start: int = 0) -> list[tuple[str, dict]]:
    return [
        ("usage", {"job": 100 + i, "site": i % 3, "cpu_seconds": "1.5"}) for i in range(start, n)
    ]


# --- appends ------------------------------------------------------------------------------------


def test_ledger_append_stores_canonical_json_with_rfc9162_leaf_hash():
    entry = ledger_append(kind="charge", record={"job": 7, "amount": "12.50", "site": 3})

    # Canonical form written by hand: sorted keys, no spaces; leaf hash = SHA-256(0x00 || data).
    expected = b'{"amount":"12.50","job":7,"kind":"charge","site":3}'
    stored = LedgerEntry.objects.get(index=0)
    assert entry.index == 0 and stored.pk == entry.pk
    assert stored.data.encode() == expected
    assert bytes(stored.leaf_hash) == hashlib.sha256(b"\x00" + expected).digest()
    assert stored.kind == "charge"


def test_ledger_append_indexes_are_dense_across_single_and_batch_appends():
    ledger_append(kind="usage", record={"job": 1})
    many = ledger_append_many(entries=_records(5))
    last = ledger_append(kind="usage", record={"job": 2})

    assert [e.index for e in many] == [1, 2, 3, 4, 5]
    assert last.index == 6
    assert list(LedgerEntry.objects.values_list("index", flat=True)) == list(range(7))
    for entry in many:
        stored = LedgerEntry.objects.get(pk=entry.pk)
        assert stored.index == entry.index and stored.data == entry.data


def test_ledger_append_many_is_all_or_nothing():
    ledger_append(kind="usage", record={"job": 1})
    entries = [*_records(3), ("usage", {"bad": float("nan")})]

    with pytest.raises(LedgerError, match="entry 3"):
        ledger_append_many(entries=entries)

    assert LedgerEntry.objects.count() == 1


def test_ledger_append_many_writes_more_than_one_insert_batch():
    entries = ledger_append_many(entries=_records(4500))

    assert entries[-1].index == 4499
    assert LedgerEntry.objects.count() == 4500


@pytest.mark.parametrize(
    ("kind", "record", "message"),
    [
        ("", {"job": 1}, "kind"),
        ("x" * 33, {"job": 1}, "kind"),
        ("usage", {"kind": "charge"}, "differs"),
        ("usage", {"amount": float("inf")}, "serialisable"),
        ("usage", {"amount": object()}, "serialisable"),
        ("usage", ["not", "a", "dict"], "dict"),
        ("access_decision", {"reason": "under investigation (confidential)"}, "free text"),
        ("usage", {"notes": ["fine", "two words"]}, "free text"),
        ("usage", {"Free Key": 1}, "not an identifier"),
    ],
)
def test_ledger_append_rejects_bad_records_and_writes_nothing(kind, record, message):
    with pytest.raises(LedgerError, match=message):
        ledger_append(kind=kind, record=record)

    assert not LedgerEntry.objects.exists()


def test_canonical_json_is_byte_exact_for_unicode_and_nesting():
    assert canonical_json({"b": [1, {"z": 1, "a": "é"}], "a": None}) == (
        '{"a":null,"b":[1,{"a":"é","z":1}]}'.encode()
    )


# --- append-only guards -------------------------------------------------------------------------


def test_ledger_entry_refuses_save_of_a_stored_row_and_delete():
    entry = ledger_append(kind="usage", record={"job": 1})
    stored = LedgerEntry.objects.get(pk=entry.pk)
    stored.data = '{"job":2,"kind":"usage"}'

    with pytest.raises(LedgerAppendOnlyError):
        stored.save()
    with pytest.raises(LedgerAppendOnlyError):
        stored.delete()
    assert LedgerEntry.objects.get(pk=entry.pk).data == '{"job":1,"kind":"usage"}'


def test_ledger_queryset_refuses_update_delete_and_bulk_update():
    ledger_append(kind="usage", record={"job": 1})

    with pytest.raises(LedgerAppendOnlyError):
        LedgerEntry.objects.filter(index=0).update(kind="charge")
    with pytest.raises(LedgerAppendOnlyError):
        LedgerEntry.objects.update(kind="charge")
    with pytest.raises(LedgerAppendOnlyError):
        LedgerEntry.objects.update_or_create(index=0, defaults={"kind": "charge"})
    with pytest.raises(LedgerAppendOnlyError):
        LedgerEntry.objects.all().delete()
    with pytest.raises(LedgerAppendOnlyError):
        LedgerEntry.objects.bulk_update(list(LedgerEntry.objects.all()), ["kind"])
    assert LedgerEntry.objects.get(index=0).kind == "usage"


def test_ledger_entry_with_an_existing_pk_is_inserted_not_updated():
    entry = ledger_append(kind="usage", record={"job": 1})
    clash = LedgerEntry(pk=entry.pk, index=5, kind="usage", data="{}", leaf_hash=b"\0" * 32)

    with pytest.raises(IntegrityError), transaction.atomic():
        clash.save()  # force_insert: a duplicate key, never an UPDATE of leaf 0
    assert LedgerEntry.objects.get(pk=entry.pk).index == 0


@pytest.mark.skipif(
    django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="the append-only trigger exists on PostgreSQL only",
)
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE portal_ledgerentry SET kind = 'charge'",
        "UPDATE portal_ledgerentry SET data = data WHERE false",
        "DELETE FROM portal_ledgerentry",
    ],
)
def test_postgresql_trigger_refuses_raw_update_and_delete(sql):
    ledger_append(kind="usage", record={"job": 1})

    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert LedgerEntry.objects.get(index=0).kind == "usage"


_POSTGRESQL_ONLY = pytest.mark.skipif(
    django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="these triggers are PostgreSQL's",
)


@_POSTGRESQL_ONLY
@pytest.mark.parametrize(
    "sql",
    [
        "TRUNCATE portal_ledgerentry",
        "TRUNCATE portal_ledgercheckpoint, portal_ledgercosignature",
        "UPDATE portal_ledgercheckpoint SET note = note",
        "DELETE FROM portal_ledgercheckpoint",
    ],
)
def test_postgresql_refuses_truncate_and_checkpoint_changes(sql):
    """Hostile re-test, variant 10b: the app's role owns the tables, so TRUNCATE (which fires no
    DELETE trigger) emptied the leaves and a shorter ledger was inserted that ``ledger_verify``
    passed; checkpoints had no guard at all."""
    ledger_append(kind="usage", record={"job": 1})
    ledger_checkpoint_create()

    with (
        pytest.raises(IntegrityError, match="ledger is append-only: (TRUNCATE|UPDATE|DELETE)"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert LedgerEntry.objects.count() == 1
    assert LedgerCheckpoint.objects.count() == 1


@pytest.mark.slow
def test_sqlite_refuses_insert_or_replace_of_leaves_and_checkpoints(tmp_path):
    """Hostile re-test, variant 10a: REPLACE deletes the clashing rows without firing the DELETE
    trigger (``recursive_triggers`` is off), so ``INSERT OR REPLACE`` rewrote leaf 3 in place and
    shortened the ledger from its end; checkpoints could be deleted and replaced freely."""
    import sqlite3

    con = sqlite_ledger(tmp_path, leaves=6)
    rows = con.execute(
        'SELECT id, "index", kind, data, leaf_hash, created_at FROM portal_ledgerentry '
        'ORDER BY "index"'
    ).fetchall()
    assert [r[1] for r in rows] == list(range(6))  # the service's own appends pass the guard
    leaf3 = rows[3]
    replace = (
        'INSERT OR REPLACE INTO portal_ledgerentry (id, "index", kind, data, leaf_hash, created_at)'
        " VALUES (?, ?, ?, ?, ?, ?)"
    )
    attacks = [
        # rewrite leaf 3 in place
        (
            replace,
            (leaf3[0], 3, "usage", '{"job":99,"kind":"usage"}', leaf3[4], leaf3[5]),
        ),
        # shorten: leaf 5's id at index 3 removes both rows, then leaf 3 goes back
        (
            replace.replace("INSERT OR REPLACE", "REPLACE"),
            (rows[5][0], 3, *leaf3[2:]),
        ),
        # a leaf that skips an index (a gap the next append would fill elsewhere)
        (
            (
                'INSERT INTO portal_ledgerentry (id, "index", kind, data, leaf_hash, created_at)'
                " VALUES (NULL, 9, 'usage', '{}', x'00', ?)"
            ),
            (leaf3[5],),
        ),
        (
            "INSERT OR REPLACE INTO portal_ledgercheckpoint (id, size, root_hash, note, created_at) "
            "SELECT id, size, x'00', 'forged', created_at FROM portal_ledgercheckpoint",
            (),
        ),
        ("DELETE FROM portal_ledgercheckpoint", ()),
        ("UPDATE portal_ledgercheckpoint SET note = 'forged'", ()),
    ]
    for sql, params in attacks:
        with pytest.raises(sqlite3.IntegrityError, match="ledger is append-only"):
            con.execute(sql, params)
    con.rollback()
    assert (
        con.execute(
            'SELECT id, "index", kind, data, leaf_hash, created_at FROM portal_ledgerentry '
            'ORDER BY "index"'
        ).fetchall()
        == rows
    )
    assert [
        r[0] for r in con.execute("SELECT size FROM portal_ledgercheckpoint ORDER BY size")
    ] == [5, 6]


# --- the signing key ----------------------------------------------------------------------------


def test_ledger_signer_creates_a_0600_key_file_once_and_reuses_it(ledger_key):
    name, key = ledger_signer()

    assert ledger_key.exists()
    assert stat.S_IMODE(ledger_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(ledger_key.parent.stat().st_mode) == 0o700
    assert name == ORIGIN
    again_name, again_key = notes.decode_signer_key(ledger_key.read_text().strip())
    assert again_name == name
    assert again_key.public_key().public_bytes_raw() == key.public_key().public_bytes_raw()
    assert ledger_signer()[1] is key


def test_ledger_signer_prefers_the_environment_key(settings, ledger_key):
    secret = Ed25519PrivateKey.generate()
    settings.FRP_LEDGER_SIGNER_KEY = notes.encode_signer_key("frp-test-log", secret)

    name, key = ledger_signer()

    assert name == "frp-test-log"
    assert key.public_key().public_bytes_raw() == secret.public_key().public_bytes_raw()
    assert not ledger_key.exists()
    assert ledger_verifier_key() == notes.encode_verifier_key("frp-test-log", secret.public_key())


def test_ledger_signer_rejects_a_malformed_key(settings):
    settings.FRP_LEDGER_SIGNER_KEY = "PRIVATE+KEY+broken"

    with pytest.raises(LedgerError, match="FRP_LEDGER_SIGNER_KEY"):
        ledger_signer()


# --- checkpoints --------------------------------------------------------------------------------


def test_ledger_checkpoint_create_signs_size_and_root_as_a_c2sp_note():
    records = [("usage", {"job": j}) for j in range(5)]
    ledger_append_many(entries=records)

    checkpoint = ledger_checkpoint_create()

    key_name, public_key = ledger_verifier()
    signed = notes.verify_note(
        checkpoint.note, key_name=key_name, public_key=public_key, origin=ORIGIN
    )
    expected_root = root([canonical_json({**r, "kind": k}) for k, r in records])
    assert (signed.size, signed.root_hash) == (5, expected_root)
    assert bytes(checkpoint.root_hash) == expected_root
    assert checkpoint.note.startswith(f"{ORIGIN}\n5\n")
    assert AuditEvent.objects.filter(action="ledger.checkpoint", target_id=str(checkpoint.pk))


def test_ledger_checkpoint_create_is_idempotent_until_the_ledger_grows():
    assert ledger_checkpoint_create() is None  # empty ledger: nothing to sign
    ledger_append(kind="usage", record={"job": 1})
    first = ledger_checkpoint_create()

    assert ledger_checkpoint_create() is None
    ledger_append(kind="usage", record={"job": 2})
    second = ledger_checkpoint_create()

    assert (first.size, second.size) == (1, 2)
    assert LedgerCheckpoint.objects.count() == 2


def test_ledger_checkpoint_create_refuses_to_sign_over_a_changed_leaf():
    ledger_append_many(entries=_records(4))
    ledger_checkpoint_create()
    forged = canonical_json({"job": 999, "kind": "usage"})
    raw_sql(
        "UPDATE portal_ledgerentry SET data = %s, leaf_hash = %s WHERE index = 2",
        [forged.decode(), hashlib.sha256(b"\x00" + forged).digest()],
    )
    ledger_append(kind="usage", record={"job": 5})

    with pytest.raises(LedgerIntegrityError, match="leaf 2 changed"):
        ledger_checkpoint_create()  # the spot check reads every leaf of a tree this small
    with pytest.raises(LedgerIntegrityError, match="checkpoint 4"):
        ledger_checkpoint_create()  # the tree rebuilt from the changed rows misses the root
    assert LedgerCheckpoint.objects.count() == 1


def test_checkpoint_task_signs_once_per_new_size(eager_celery):
    ledger_append_many(entries=_records(3))

    assert ledger_checkpoint_create_task.delay().get() == 3
    assert ledger_checkpoint_create_task.delay().get() is None
    assert LedgerCheckpoint.objects.count() == 1


def test_checkpoint_task_is_registered_in_the_beat_schedule():
    from portal.celery import app

    entry = django_settings.CELERY_BEAT_SCHEDULE["portal-ledger-checkpoint"]
    assert entry["task"] == ledger_checkpoint_create_task.name
    app.loader.import_default_modules()
    assert entry["task"] in app.tasks


# --- witnesses and cosignatures -----------------------------------------------------------------


@pytest.fixture
def witness():
    """An institution with an admin and a registered witness key; returns (admin, key, model)."""
    admin = MembershipFactory(role=Role.INSTITUTION_ADMIN)
    key = Ed25519PrivateKey.generate()
    vkey = notes.encode_verifier_key("witness.inst-a.example", key.public_key())
    model = ledger_witness_add(by=admin.user, institution=admin.institution, verifier_key=vkey)
    return admin.user, key, model


def _checkpoint(n: int = 3) -> LedgerCheckpoint:
    ledger_append_many(entries=_records(n))
    return ledger_checkpoint_create()


def test_ledger_witness_add_needs_the_institutions_admin():
    researcher = MembershipFactory(role=Role.RESEARCHER)
    vkey = notes.encode_verifier_key("w", Ed25519PrivateKey.generate().public_key())

    with pytest.raises(PermissionError):
        ledger_witness_add(
            by=researcher.user, institution=researcher.institution, verifier_key=vkey
        )
    with pytest.raises(LedgerError, match="verifier key"):
        admin = MembershipFactory(role=Role.INSTITUTION_ADMIN)
        ledger_witness_add(by=admin.user, institution=admin.institution, verifier_key="w+00+AA==")


def test_ledger_checkpoint_cosign_accepts_a_verifying_cosignature(witness):
    admin, key, model = witness
    checkpoint = _checkpoint()
    cosigned = notes.cosign(checkpoint.note, key_name=model.name, private_key=key)

    stored = ledger_checkpoint_cosign(by=admin, checkpoint=checkpoint, note=cosigned)
    again = ledger_checkpoint_cosign(by=admin, checkpoint=checkpoint, note=cosigned)

    assert [c.witness for c in stored] == [model]
    assert [c.pk for c in again] == [c.pk for c in stored]
    assert LedgerCosignature.objects.count() == 1
    key_name, public_key = ledger_verifier()
    signed = notes.verify_note(
        stored[0].note,
        key_name=key_name,
        public_key=public_key,
        cosigners={model.name: key.public_key()},
    )
    assert signed.signed_by == (key_name, model.name)


def test_ledger_checkpoint_cosign_refuses_bad_notes(witness):
    admin, key, model = witness
    checkpoint = _checkpoint()
    other = _checkpoint(2)  # size 5
    good = notes.cosign(checkpoint.note, key_name=model.name, private_key=key)
    text, _ = notes.parse_note(checkpoint.note)
    stranger = Ed25519PrivateKey.generate()
    platform_only_by_witness = notes.sign_note(text, key_name=model.name, private_key=key)
    bad_signature = good[:-10] + ("A" if good[-10] != "A" else "B") + good[-9:]

    cases = {
        "not checkpoint 3's text": notes.cosign(other.note, key_name=model.name, private_key=key),
        "no signature by log key": platform_only_by_witness,
        "invalid signature": bad_signature,
        "no signature by a registered witness": notes.cosign(
            checkpoint.note, key_name="stranger", private_key=stranger
        ),
        "paste": "   ",
    }
    for message, note in cases.items():
        with pytest.raises(LedgerError, match=message):
            ledger_checkpoint_cosign(by=admin, checkpoint=checkpoint, note=note)
    assert not LedgerCosignature.objects.exists()


def test_ledger_checkpoint_cosign_needs_an_admin_of_the_witness_institution(witness):
    _, key, model = witness
    checkpoint = _checkpoint()
    cosigned = notes.cosign(checkpoint.note, key_name=model.name, private_key=key)
    outsider = MembershipFactory(role=Role.INSTITUTION_ADMIN, institution=InstitutionFactory())

    with pytest.raises(LedgerError, match="administer"):
        ledger_checkpoint_cosign(by=outsider.user, checkpoint=checkpoint, note=cosigned)
    with pytest.raises(LedgerError, match="administer"):
        ledger_checkpoint_cosign(by=UserFactory(), checkpoint=checkpoint, note=cosigned)
    assert not LedgerCosignature.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_from_several_connections_stay_dense():
    # Four threads, each with its own database connection, append at once; the advisory lock
    # must serialise them (a race would surface as a unique-index error or a gap).
    import threading

    from django.db import connections

    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for j in range(25):
                ledger_append(kind="usage", record={"thread": offset, "j": j})
            ledger_append_many(
                entries=[("usage", {"thread": offset, "batch": b}) for b in range(25)]
            )
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert list(LedgerEntry.objects.order_by("index").values_list("index", flat=True)) == list(
        range(200)
    )


@pytest.mark.slow
def test_sqlite_ledger_refuses_update_and_delete(tmp_path):
    """Issue 9, finding 10: the embedded default (SQLite) gets the append-only trigger too.

    A real ``migrate`` on a fresh SQLite file, then raw SQL through Python's ``sqlite3``.
    """
    import os
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    db = tmp_path / "portal.sqlite3"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{db}",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "FRP_VAR_DIR": str(tmp_path / "var"),
    }
    manage = Path(__file__).parents[3] / "manage.py"
    subprocess.run(
        [sys.executable, str(manage), "migrate", "--noinput", "-v0"], env=env, check=True
    )
    con = sqlite3.connect(db)
    con.execute(
        'INSERT INTO portal_ledgerentry ("index", kind, data, leaf_hash, created_at) '
        "VALUES (0, 'usage', '{}', x'00', '2026-01-01')"
    )
    con.commit()
    for sql in (
        "UPDATE portal_ledgerentry SET data = '{\"job\":2}'",
        "DELETE FROM portal_ledgerentry",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="ledger is append-only"):
            con.execute(sql)
    assert con.execute("SELECT COUNT(*) FROM portal_ledgerentry").fetchone() == (1,)
