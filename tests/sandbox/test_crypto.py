"""Tests for sandbox.crypto: envelope encryption with STREAM-chunked AES-256-GCM."""

from __future__ import annotations

import hashlib
import io
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sandbox import crypto
from sandbox.crypto import (
    FIXED_HEADER_BYTES,
    HEADER_BYTES,
    TAG_BYTES,
    CryptoError,
    associated_data,
    chunk_nonce,
    decrypt_all,
    decrypt_stream,
    encrypt_stream,
    generate_key,
    open_chunk,
    read_header,
    rewrap,
    seal_chunk,
)

CHUNK = 64
AAD = associated_data(site="hospital-a", dataset="cohort", version=3)


def _encrypt(kek: bytes, plaintext: bytes, aad: bytes = AAD, chunk_size: int = CHUNK) -> bytes:
    sink = io.BytesIO()
    encrypt_stream(kek=kek, aad=aad, source=io.BytesIO(plaintext), sink=sink, chunk_size=chunk_size)
    return sink.getvalue()


def _chunks(blob: bytes, chunk_size: int = CHUNK) -> list[bytes]:
    body = blob[HEADER_BYTES:]
    step = chunk_size + TAG_BYTES
    return [body[i : i + step] for i in range(0, len(body), step)] or [b""]


def _assert_rejected(kek: bytes, blob: bytes, aad: bytes = AAD) -> None:
    """decrypt_all raises and the streaming reader never completes."""
    with pytest.raises(CryptoError):
        decrypt_all(kek=kek, aad=aad, source=io.BytesIO(blob))
    with pytest.raises(CryptoError):
        for _ in decrypt_stream(kek=kek, aad=aad, source=io.BytesIO(blob)):
            pass


# --- primitive pinned to a published test vector ----------------------------------------------

# McGrew & Viega, "The Galois/Counter Mode of Operation (GCM)", 2005, Appendix B, Test Case 16
# (AES-256, 96-bit IV, 20 bytes of AAD, 60 bytes of plaintext).
TC16_KEY = bytes.fromhex("feffe9928665731c6d6a8f9467308308" * 2)
TC16_IV = bytes.fromhex("cafebabefacedbaddecaf888")
TC16_P = bytes.fromhex(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
)
TC16_A = bytes.fromhex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
TC16_C = bytes.fromhex(
    "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
    "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
)
TC16_T = bytes.fromhex("76fc6ece0f4e1768cddf8853bb2d551b")


def test_seal_chunk_matches_gcm_spec_test_case_16():
    assert seal_chunk(TC16_KEY, TC16_IV, TC16_P, TC16_A) == TC16_C + TC16_T
    assert AESGCM(TC16_KEY).encrypt(TC16_IV, TC16_P, TC16_A) == TC16_C + TC16_T


def test_open_chunk_inverts_test_case_16_and_rejects_a_bad_tag():
    assert open_chunk(TC16_KEY, TC16_IV, TC16_C + TC16_T, TC16_A) == TC16_P
    bad = TC16_C + TC16_T[:-1] + bytes([TC16_T[-1] ^ 1])
    with pytest.raises(CryptoError):
        open_chunk(TC16_KEY, TC16_IV, bad, TC16_A)


def test_chunk_nonce_layout():
    prefix = bytes(range(7))
    assert chunk_nonce(prefix, 0, last=False) == prefix + b"\x00\x00\x00\x00\x00"
    assert chunk_nonce(prefix, 258, last=True) == prefix + b"\x00\x00\x01\x02\x01"
    with pytest.raises(CryptoError):
        chunk_nonce(prefix, 1 << 32, last=False)


# --- associated data ---------------------------------------------------------------------------


def test_associated_data_is_canonical_and_injective():
    a = associated_data(site="ab", dataset="c", version=1)
    b = associated_data(site="a", dataset="bc", version=1)
    assert a != b
    assert a.startswith(b"frp/v1\x00")
    assert a == b"frp/v1\x00" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x01c" + struct.pack(">Q", 1)
    assert associated_data(site="a", dataset="b", version=2) != associated_data(
        site="a", dataset="b", version=3
    )


@pytest.mark.parametrize("version", [-1, 1 << 64, "1", True])
def test_associated_data_rejects_bad_version(version):
    with pytest.raises(CryptoError):
        associated_data(site="a", dataset="b", version=version)


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, int(3.5 * CHUNK)])
def test_round_trip(kek, size):
    plaintext = bytes((i * 7 + 3) % 256 for i in range(size))
    sink = io.BytesIO()

    result = encrypt_stream(
        kek=kek, aad=AAD, source=io.BytesIO(plaintext), sink=sink, chunk_size=CHUNK
    )

    blob = sink.getvalue()
    assert result.plaintext_bytes == size
    assert result.ciphertext_bytes == len(blob)
    assert result.sha256 == hashlib.sha256(blob).hexdigest()
    # The final chunk always holds fewer than CHUNK bytes: exact multiples end with an empty one.
    assert len(blob) == HEADER_BYTES + (size // CHUNK + 1) * TAG_BYTES + size
    assert decrypt_all(kek=kek, aad=AAD, source=io.BytesIO(blob)) == plaintext
    chunks = list(decrypt_stream(kek=kek, aad=AAD, source=io.BytesIO(blob)))
    assert b"".join(chunks) == plaintext
    assert all(len(c) == CHUNK for c in chunks[:-1]) and len(chunks[-1]) < CHUNK


def test_round_trip_default_chunk_size(kek):
    plaintext = b"x" * ((1 << 20) + 5)
    blob = _encrypt(kek, plaintext, chunk_size=1 << 20)
    assert read_header(io.BytesIO(blob)).chunk_size == 1 << 20
    assert decrypt_all(kek=kek, aad=AAD, source=io.BytesIO(blob)) == plaintext


class _Trickle(io.RawIOBase):
    """A source that returns at most 3 bytes per read, like a slow socket."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self._data.read(min(3, n) if n >= 0 else 3)


def test_short_reads_are_handled(kek):
    plaintext = bytes(range(256)) * 2
    blob = _encrypt(kek, plaintext)
    assert decrypt_all(kek=kek, aad=AAD, source=_Trickle(blob)) == plaintext
    sink = io.BytesIO()
    encrypt_stream(kek=kek, aad=AAD, source=_Trickle(plaintext), sink=sink, chunk_size=CHUNK)
    assert decrypt_all(kek=kek, aad=AAD, source=io.BytesIO(sink.getvalue())) == plaintext


# --- tampering ---------------------------------------------------------------------------------

PLAINTEXT = bytes(range(256))[: int(3.5 * CHUNK)]


@pytest.fixture
def blob(kek) -> bytes:
    return _encrypt(kek, PLAINTEXT)


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize(
    "index",
    [
        0,  # magic
        7,  # format version
        10,  # chunk size
        13,  # nonce prefix
        FIXED_HEADER_BYTES - 1,  # wrapped-key length
        FIXED_HEADER_BYTES + 2,  # wrapped key: wrap nonce
        FIXED_HEADER_BYTES + 20,  # wrapped key: encrypted DEK
        HEADER_BYTES - 1,  # wrapped key: tag
    ],
)
def test_flipped_bit_in_header_or_wrapped_key_is_rejected(kek, blob, index):
    _assert_rejected(kek, _flip(blob, index))


@pytest.mark.parametrize("chunk", [0, 1, 3])
@pytest.mark.parametrize("where", ["first byte", "tag"])
def test_flipped_bit_in_a_chunk_is_rejected(kek, blob, chunk, where):
    start = HEADER_BYTES + chunk * (CHUNK + TAG_BYTES)
    chunk_len = len(_chunks(blob)[chunk])
    index = start if where == "first byte" else start + chunk_len - 1
    _assert_rejected(kek, _flip(blob, index))


def test_tampered_last_chunk_releases_nothing_from_decrypt_all(kek, blob):
    tampered = _flip(blob, len(blob) - 1)
    with pytest.raises(CryptoError):
        decrypt_all(kek=kek, aad=AAD, source=io.BytesIO(tampered))
    # decrypt_stream yields the verified earlier chunks before failing: callers must discard.
    got = []
    with pytest.raises(CryptoError):
        for part in decrypt_stream(kek=kek, aad=AAD, source=io.BytesIO(tampered)):
            got.append(part)
    assert len(got) == 3


def test_swapped_chunks_are_rejected(kek, blob):
    c = _chunks(blob)
    _assert_rejected(kek, blob[:HEADER_BYTES] + c[1] + c[0] + c[2] + c[3])


def test_reordered_chunks_are_rejected(kek, blob):
    c = _chunks(blob)
    _assert_rejected(kek, blob[:HEADER_BYTES] + c[2] + c[0] + c[1] + c[3])


def test_duplicated_chunk_is_rejected(kek, blob):
    c = _chunks(blob)
    _assert_rejected(kek, blob[:HEADER_BYTES] + c[0] + c[0] + c[1] + c[2] + c[3])


@pytest.mark.parametrize("cut", [1, TAG_BYTES, CHUNK // 2])
def test_truncated_mid_chunk_is_rejected(kek, blob, cut):
    _assert_rejected(kek, blob[:-cut])


def test_truncated_inside_header_is_rejected(kek, blob):
    _assert_rejected(kek, blob[: HEADER_BYTES - 5])
    _assert_rejected(kek, b"")


def test_dropped_last_chunk_is_rejected(kek, blob):
    c = _chunks(blob)
    _assert_rejected(kek, blob[:HEADER_BYTES] + c[0] + c[1] + c[2])


def test_dropped_empty_last_chunk_is_rejected(kek):
    full = _encrypt(kek, b"y" * (2 * CHUNK))  # exact multiple: ends with an empty final chunk
    assert len(_chunks(full)[-1]) == TAG_BYTES
    _assert_rejected(kek, full[:-TAG_BYTES])


def test_trailing_garbage_is_rejected(kek, blob):
    _assert_rejected(kek, blob + b"\x00")
    c = _chunks(blob)
    _assert_rejected(kek, blob + c[0])


def test_chunks_from_another_object_are_rejected(kek, blob):
    other = _encrypt(kek, PLAINTEXT)
    mixed = blob[:HEADER_BYTES] + _chunks(other)[0] + b"".join(_chunks(blob)[1:])
    _assert_rejected(kek, mixed)


@pytest.mark.parametrize(
    "aad",
    [
        associated_data(site="hospital-a", dataset="other", version=3),
        associated_data(site="hospital-a", dataset="cohort", version=4),
        associated_data(site="hospital-b", dataset="cohort", version=3),
    ],
)
def test_replay_under_another_site_dataset_or_version_is_rejected(kek, blob, aad):
    _assert_rejected(kek, blob, aad=aad)


def test_wrong_kek_is_rejected(blob):
    with pytest.raises(CryptoError, match="wrong key-encryption key"):
        decrypt_all(kek=generate_key(), aad=AAD, source=io.BytesIO(blob))


@pytest.mark.parametrize("bad", [b"", b"x" * 16, b"x" * 33])
def test_bad_key_length_is_rejected(bad):
    with pytest.raises(CryptoError):
        encrypt_stream(kek=bad, aad=AAD, source=io.BytesIO(b"x"), sink=io.BytesIO())


@pytest.mark.parametrize("chunk_size", [0, -1, crypto.MAX_CHUNK_SIZE + 1])
def test_bad_chunk_size_is_rejected(kek, chunk_size):
    with pytest.raises(CryptoError):
        encrypt_stream(
            kek=kek, aad=AAD, source=io.BytesIO(b"x"), sink=io.BytesIO(), chunk_size=chunk_size
        )


def test_not_an_encrypted_object(kek):
    with pytest.raises(CryptoError, match="magic"):
        decrypt_all(kek=kek, aad=AAD, source=io.BytesIO(b"id,age\n1,2\n" * 20))


# --- nonce uniqueness -------------------------------------------------------------------------


def test_nonces_unique_per_chunk_and_per_object(kek, monkeypatch):
    seen: list[tuple[bytes, bytes]] = []
    real = AESGCM

    class Recording:
        def __init__(self, key):
            self._key = bytes(key)
            self._aead = real(key)

        def encrypt(self, nonce, data, associated_data):
            seen.append((self._key, bytes(nonce)))
            return self._aead.encrypt(nonce, data, associated_data)

        def decrypt(self, nonce, data, associated_data):
            return self._aead.decrypt(nonce, data, associated_data)

    monkeypatch.setattr(crypto, "AESGCM", Recording)
    first = _encrypt(kek, PLAINTEXT)
    second = _encrypt(kek, PLAINTEXT)

    assert first != second
    assert _chunks(first)[0] != _chunks(second)[0]
    # 2 wraps under the KEK + 2 x 4 chunks under the DEKs; no (key, nonce) pair repeats.
    assert len(seen) == 10
    assert len(set(seen)) == len(seen)
    kek_nonces = [nonce for key, nonce in seen if key == kek]
    assert len(kek_nonces) == 2 and len(set(kek_nonces)) == 2
    h1, h2 = read_header(io.BytesIO(first)), read_header(io.BytesIO(second))
    assert h1.nonce_prefix != h2.nonce_prefix
    chunk_nonces = [nonce for key, nonce in seen if key != kek]
    expected_first = [chunk_nonce(h1.nonce_prefix, i, last=i == 3) for i in range(4)]
    assert chunk_nonces[:4] == expected_first


# --- header and rewrap -------------------------------------------------------------------------


def test_read_header_fields(kek, blob):
    header = read_header(io.BytesIO(blob))
    assert header.version == 1
    assert header.chunk_size == CHUNK
    assert len(header.nonce_prefix) == 7
    assert header.raw == blob[:HEADER_BYTES]
    assert header.raw.startswith(b"FRPENC1\x01")


def test_rewrap_keeps_data_and_retires_old_kek(kek, blob):
    new_kek = generate_key()
    new_header = rewrap(old_kek=kek, new_kek=new_kek, aad=AAD, header=blob[:HEADER_BYTES])
    rotated = new_header + blob[HEADER_BYTES:]

    assert len(new_header) == HEADER_BYTES
    assert decrypt_all(kek=new_kek, aad=AAD, source=io.BytesIO(rotated)) == PLAINTEXT
    with pytest.raises(CryptoError):
        decrypt_all(kek=kek, aad=AAD, source=io.BytesIO(rotated))


def test_rewrap_with_wrong_old_kek_or_aad_fails(kek, blob):
    with pytest.raises(CryptoError):
        rewrap(old_kek=generate_key(), new_kek=kek, aad=AAD, header=blob[:HEADER_BYTES])
    other = associated_data(site="hospital-a", dataset="cohort", version=9)
    with pytest.raises(CryptoError):
        rewrap(old_kek=kek, new_kek=generate_key(), aad=other, header=blob[:HEADER_BYTES])


# --- the tail of an object (decrypt_tail) -----------------------------------------------------


@pytest.mark.parametrize("length", [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK, int(3.5 * CHUNK)])
@pytest.mark.parametrize("size", [0, 1, 10, CHUNK, CHUNK + 5, 1000])
def test_decrypt_tail_is_the_end_of_the_plaintext(kek, length, size):
    plaintext = bytes((7 * i) % 256 for i in range(length))
    blob = _encrypt(kek, plaintext)

    tail, total = crypto.decrypt_tail(kek=kek, aad=AAD, source=io.BytesIO(blob), size=size)

    assert total == length
    assert tail == plaintext[len(plaintext) - min(size, length) :]


def _assert_tail_rejected(kek: bytes, blob: bytes, aad: bytes = AAD) -> None:
    with pytest.raises(CryptoError):
        crypto.decrypt_tail(kek=kek, aad=aad, source=io.BytesIO(blob), size=3 * CHUNK)


def test_decrypt_tail_refuses_what_decrypt_stream_refuses(kek, blob):
    c = _chunks(blob)
    _assert_tail_rejected(kek, _flip(blob, len(blob) - 1))  # last chunk's tag
    _assert_tail_rejected(kek, _flip(blob, HEADER_BYTES + 2 * (CHUNK + TAG_BYTES)))  # 3rd chunk
    _assert_tail_rejected(kek, blob[:HEADER_BYTES] + c[0] + c[1] + c[2])  # dropped last chunk
    _assert_tail_rejected(kek, blob[:HEADER_BYTES] + c[0] + c[2] + c[1] + c[3])  # reordered
    _assert_tail_rejected(kek, blob[:-1])
    _assert_tail_rejected(kek, blob + b"\x00")
    _assert_tail_rejected(kek, blob[: HEADER_BYTES + 3])
    _assert_tail_rejected(generate_key(), blob)
    _assert_tail_rejected(
        kek, blob, associated_data(site="hospital-a", dataset="cohort", version=4)
    )
