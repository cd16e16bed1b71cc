"""Writes of the ledger: append-only leaves of an RFC 9162 Merkle tree."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, transaction
from django.db.models import Max

from accounting.merkle import leaf_hash
from accounting.models import LedgerEntry

_LOCK_ID = 0x4C454447  # "LEDG": PostgreSQL advisory lock that serialises appends


def canonical_json(record: dict[str, Any]) -> bytes:
    """UTF-8 JSON with sorted keys and no insignificant whitespace (the leaf's bytes)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@transaction.atomic
def ledger_append(*, kind: str, record: dict[str, Any]) -> LedgerEntry:
    """Append ``{"kind": kind, **record}`` as the next leaf; returns the entry (with its index).

    ``record`` must be JSON-serialisable (Decimal as str). Appends are serialised (an advisory
    lock on PostgreSQL; SQLite serialises writers itself), so indexes are dense from 0.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
    data = canonical_json({"kind": kind, **record})
    last = LedgerEntry.objects.aggregate(m=Max("index"))["m"]
    return LedgerEntry.objects.create(
        index=0 if last is None else last + 1,
        kind=kind,
        data=data.decode(),
        leaf_hash=leaf_hash(data),
    )
