"""Tests of the callback signatures (``frp_flwr/signing.py``).

The primitive is pinned by RFC 4231 test vectors, and the scheme (HMAC-SHA256 over ``b"<ts>." + body``,
``v1=<hex>``) is checked against an HMAC written here from RFC 2104 §2 on top of ``hashlib``. The
per-run key is checked against HKDF written here from RFC 5869 §2, itself pinned by the RFC's test
case 1.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from frp_flwr.signing import (
    KEY_ENV,
    KEY_FILE_ENV,
    MAX_SKEW_SECONDS,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    job_key,
    master_key_from_environ,
    sign,
    verify,
)

TOKEN = b"\x3f" * 32  # the shape of a run's job key (32 bytes)
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

    expected = rfc2104_hmac_sha256(TOKEN, b"1700000000." + BODY)
    assert headers == {TIMESTAMP_HEADER: "1700000000", SIGNATURE_HEADER: f"v1={expected}"}


def test_sign_with_rfc4231_key_matches_reference_hmac():
    key, data, _ = RFC4231_CASE2

    headers = sign(key, data, timestamp=0)

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
    headers = sign(b"another-runs-key", BODY, timestamp=TS)

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


@pytest.mark.parametrize("digits", [309, 310, 4000])
def test_verify_timestamp_too_large_for_a_float_is_outside_the_window(digits):
    # ``now`` is a float (time.time()) and 10**309 does not fit one: ``now - ts`` raised
    # OverflowError, a 500 for anyone.
    with pytest.raises(SignatureError, match="window"):
        verify(TOKEN, BODY, timestamp="1" + "0" * digits, signature="v1=00", now=float(TS))


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


# --- the per-run key (HKDF, RFC 5869) and the platform key on the ServerApp's host --------------


def rfc5869_hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF from its definition (RFC 5869 §2.2 extract, §2.3 expand) on top of ``hmac``."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def test_reference_hkdf_matches_rfc5869_test_case_1():
    okm = rfc5869_hkdf_sha256(
        bytes.fromhex("0b" * 22),
        bytes.fromhex("000102030405060708090a0b0c"),
        bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        42,
    )

    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_job_key_is_hkdf_of_the_platform_key_with_job_and_run():
    master = b"m" * 40

    key = job_key(master, job_id=17, run_id="18446744073709551615")

    assert key == rfc5869_hkdf_sha256(
        master, b"frp-callback-v1", b"job=17;run=18446744073709551615", 32
    )


def test_job_key_differs_per_job_and_per_run():
    master = b"m" * 40
    keys = {job_key(master, job_id=j, run_id=r) for j in (1, 2) for r in (7, 8)}

    assert len(keys) == 4
    assert job_key(b"n" * 40, job_id=1, run_id=7) not in keys  # and per platform key


def test_master_key_from_environ_reads_the_variable_then_the_file(tmp_path):
    path = tmp_path / "callback.key"
    path.write_text("f" * 64 + "\n")

    assert master_key_from_environ({KEY_ENV: "e" * 40, KEY_FILE_ENV: str(path)}) == b"e" * 40
    assert master_key_from_environ({KEY_FILE_ENV: str(path)}) == b"f" * 64


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "no callback key on this host"),
        ({KEY_ENV: "too-short"}, "shorter than 32"),
        ({KEY_FILE_ENV: "/nonexistent/callback.key"}, "cannot read"),
    ],
)
def test_master_key_from_environ_without_a_usable_key_raises(environ, message):
    with pytest.raises(SignatureError, match=message):
        master_key_from_environ(environ)
