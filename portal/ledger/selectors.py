"""Reads of the ledger: who may see it, its leaves, checkpoints, proofs, and the full verification.

**The tree behind the proofs.** Proofs are answered from one :class:`portal.ledger.merkle.MerkleTree`
per process (:func:`ledger_tree`), kept in memory and *extended*, never rebuilt: each call fetches
only the leaf hashes appended since the last call (``WHERE index >= cached size``), so a request at
steady state costs one indexed query (the last leaf's index and key) plus O(log n) hashing. The tree caches every complete subtree
(about 64 bytes per leaf: 64 MB per process at 1M leaves), so the root and proofs for *any* past
size are O(log n) (O(log² n) hashes at worst) without a per-size cache. The first call in a process
reads every leaf hash once (a cold start of about a second per million leaves).

Validity of the cached prefix: leaves are append-only (model guard, PostgreSQL trigger), so a stored
prefix never changes. What can vanish is rows of a transaction that rolled back after this process
read them (the same connection sees its own uncommitted rows). The cache therefore remembers the
primary key, time and leaf hash of its last leaf; PostgreSQL never reuses a sequence value, so if the
row at that index is still that row, every earlier row is the one that was read (appends are
serialised, so a rolled-back row takes every later row with it). (SQLite may reuse a rolled-back
key; the time and hash then tell the rows apart.) Otherwise the tree is rebuilt. A leaf changed behind
the guards is not caught here but by the checkpoint check of each proof response (the tree's root at
the checkpoint's size must equal the signed root) and by ``manage.py ledger_verify``.
"""

from __future__ import annotations

import base64
import json
import random
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db.models import QuerySet

from portal.ledger import checkpoint as notes
from portal.ledger.guards import guard_problems
from portal.ledger.leaves import LedgerError, LedgerIntegrityError, canonical_json
from portal.ledger.merkle import MerkleTree, leaf_hash
from portal.ledger.models import LedgerCheckpoint, LedgerCosignature, LedgerEntry, LedgerWitness
from portal.ledger.signer import ledger_verifier
from portal.permissions import can
from portal.selectors import administered_institutions

_FETCH = 20_000  # leaf hashes per chunk when extending the tree


def ledger_visible(*, user) -> bool:
    """True when ``user`` may read the ledger (a signed-in member of any institution, or staff)."""
    return can(user, "ledger.view")


def ledger_entries() -> QuerySet[LedgerEntry]:
    """Leaves newest first, without their data (for the ledger page's table)."""
    return LedgerEntry.objects.order_by("-index").only("index", "kind", "leaf_hash", "created_at")


def ledger_size() -> int:
    """Number of leaves (``max(index) + 1``; indexes are dense)."""
    last = LedgerEntry.objects.order_by("-index").values_list("index", flat=True).first()
    return 0 if last is None else last + 1


def ledger_checkpoint(*, size: int | None = None) -> LedgerCheckpoint | None:
    """The checkpoint at ``size`` (default: the latest), or ``None``."""
    checkpoints = LedgerCheckpoint.objects.order_by("-size")
    if size is not None:
        checkpoints = checkpoints.filter(size=size)
    return checkpoints.first()


def ledger_witnessing() -> dict:
    """How much of the ledger witnesses vouch for: ``{"checkpoints": int, "cosigned": int,
    "cosigned_size": int}`` — checkpoints signed, those cosigned by at least one witness, and the
    size of the largest cosigned one (0 when none)."""
    from django.db.models import Max

    cosigned = LedgerCheckpoint.objects.filter(cosignatures__isnull=False).distinct()
    return {
        "checkpoints": LedgerCheckpoint.objects.count(),
        "cosigned": cosigned.count(),
        "cosigned_size": cosigned.aggregate(m=Max("size"))["m"] or 0,
    }


#: What ``ledger_verify`` cannot see from the database alone (printed with every report).
UNDETECTABLE_WITHOUT_WITNESS = (
    "This check reads only this database. It cannot detect a ledger shortened from its end (the "
    "newest checkpoints and the leaves after them deleted) nor one rebuilt wholesale by whoever "
    "holds the platform's signing key: only a checkpoint kept outside the portal can — a "
    "witness's cosigned copy or a checkpoint an institution saved."
)


def ledger_checkpoint_note(checkpoint: LedgerCheckpoint) -> str:
    """The checkpoint's signed note with every accepted cosignature line appended.

    The platform's signature comes first, then the witnesses' in name order (a tlog serves its
    checkpoint this way: one note, several signatures).
    """
    text, signatures = notes.parse_note(checkpoint.note)
    lines = [s.line() for s in signatures]
    cosignatures = LedgerCosignature.objects.filter(checkpoint=checkpoint).select_related("witness")
    for cosignature in cosignatures:
        name, public_key = notes.decode_verifier_key(cosignature.witness.verifier_key)
        ident = notes.key_id(name, public_key)
        for signature in notes.parse_note(cosignature.note)[1]:
            if (signature.name, signature.key_id) == (
                name,
                ident,
            ) and signature.line() not in lines:
                lines.append(signature.line())
    return text + "\n" + "".join(lines)


def ledger_cosigners(checkpoint: LedgerCheckpoint) -> list[LedgerCosignature]:
    """The accepted cosignatures of ``checkpoint`` with witness and institution."""
    return list(
        LedgerCosignature.objects.filter(checkpoint=checkpoint).select_related(
            "witness__institution"
        )
    )


def ledger_witnesses_of(*, user) -> list[LedgerWitness]:
    """Active witness keys of the institutions ``user`` administers (for the cosign form)."""
    return list(
        LedgerWitness.objects.filter(
            active=True, institution__in=administered_institutions(user=user)
        ).select_related("institution")
    )


# --- the cached tree ----------------------------------------------------------------------------


class _TreeCache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tree = MerkleTree()
        self.last_key: tuple | None = None  # (pk, created_at, leaf hash) of the last leaf


_cache = _TreeCache()
_KEY = ("pk", "created_at", "leaf_hash")


def _key(values) -> tuple:
    pk, created_at, hash_ = values
    return (pk, created_at, bytes(hash_))


def ledger_tree() -> MerkleTree:
    """This process's Merkle tree of all visible leaves, brought up to date (see module docstring).

    At steady state one indexed query (the last leaf's index and primary key); after appends,
    one more to check the cached last leaf and one per 20,000 new leaf hashes.

    Returns:
        The shared :class:`MerkleTree` (do not modify it); its ``size`` is the current leaf count.

    Raises:
        LedgerIntegrityError: the stored indexes are not dense (a leaf is missing).
    """
    with _cache.lock:
        last = LedgerEntry.objects.order_by("-index").values_list("index", *_KEY).first()
        tree = _cache.tree
        if last is None:
            _cache.tree, _cache.last_key = MerkleTree(), None
            return _cache.tree
        if tree.size and last[0] == tree.size - 1 and _key(last[1:]) == _cache.last_key:
            return tree  # nothing appended, nothing rolled back
        if tree.size:
            key = LedgerEntry.objects.filter(index=tree.size - 1).values_list(*_KEY).first()
            if key is None or _key(key) != _cache.last_key:
                _cache.tree, _cache.last_key = MerkleTree(), None
                tree = _cache.tree
        try:
            while tree.size <= last[0]:
                start = tree.size
                rows = list(
                    LedgerEntry.objects.filter(
                        index__gte=start, index__lt=min(start + _FETCH, last[0] + 1)
                    )
                    .order_by("index")
                    .values_list("index", "leaf_hash")
                )
                for offset, (index, _) in enumerate(rows):
                    if index != start + offset:
                        raise LedgerIntegrityError(
                            f"leaf {start + offset} is missing (the next stored index is {index})"
                        )
                if not rows:
                    raise LedgerIntegrityError(f"leaf {start} is missing")
                tree.extend(bytes(h) for _, h in rows)
            _cache.last_key = _key(last[1:])  # the row read first is the last one now cached
        except (LedgerIntegrityError, ValueError):
            _cache.tree, _cache.last_key = MerkleTree(), None
            raise
        return tree


def ledger_spot_check(*, tree: MerkleTree, samples: int = 64) -> None:
    """Re-read up to ``samples`` random leaves (all of them in a small tree) and check them.

    Each sampled row's stored leaf hash must equal the cached one and SHA-256(0x00 ‖ data). A
    cheap, probabilistic guard for a leaf changed behind the append-only guards after this
    process cached it; ``manage.py ledger_verify`` is the complete check.

    Raises:
        LedgerIntegrityError: a sampled leaf differs (the cache is dropped; the message names
            the index).
    """
    if not tree.size:
        return
    count = min(samples, tree.size)
    indexes = random.sample(range(tree.size), count)
    rows = LedgerEntry.objects.filter(index__in=indexes).values_list("index", "data", "leaf_hash")
    for index, data, stored in sorted(rows):
        stored = bytes(stored)
        if stored != tree.leaf(index) or leaf_hash(data.encode()) != stored:
            with _cache.lock:
                _cache.tree, _cache.last_key = MerkleTree(), None
            raise LedgerIntegrityError(f"leaf {index} changed after it was appended")


def _b64(value: bytes) -> str:
    return base64.b64encode(bytes(value)).decode("ascii")


def _checked_checkpoint(tree: MerkleTree, size: int) -> str | None:
    """The checkpoint note at ``size``, after checking the tree gives its signed root."""
    checkpoint = ledger_checkpoint(size=size)
    if checkpoint is None:
        return None
    if tree.root(size) != bytes(checkpoint.root_hash):
        raise LedgerIntegrityError(
            f"the stored leaves no longer give checkpoint {size}'s root: run ledger_verify"
        )
    return ledger_checkpoint_note(checkpoint)


def _count(name: str, value) -> int:
    """``value`` (an int, or ASCII decimal digits as text) as a count ≥ 0; else ``LedgerError``."""
    digits = value.removeprefix("-") if isinstance(value, str) else None
    if digits is not None and not (digits.isascii() and digits.isdecimal()):
        # int() would also take "１", " 7" or "1_000"; a proof URL takes plain digits only.
        raise LedgerError(f"{name} must be a whole number (digits 0-9)")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise LedgerError(f"{name} must be a whole number") from None
    if number < 0:
        raise LedgerError(f"{name} must be >= 0")
    return number


def _default_size(tree: MerkleTree) -> int:
    checkpoint = ledger_checkpoint()
    return checkpoint.size if checkpoint is not None else tree.size


def ledger_leaf(*, index) -> dict:
    """Leaf ``index`` as a JSON-ready dict.

    Returns:
        ``{"index", "kind", "created_at" (ISO 8601), "data" (the exact canonical JSON text that
        is hashed), "record" (the parsed data), "leaf_hash" (base64 of SHA-256(0x00 ‖ data))}``.

    Raises:
        LedgerError: ``index`` is not a whole number.
        LedgerEntry.DoesNotExist: no leaf has that index.
    """
    entry = LedgerEntry.objects.get(index=_count("index", index))
    return {
        "index": entry.index,
        "kind": entry.kind,
        "created_at": entry.created_at.isoformat(),
        "data": entry.data,
        "record": json.loads(entry.data),
        "leaf_hash": _b64(entry.leaf_hash),
    }


def ledger_inclusion(*, index, size=None) -> dict:
    """Inclusion proof of leaf ``index`` in the tree of ``size`` leaves (RFC 9162 §2.1.3.1).

    Args:
        index: leaf index, ``0 <= index < size``.
        size: tree size (default: the latest checkpoint's, else the current size).

    Returns:
        ``{"index", "size", "leaf_hash", "proof": [base64 hashes, leaf upwards], "root",
        "checkpoint": the signed note at ``size`` or null}``; hashes are base64 of 32 bytes.

    Raises:
        LedgerError: a non-numeric or out-of-range index or size.
        LedgerIntegrityError: the leaves do not give the checkpoint's signed root.
    """
    index = _count("index", index)
    tree = ledger_tree()
    size = _default_size(tree) if size in (None, "") else _count("size", size)
    if size > tree.size:
        raise LedgerError(f"size {size} exceeds the ledger's {tree.size} leaves")
    if index >= size:
        raise LedgerError(f"index {index} is not below size {size}")
    return {
        "index": index,
        "size": size,
        "leaf_hash": _b64(tree.leaf(index)),
        "proof": [_b64(h) for h in tree.inclusion_proof(index, size)],
        "root": _b64(tree.root(size)),
        "checkpoint": _checked_checkpoint(tree, size),
    }


def ledger_consistency(*, first, second=None) -> dict:
    """Consistency proof between the trees of ``first`` and ``second`` leaves (RFC 9162 §2.1.4.1).

    Args:
        first: the earlier size, ``0 <= first <= second``.
        second: the later size (default: the latest checkpoint's, else the current size).

    Returns:
        ``{"first", "second", "first_root", "second_root", "proof": [base64 hashes],
        "first_checkpoint", "second_checkpoint"}`` (the signed notes at those sizes, or null).

    Raises:
        LedgerError: non-numeric sizes, ``first > second`` or ``second`` beyond the ledger.
        LedgerIntegrityError: the leaves do not give a checkpoint's signed root.
    """
    first = _count("first", first)
    tree = ledger_tree()
    second = _default_size(tree) if second in (None, "") else _count("second", second)
    if second > tree.size:
        raise LedgerError(f"second {second} exceeds the ledger's {tree.size} leaves")
    if first > second:
        raise LedgerError(f"first {first} is larger than second {second}")
    return {
        "first": first,
        "second": second,
        "first_root": _b64(tree.root(first)),
        "second_root": _b64(tree.root(second)),
        "proof": [_b64(h) for h in tree.consistency_proof(first, second)],
        "first_checkpoint": _checked_checkpoint(tree, first) if first else None,
        "second_checkpoint": _checked_checkpoint(tree, second),
    }


# --- full verification ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerProblem:
    """One thing wrong with the stored ledger.

    ``index`` is the first leaf index the problem implicates (for a checkpoint whose root no
    longer matches, the first leaf after the last checkpoint that still matched); ``message``
    says what is wrong.
    """

    index: int
    message: str
    exact: bool = True  # False: the change is somewhere in a range starting at ``index``

    def __str__(self) -> str:
        return f"index {self.index}: {self.message}"


@dataclass(frozen=True)
class LedgerReport:
    """Result of :func:`ledger_verify`: leaves and checkpoints checked, problems by index."""

    leaves: int
    checkpoints: int
    cosignatures: int
    problems: tuple[LedgerProblem, ...]
    cosigned_size: int = 0  # leaves covered by the largest checkpoint a witness cosigned
    #: what is wrong with the database's append-only triggers (``guards.guard_problems``)
    missing_guards: tuple[str, ...] = ()

    @property
    def limits(self) -> str:
        """What this report cannot vouch for, in plain words."""
        if not self.cosigned_size:
            return "No checkpoint is cosigned by a witness. " + UNDETECTABLE_WITHOUT_WITNESS
        return (
            f"Witnesses cosigned checkpoints up to {self.cosigned_size} leaves; a witness that "
            f"kept its copy can detect any change below that size. The {self.leaves - self.cosigned_size} "
            "leaves after it rest on the platform's signature alone. "
            + UNDETECTABLE_WITHOUT_WITNESS
        )

    @property
    def ok(self) -> bool:
        return not self.problems and not self.missing_guards


def _leaf_problem(index: int, kind: str, data: str, stored: bytes) -> str | None:
    recomputed = leaf_hash(data.encode())
    if recomputed != stored:
        return (
            f"leaf hash mismatch: stored {stored.hex()}, SHA-256(0x00 ‖ data) is "
            f"{recomputed.hex()} (data changed)"
        )
    try:
        record = json.loads(data)
    except ValueError:
        return "data is not JSON"
    if not isinstance(record, dict):
        return "data is not a JSON object"
    try:
        canonical = canonical_json(record).decode()
    except (TypeError, ValueError):
        canonical = None
    if canonical != data:
        return "data is not canonical JSON (sorted keys, no spaces)"
    if record.get("kind") != kind:
        return f"kind column {kind!r} differs from the data's kind {record.get('kind')!r}"
    return None


def ledger_verify(*, chunk: int = 10_000, max_problems: int = 50) -> LedgerReport:
    """Recompute the whole ledger from its stored data; report what does not match.

    Checks, in one pass over the leaves in index order: indexes dense from 0; each stored leaf
    hash equals SHA-256(0x00 ‖ data); data is a canonical JSON object whose ``kind`` equals the
    row's. Then, for every checkpoint in size order: its size is within the ledger, the root of
    the stored leaf hashes at that size equals its root, and its note verifies under the
    platform key with that origin, size and root; and every cosignature verifies under its
    witness's key on the same text. A checkpoint whose root no longer matches is reported at
    the first leaf after the last checkpoint that still matched (the change is in that range).

    Args:
        chunk: rows fetched per database round trip.
        max_problems: stop collecting after this many problems.

    Also checks that the database still has the triggers that keep the ledger append-only, as
    their migrations made them (``portal.ledger.guards.guard_problems``).

    Returns:
        :class:`LedgerReport`; ``problems`` sorted by index (the first is the first bad index),
        ``missing_guards`` what is wrong with the triggers.
    """
    problems: list[LedgerProblem] = []
    tree = MerkleTree()
    batch: list[bytes] = []
    expected = 0
    rows = (
        LedgerEntry.objects.order_by("index")
        .values_list("index", "kind", "data", "leaf_hash")
        .iterator(chunk_size=chunk)
    )
    gap = False
    for index, kind, data, stored in rows:
        if index != expected:
            problems.append(
                LedgerProblem(expected, f"leaf missing (the next stored index is {index})")
            )
            gap = True
            break
        stored = bytes(stored)
        message = _leaf_problem(index, kind, data, stored)
        if message is not None and len(problems) < max_problems:
            problems.append(LedgerProblem(index, message))
        batch.append(stored)
        expected += 1
        if len(batch) >= chunk:
            tree.extend(batch)
            batch = []
    tree.extend(batch)

    key_name, public_key = ledger_verifier()
    origin = settings.FRP_LEDGER_ORIGIN
    good_size = 0
    checkpoints = 0
    cosignatures = 0
    cosigned_size = 0
    for checkpoint in LedgerCheckpoint.objects.order_by("size"):
        checkpoints += 1
        size, root_hash = checkpoint.size, bytes(checkpoint.root_hash)
        where = f"checkpoint {size}"
        try:
            signed = notes.verify_note(
                checkpoint.note, key_name=key_name, public_key=public_key, origin=origin
            )
        except notes.CheckpointError as exc:
            problems.append(LedgerProblem(min(good_size, size), f"{where}: signature: {exc}"))
            continue
        if (signed.size, signed.root_hash) != (size, root_hash):
            problems.append(
                LedgerProblem(
                    min(good_size, size), f"{where}: the signed note names another size or root"
                )
            )
            continue
        if size > tree.size:
            if not gap:
                problems.append(
                    LedgerProblem(
                        tree.size, f"{where} covers {size} leaves, only {tree.size} stored"
                    )
                )
            continue
        if tree.root(size) != root_hash:
            problems.append(
                LedgerProblem(
                    good_size,
                    exact=False,
                    message=f"{where}: root mismatch: the stored leaf hashes give "
                    f"{_b64(tree.root(size))}, the signed root is {_b64(root_hash)} "
                    f"(a leaf in [{good_size}, {size}) was changed)",
                )
            )
            continue
        good_size = size
        for cosignature in LedgerCosignature.objects.filter(checkpoint=checkpoint).select_related(
            "witness"
        ):
            cosignatures += 1
            try:
                name, witness_key = notes.decode_verifier_key(cosignature.witness.verifier_key)
                text = notes.parse_note(cosignature.note)[0]
                notes.open_note(cosignature.note, [(name, witness_key)])
                if text != notes.parse_note(checkpoint.note)[0]:
                    raise notes.CheckpointError("text differs from the checkpoint's")
                cosigned_size = max(cosigned_size, size)
            except notes.CheckpointError as exc:
                problems.append(
                    LedgerProblem(
                        size, f"{where}: cosignature by {cosignature.witness.name}: {exc}"
                    )
                )
    problems.sort(key=lambda p: (p.index, not p.exact))
    return LedgerReport(
        expected,
        checkpoints,
        cosignatures,
        tuple(problems[:max_problems]),
        cosigned_size,
        guard_problems(),
    )
