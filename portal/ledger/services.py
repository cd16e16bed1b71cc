"""Writes of the ledger: append-only leaves of an RFC 9162 Merkle tree and its signed checkpoints.

What this module owns:

* **Leaves.** :func:`ledger_append` / :func:`ledger_append_many` add canonical-JSON records as the
  next leaves (``leaf_hash = SHA-256(0x00 ‖ data)``, RFC 9162 §2.1.1). Appends are serialised by a
  PostgreSQL transaction-scoped advisory lock (SQLite serialises writers itself), so indexes are
  dense from 0. Nothing here changes or removes a leaf: the model, its queryset and (on
  PostgreSQL) a trigger refuse it.
* **Checkpoints** (:func:`ledger_checkpoint_create`): the tree size and root signed as a C2SP
  checkpoint note (c2sp.org/tlog-checkpoint, c2sp.org/signed-note), at most one per size.
* **Witnesses and cosignatures** (:func:`ledger_witness_add`, :func:`ledger_checkpoint_cosign`):
  an institution registers a verifier key; a cosigned checkpoint is accepted only if it still
  verifies under the platform key and that key.

The platform's signing key is ``portal.ledger.signer``; the leaf format and the errors are
``portal.ledger.leaves``. Ledger records carry ids, figures and hashes only (job, site, institution
ids, amounts, scores, the SHA-256 of a free text), never personal data or free text: every signed-in
member of every institution may read them and no one can remove them. ``_leaf_bytes`` refuses a
string that could be free text (``leaves.check_no_free_text``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.ledger import checkpoint as notes
from portal.ledger.leaves import (
    LedgerError,
    LedgerIntegrityError,
    canonical_json,
    check_no_free_text,
)
from portal.ledger.merkle import leaf_hash
from portal.ledger.models import (
    LedgerCheckpoint,
    LedgerCosignature,
    LedgerEntry,
    LedgerWitness,
)
from portal.ledger.selectors import ledger_spot_check, ledger_tree
from portal.ledger.signer import ledger_signer, ledger_verifier
from portal.permissions import can
from portal.services import audit_record

_LOCK_ID = 0x4C454447  # "LEDG": PostgreSQL advisory lock that serialises appends and checkpoints
_KIND_MAX = LedgerEntry._meta.get_field("kind").max_length
_BATCH = 2000
_INSERT_ROWS = 'INSERT INTO portal_ledgerentry ("index", kind, data, leaf_hash, created_at) VALUES '
# rows per INSERT statement in ledger_append_many


def _leaf_bytes(kind: str, record: dict[str, Any]) -> bytes:
    if not isinstance(kind, str) or not kind or len(kind) > _KIND_MAX:
        raise LedgerError(f"kind must be a non-empty string of at most {_KIND_MAX} characters")
    if not isinstance(record, dict):
        raise LedgerError("record must be a dict")
    check_no_free_text(record, "record")
    if "kind" in record and record["kind"] != kind:
        raise LedgerError(f"record's 'kind' {record['kind']!r} differs from kind {kind!r}")
    try:
        return canonical_json({**record, "kind": kind})
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"record is not canonical-JSON serialisable: {exc}") from exc


def _lock() -> None:
    """Take the ledger's transaction-scoped lock (PostgreSQL; SQLite serialises writers)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])


def _next_index(cursor) -> int:
    cursor.execute('SELECT MAX("index") FROM portal_ledgerentry')
    last = cursor.fetchone()[0]
    return 0 if last is None else last + 1


def _stored(pk: int, index: int, kind: str, data: str, hash_: bytes, now) -> LedgerEntry:
    entry = LedgerEntry(id=pk, index=index, kind=kind, data=data, leaf_hash=hash_, created_at=now)
    entry._state.adding = False
    entry._state.db = connection.alias
    return entry


def ledger_append(*, kind: str, record: dict[str, Any]) -> LedgerEntry:
    """Append ``{"kind": kind, **record}`` as the next leaf; returns the entry (with its index).

    On PostgreSQL one round trip: the function ``portal_ledger_append`` (migration
    ``portal.0003_ledger_append_only``) takes the ledger's transaction-scoped advisory lock and
    inserts at ``MAX(index) + 1``. Call it inside the caller's transaction so the leaf commits (or rolls back) with the record it
    describes; the ledger lock is then held until that transaction ends. Elsewhere (SQLite,
    which serialises writers itself) an atomic ``INSERT … SELECT MAX(index) + 1``.

    Args:
        kind: what the record is (``usage``, ``contribution``, ``charge``, ``credit``,
            ``access``, ``release``, …), at most 32 characters.
        record: JSON-serialisable ids and figures (``Decimal`` as ``str``, no NaN), no personal
            data. A ``"kind"`` key, if present, must equal ``kind``.

    Returns:
        The stored :class:`LedgerEntry`.

    Raises:
        LedgerError: bad kind, or a record that is not canonical-JSON serialisable (nothing is
            written).
    """
    data = _leaf_bytes(kind, record)
    hash_ = leaf_hash(data)
    text = data.decode()
    now = timezone.now()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT new_id, new_index FROM portal_ledger_append(%s, %s, %s, %s)",
                [kind, text, hash_, now],
            )
            pk, index = cursor.fetchone()
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                'INSERT INTO portal_ledgerentry ("index", kind, data, leaf_hash, created_at) '
                'SELECT COALESCE(MAX("index") + 1, 0), %s, %s, %s, %s '
                'FROM portal_ledgerentry RETURNING id, "index"',
                [kind, text, hash_, now],
            )
            pk, index = cursor.fetchone()
    return _stored(pk, index, kind, text, hash_, now)


@transaction.atomic
def ledger_append_many(*, entries: Iterable[tuple[str, dict[str, Any]]]) -> list[LedgerEntry]:
    """Append several records as consecutive leaves, in order, under one lock.

    All-or-nothing: if any record is invalid nothing is appended. Rows are written with
    multi-row INSERTs of up to 2,000 rows.

    Args:
        entries: ``(kind, record)`` pairs as for :func:`ledger_append`.

    Returns:
        The stored entries in order (indexes consecutive).

    Raises:
        LedgerError: a bad kind or record (the message names its position in ``entries``).
    """
    prepared = []
    for position, (kind, record) in enumerate(entries):
        try:
            data = _leaf_bytes(kind, record)
        except LedgerError as exc:
            raise LedgerError(f"entry {position}: {exc}") from exc
        prepared.append((kind, data.decode(), leaf_hash(data)))
    if not prepared:
        return []
    now = timezone.now()
    _lock()
    stored: list[LedgerEntry] = []
    with connection.cursor() as cursor:
        start = _next_index(cursor)
        for offset in range(0, len(prepared), _BATCH):
            batch = prepared[offset : offset + _BATCH]
            rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(batch))  # placeholders only
            sql = _INSERT_ROWS + rows + ' RETURNING id, "index"'
            params: list[Any] = []
            for i, (kind, text, hash_) in enumerate(batch):
                params += [start + offset + i, kind, text, hash_, now]
            cursor.execute(sql, params)
            ids = dict((index, pk) for pk, index in cursor.fetchall())
            for i, (kind, text, hash_) in enumerate(batch):
                index = start + offset + i
                stored.append(_stored(ids[index], index, kind, text, hash_, now))
    return stored


# --- checkpoints --------------------------------------------------------------------------------


@transaction.atomic
def ledger_checkpoint_create(*, by=None) -> LedgerCheckpoint | None:
    """Sign the current tree size and root as a C2SP checkpoint, if the ledger grew.

    Idempotent: takes the ledger lock (so no leaf is appended meanwhile), and returns ``None``
    without writing when the ledger is empty or its size equals the latest checkpoint's. Before
    signing it checks that the tree still gives the latest checkpoint's root (the new tree
    extends the signed one) and spot-checks 64 random stored leaves against the cached tree and
    their data (``ledger_verify`` is the complete check).

    Args:
        by: the acting user (``None`` for the periodic task).

    Returns:
        The new :class:`LedgerCheckpoint`, or ``None`` when there was nothing new to sign.

    Raises:
        LedgerIntegrityError: the leaves no longer match the latest checkpoint's root, or a
            sampled leaf changed.
        LedgerError: the signing key is invalid.
    """
    _lock()
    with connection.cursor() as cursor:
        size = _next_index(cursor)
    latest = LedgerCheckpoint.objects.order_by("-size").first()
    if size == 0 or (latest is not None and latest.size >= size):
        return None
    tree = ledger_tree()
    if tree.size != size:
        raise LedgerIntegrityError(f"ledger has {size} leaves but its indexes are not dense")
    ledger_spot_check(tree=tree)
    if latest is not None and tree.root(latest.size) != bytes(latest.root_hash):
        raise LedgerIntegrityError(
            f"leaves no longer give the root of checkpoint {latest.size}: run ledger_verify"
        )
    root_hash = tree.root(size)
    key_name, private_key = ledger_signer()
    body = notes.checkpoint_body(settings.FRP_LEDGER_ORIGIN, size, root_hash)
    checkpoint = LedgerCheckpoint.objects.create(
        size=size,
        root_hash=root_hash,
        note=notes.sign_note(body, key_name=key_name, private_key=private_key),
    )
    audit_record(by=by, action="ledger.checkpoint", target=checkpoint, size=size)
    return checkpoint


# --- witnesses and cosignatures -----------------------------------------------------------------


@transaction.atomic
def ledger_witness_add(*, by, institution, verifier_key: str) -> LedgerWitness:
    """Register an institution's witness key, whose cosignatures of checkpoints are accepted.

    Args:
        by: an admin of ``institution`` (or a platform admin).
        institution: the :class:`portal.models.Institution` the key belongs to.
        verifier_key: a note verifier key ``<name>+<hex key ID>+<base64(0x01 ‖ key)>``.

    Returns:
        The new (or already registered, then re-activated) :class:`LedgerWitness`.

    Raises:
        PermissionError: ``by`` may not administer ``institution``.
        LedgerError: the key is malformed or registered to another institution.
    """
    if not can(by, "institution.admin", institution):
        raise PermissionError("only the institution's admins register its witness keys")
    verifier_key = verifier_key.strip()
    try:
        name, _ = notes.decode_verifier_key(verifier_key)
    except notes.CheckpointError as exc:
        raise LedgerError(f"not a note verifier key: {exc}") from exc
    if name == ledger_verifier()[0]:
        raise LedgerError("a witness key may not use the platform's key name")
    witness, created = LedgerWitness.objects.get_or_create(
        verifier_key=verifier_key, defaults={"institution": institution, "name": name}
    )
    if witness.institution_id != institution.pk:
        raise LedgerError("this key is registered to another institution")
    if created or not witness.active:
        witness.active = True
        witness.save(update_fields=["active"])
        audit_record(
            by=by, action="ledger.witness_add", target=witness, institution=institution, name=name
        )
    return witness


@transaction.atomic
def ledger_checkpoint_cosign(
    *, by, checkpoint: LedgerCheckpoint, note: str
) -> list[LedgerCosignature]:
    """Accept a witness's cosigned copy of ``checkpoint``.

    The note must carry exactly the checkpoint's text, still verify under the platform key, and
    carry a valid signature by at least one active witness key of an institution ``by``
    administers (c2sp.org/signed-note: every signature by a known key must verify). One
    cosignature is stored per (checkpoint, witness); sending the same again changes nothing.

    Args:
        by: an admin of the witness's institution (or a platform admin).
        checkpoint: the :class:`LedgerCheckpoint` being cosigned.
        note: the cosigned note (the platform's signature line plus the witness's).

    Returns:
        The cosignatures stored for the witnesses ``by`` may act for (new or existing).

    Raises:
        LedgerError: malformed note, different text, a missing or invalid platform signature,
            an invalid signature by a known witness, or no signature by a witness of an
            institution ``by`` administers.
    """
    if not isinstance(note, str) or not note.strip():
        raise LedgerError("paste the cosigned checkpoint note")
    note = note.replace("\r\n", "\n")
    if not note.endswith("\n"):
        note += "\n"
    witnesses = list(LedgerWitness.objects.filter(active=True).select_related("institution"))
    keyed = {}
    for witness in witnesses:
        name, public_key = notes.decode_verifier_key(witness.verifier_key)
        keyed[(name, notes.key_id(name, public_key))] = (witness, public_key)
    key_name, public_key = ledger_verifier()
    try:
        text, signatures = notes.parse_note(note)
        if text != notes.parse_note(checkpoint.note)[0]:
            raise LedgerError(f"the note is not checkpoint {checkpoint.size}'s text")
        notes.verify_note(
            note,
            key_name=key_name,
            public_key=public_key,
            cosigners=[(name, pk) for (name, _), (_, pk) in keyed.items()],
            origin=settings.FRP_LEDGER_ORIGIN,
        )
    except notes.CheckpointError as exc:
        raise LedgerError(f"cosigned note refused: {exc}") from exc
    signed = [keyed[(s.name, s.key_id)][0] for s in signatures if (s.name, s.key_id) in keyed]
    mine = [w for w in signed if can(by, "institution.admin", w.institution)]
    if not mine:
        raise LedgerError(
            "the note carries no signature by a registered witness key of an institution you "
            "administer"
        )
    stored = []
    for witness in mine:
        cosignature, created = LedgerCosignature.objects.get_or_create(
            checkpoint=checkpoint,
            witness=witness,
            defaults={"note": note, "submitted_by": by if by.is_authenticated else None},
        )
        if created:
            audit_record(
                by=by,
                action="ledger.cosign",
                target=cosignature,
                institution=witness.institution,
                size=checkpoint.size,
                witness=witness.name,
            )
        stored.append(cosignature)
    return stored
