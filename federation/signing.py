"""HMAC signatures of ServerApp → portal callbacks (shared by both sides; imports no Django).

Scheme (after Stripe's webhook signatures): the sender sends ``X-FRP-Timestamp: <unix seconds>`` and
``X-FRP-Signature: v1=<hex>``, where ``hex = HMAC-SHA256(key=job token, msg=b"<ts>." + body)``
(RFC 2104). The receiver recomputes it in constant time and refuses timestamps more than
``MAX_SKEW_SECONDS`` away from its clock, so a captured post cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "X-FRP-Timestamp"
SIGNATURE_HEADER = "X-FRP-Signature"
MAX_SKEW_SECONDS = 300


class SignatureError(Exception):
    """The signature is missing, malformed, stale or wrong."""


def sign(token: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """Return the two headers that sign ``body`` (bytes) with the job's ``token``."""
    ts = int(time.time()) if timestamp is None else int(timestamp)
    mac = hmac.new(token.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: f"v1={mac}"}


def verify(
    token: str,
    body: bytes,
    *,
    timestamp: str | None,
    signature: str | None,
    now: float | None = None,
) -> None:
    """Check a signed body. Raises ``SignatureError`` with the reason; returns None when valid."""
    if not timestamp or not signature:
        raise SignatureError("missing signature headers")
    try:
        ts = int(timestamp)
    except ValueError:
        raise SignatureError("malformed timestamp") from None
    now = time.time() if now is None else now
    if abs(now - ts) > MAX_SKEW_SECONDS:
        raise SignatureError("timestamp outside the allowed window")
    if not signature.startswith("v1="):
        raise SignatureError("unknown signature scheme")
    expected = sign(token, body, timestamp=ts)[SIGNATURE_HEADER]
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("signature does not match")
