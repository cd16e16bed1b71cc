"""Tests of the callback signatures (``federation/signing.py``).

The primitive is pinned by RFC 4231 test vectors, and the scheme (HMAC-SHA256 over ``b"<ts>." + body``,
``v1=<hex>``) is checked against an HMAC written here from RFC 2104 §2 on top of ``hashlib``.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from federation.signing import (
    MAX_SKEW_SECONDS,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    sign,
    verify,
)

TOKEN = "3f" * 32  # the shape of a job's callback token (64 hex characters)
BODY = json.dumps({"event": "round", "round": 1, "eval_accuracy": 0.9}).encode()
TS = 1_700_000_000

# RFC 4231 §4.3 (test case 2) and §4.2 (test case 1), HMAC-SHA-256.
RFC4231_CASE2 = (
    b"Jefe",
    b"what do ya want for nothing?",
    "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
)
RFC4231_CASE1 = (
    b"\x0b" * 20,
    b"Hi There",
    "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
)


def rfc2104_hmac_sha256(key: bytes, message: bytes) -> str:
    """HMAC from its definition (RFC 2104 §2): H((K ⊕ opad) ‖ H((K ⊕ ipad) ‖ m)), B = 64 bytes."""
    block = 64
    if len(key) > block:
        key = hashlib.sha256(key).digest()
    key = key.ljust(block, b"\x00")
    inner = hashlib.sha256(bytes(k ^ 0x36 for k in key) + message).digest()
    return hashlib.sha256(bytes(k ^ 0x5C for k in key) + inner).hexdigest()


@pytest.mark.parametrize("vector", [RFC4231_CASE1, RFC4231_CASE2], ids=["case1", "case2"])
def test_hmac_sha256_primitive_matches_rfc4231(vector):
    key, data, expected = vector

    assert hmac.new(key, data, hashlib.sha256).hexdigest() == expected
    assert rfc2104_hmac_sha256(key, data) == expected


def test_sign_matches_documented_scheme():
    headers = sign(TOKEN, BODY, timestamp=TS)

    expected = rfc2104_hmac_sha256(TOKEN.encode(), b"1700000000." + BODY)
    assert headers == {TIMESTAMP_HEADER: "1700000000", SIGNATURE_HEADER: f"v1={expected}"}


def test_sign_with_rfc4231_key_matches_reference_hmac():
    key, data, _ = RFC4231_CASE2

    headers = sign(key.decode(), data, timestamp=0)

    expected = hmac.new(key, b"0." + data, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"v1={expected}"


def test_sign_then_verify_round_trip_accepts():
    headers = sign(TOKEN, BODY, timestamp=TS)

    result = verify(
        TOKEN,
        BODY,
        timestamp=headers[TIMESTAMP_HEADER],
        signature=headers[SIGNATURE_HEADER],
        now=TS + 1,
    )

    assert result is None


def test_sign_without_timestamp_uses_current_time_and_verifies():
    headers = sign(TOKEN, BODY)

    verify(TOKEN, BODY, timestamp=headers[TIMESTAMP_HEADER], signature=headers[SIGNATURE_HEADER])


@pytest.mark.parametrize(
    "tampered",
    [BODY.replace(b"0.9", b"1.0"), BODY + b" ", b"", BODY[:-1]],
    ids=["value-changed", "appended", "empty", "truncated"],
)
def test_verify_body_tampered_raises(tampered):
    headers = sign(TOKEN, BODY, timestamp=TS)

    with pytest.raises(SignatureError, match="does not match"):
        verify(
            TOKEN,
            tampered,
            timestamp=headers[TIMESTAMP_HEADER],
            signature=headers[SIGNATURE_HEADER],
            now=TS,
        )


def test_verify_other_token_raises():
    headers = sign("another-jobs-token", BODY, timestamp=TS)

    with pytest.raises(SignatureError, match="does not match"):
        verify(
            TOKEN,
            BODY,
            timestamp=headers[TIMESTAMP_HEADER],
            signature=headers[SIGNATURE_HEADER],
            now=TS,
        )


def test_verify_timestamp_swapped_raises():
    """The timestamp is under the MAC: moving it forward (to replay later) breaks the signature."""
    headers = sign(TOKEN, BODY, timestamp=TS)

    with pytest.raises(SignatureError, match="does not match"):
        verify(
            TOKEN, BODY, timestamp=str(TS + 100), signature=headers[SIGNATURE_HEADER], now=TS + 100
        )


@pytest.mark.parametrize("skew", [MAX_SKEW_SECONDS + 1, -(MAX_SKEW_SECONDS + 1), 86_400])
def test_verify_stale_timestamp_raises(skew):
    headers = sign(TOKEN, BODY, timestamp=TS)

    with pytest.raises(SignatureError, match="window"):
        verify(
            TOKEN,
            BODY,
            timestamp=headers[TIMESTAMP_HEADER],
            signature=headers[SIGNATURE_HEADER],
            now=TS + skew,
        )


@pytest.mark.parametrize("skew", [300, -300])
def test_verify_timestamp_at_window_edge_accepts(skew):
    headers = sign(TOKEN, BODY, timestamp=TS)

    verify(
        TOKEN,
        BODY,
        timestamp=headers[TIMESTAMP_HEADER],
        signature=headers[SIGNATURE_HEADER],
        now=TS + skew,
    )


@pytest.mark.parametrize(
    ("timestamp", "signature", "message"),
    [
        (None, "v1=00", "missing"),
        ("1700000000", None, "missing"),
        ("", "", "missing"),
        ("yesterday", "v1=00", "malformed timestamp"),
        ("1700000000", "v0=" + "0" * 64, "unknown signature scheme"),
    ],
)
def test_verify_bad_headers_raise(timestamp, signature, message):
    with pytest.raises(SignatureError, match=message):
        verify(TOKEN, BODY, timestamp=timestamp, signature=signature, now=TS)
