"""What a ledger leaf is made of, and the errors every ledger module raises.

A leaf's bytes are the canonical JSON of its record (:func:`canonical_json`); its hash is
``SHA-256(0x00 ‖ bytes)`` (``portal.ledger.merkle.leaf_hash``, RFC 9162 §2.1.1). A record holds
identifiers, figures and hashes only (:func:`check_no_free_text`): every institution reads every
leaf and no one can remove one, so a free text goes in only as its SHA-256 (:func:`text_sha256`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
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


#: A string in a leaf is an identifier, a figure, a time or a hash: no spaces, no free text.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.:+\-]{0,200}$")
_KEY_RE = re.compile(r"^[a-z0-9_]{1,64}$")


def check_no_free_text(value: Any, where: str = "record") -> None:
    """Refuse a value that could carry free text. Raises ``LedgerError`` naming the field.

    Strings must match ``[A-Za-z0-9_.:+-]{0,200}`` (ids, slugs, decimals, ISO times, hex hashes);
    keys must be identifiers. Free text goes into a leaf only as its SHA-256 (:func:`text_sha256`);
    the text itself stays in the audit log for the parties.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not _KEY_RE.match(key):
                raise LedgerError(f"{where}: key {str(key)[:40]!r} is not an identifier")
            check_no_free_text(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_no_free_text(item, f"{where}[{i}]")
    elif isinstance(value, str) and not _TOKEN_RE.match(value):
        raise LedgerError(
            f"{where}: {value[:40]!r} looks like free text; a leaf holds identifiers, figures and "
            "hashes only (put the text's SHA-256 in the leaf and the text in the audit log)"
        )


def commitment(value: str) -> tuple[str, str]:
    """A salted commitment to ``value`` for a ledger leaf: ``(commitment, salt)``, both hex.

    ``commitment`` = HMAC-SHA256(key = salt, message = ``value`` as UTF-8) with a fresh random
    16-byte salt. The leaf holds the commitment only; the salt stays beside the value (the audit
    log), so the parties can later prove the value, while a reader of the leaf cannot confirm a
    guess (a small count or a short text) by hashing candidates.
    """
    salt = secrets.token_bytes(16)
    return hmac.new(salt, value.encode(), hashlib.sha256).hexdigest(), salt.hex()


def commitment_matches(value: str, *, commitment_hex: str, salt_hex: str) -> bool:
    """Whether ``value`` with ``salt_hex`` opens ``commitment_hex`` (constant-time compare)."""
    expected = hmac.new(bytes.fromhex(salt_hex), value.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, commitment_hex)


def text_sha256(text: str | None) -> str | None:
    """The SHA-256 (hex) of a free text's UTF-8 bytes, for a ledger leaf; ``None`` for no text."""
    if not text:
        return None
    return hashlib.sha256(text.encode()).hexdigest()
