"""The ledger's rows: append-only leaves of an RFC 9162 Merkle tree, signed checkpoints, the
institutions' witness keys and their cosignatures.

Part of the core app (app label ``portal``; ``portal.models`` imports these so Django registers
them). The only writer is ``portal.ledger.services``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class LedgerAppendOnlyError(Exception):
    """Raised on any attempt to change or remove a ledger leaf (the ledger is append-only)."""


class LedgerEntryQuerySet(models.QuerySet):
    """Leaves can be read and inserted (``create``, ``bulk_create``), never changed or removed.

    ``update``, ``delete`` and ``bulk_update`` raise :class:`LedgerAppendOnlyError`. On
    PostgreSQL a trigger (migration ``portal.0003_ledger_append_only``) refuses UPDATE and DELETE on the
    table too, so raw SQL is refused as well.
    """

    def update(self, **kwargs):
        raise LedgerAppendOnlyError("ledger entries are append-only: update refused")

    def delete(self):
        raise LedgerAppendOnlyError("ledger entries are append-only: delete refused")

    def bulk_update(self, objs, fields, batch_size=None):
        raise LedgerAppendOnlyError("ledger entries are append-only: bulk_update refused")

    update.queryset_only = False  # LedgerEntry.objects.update() raises the same error
    delete.queryset_only = True  # as Django's own: managers have no delete()


class LedgerEntry(models.Model):
    """One leaf of the ledger's Merkle tree; ``index`` is its 0-based leaf index.

    ``data`` is the canonical JSON of the record (UTF-8, sorted keys, no spaces);
    ``leaf_hash`` = SHA-256(0x00 ‖ data) (RFC 9162 §2.1.1). Append-only: ``save()`` inserts only
    (a second save of a stored row raises :class:`LedgerAppendOnlyError`), ``delete()`` raises, and
    the queryset refuses ``update``/``delete``. Entries carry ids and figures only, never personal
    data: every signed-in member of an institution may read them.
    """

    index = models.PositiveBigIntegerField(unique=True)
    kind = models.CharField(max_length=32)
    data = models.TextField()
    leaf_hash = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = LedgerEntryQuerySet.as_manager()

    class Meta:
        ordering = ["index"]

    def __str__(self) -> str:
        return f"leaf {self.index} ({self.kind})"

    def save(self, *args, **kwargs):
        """Insert a new leaf; refuse to write a row that is already stored."""
        if not self._state.adding:
            raise LedgerAppendOnlyError(f"ledger entry {self.index} is append-only: save refused")
        kwargs["force_insert"] = True
        kwargs.pop("force_update", None)
        kwargs.pop("update_fields", None)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise LedgerAppendOnlyError(f"ledger entry {self.index} is append-only: delete refused")


class LedgerCheckpoint(models.Model):
    """A signed tree head: ``size`` leaves with ``root_hash``, as a C2SP signed note.

    ``note`` carries the platform's signature only; witnesses' cosignatures are kept apart in
    :class:`LedgerCosignature`, so a checkpoint row never changes once written.
    """

    size = models.PositiveBigIntegerField(unique=True)
    root_hash = models.BinaryField(max_length=32)
    note = models.TextField(help_text="The signed note (c2sp.org/tlog-checkpoint).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-size"]

    def __str__(self) -> str:
        return f"checkpoint {self.size}"


class LedgerWitness(models.Model):
    """An institution's witness key: its cosignatures on checkpoints are accepted.

    ``verifier_key`` is a note verifier key ``<name>+<hex key ID>+<base64(0x01‖Ed25519 key)>``
    (``portal.ledger.checkpoint.encode_verifier_key``, Go's ``note.NewVerifier``); ``name`` is the
    key name in it. An inactive key is no longer accepted for new cosignatures.
    """

    institution = models.ForeignKey(
        "portal.Institution", on_delete=models.PROTECT, related_name="ledger_witnesses"
    )
    name = models.CharField(max_length=200)
    verifier_key = models.CharField(max_length=400, unique=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["institution__name", "name"]

    def __str__(self) -> str:
        return f"witness {self.name} ({self.institution_id})"


class LedgerCosignature(models.Model):
    """A witness's cosignature of a checkpoint: the whole cosigned note as received.

    The note verified under the platform key and ``witness``'s key when it was accepted; one per
    (checkpoint, witness).
    """

    checkpoint = models.ForeignKey(
        LedgerCheckpoint, on_delete=models.PROTECT, related_name="cosignatures"
    )
    witness = models.ForeignKey(
        LedgerWitness, on_delete=models.PROTECT, related_name="cosignatures"
    )
    note = models.TextField()
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["checkpoint", "witness__name"]
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "witness"], name="ledger_cosignature_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"cosignature of {self.checkpoint_id} by {self.witness_id}"
