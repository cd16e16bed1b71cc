"""What a ledger leaf is made of, and the errors every ledger module raises.

A leaf's bytes are the canonical JSON of its record (:func:`canonical_json`); its hash is
``SHA-256(0x00 ‖ bytes)`` (``portal.ledger.merkle.leaf_hash``, RFC 9162 §2.1.1).
"""

from __future__ import annotations

import json
from typing import Any


class LedgerError(ValueError):
    """A ledger request that cannot be honoured (bad record, bad note, unknown witness, …)."""


class LedgerIntegrityError(LedgerError):
    """The stored ledger does not match itself (a leaf or checkpoint was changed): run ledger_verify."""


def canonical_json(record: dict[str, Any]) -> bytes:
    """UTF-8 JSON with sorted keys and no insignificant whitespace (the leaf's bytes).

    Raises:
        TypeError: a value is not JSON-serialisable (pass ``Decimal`` as ``str``).
        ValueError: a float is NaN or infinite (not JSON).
    """
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()
