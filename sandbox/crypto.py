"""Envelope encryption of dataset objects at a site (site-side, imports no Django).

Owns the on-disk/on-store format of encrypted dataset versions:

* a fresh AES-256-GCM data key (DEK) per dataset version, wrapped by the site's key-encryption key
  (KEK, see ``sandbox.keyring``) with AES-256-GCM; the wrapped DEK travels inside the object header
  and is useless without the KEK, which never leaves the site;
* the plaintext cut into chunks sealed with the STREAM construction (Hoang, Reyhanitabar, Rogaway,
  Vizár 2015, "Online Authenticated-Encryption and its Nonce-Reuse Misuse-Resistance", CRYPTO
  2015, section 7): nonce = 7-byte random prefix || u32 chunk counter || last-chunk flag byte, so
  chunks cannot be reordered, dropped, duplicated or truncated without detection;
* associated data binding site, dataset and version, so an object replayed under another dataset
  id or version fails to decrypt.

Object layout (all integers big-endian)::

    header  = fixed || wrapped_dek
    fixed   = b"FRPENC1" (7) || format version u8 (=1) || chunk size u32 (plaintext bytes)
              || nonce prefix (7) || wrapped-DEK length u16 (=60)
    wrapped_dek = wrap nonce (12, random) || AES-GCM(KEK, wrap nonce, DEK, b"frp/wrap\\x00" || fixed
                  || aad)  -> 12 + 32 + 16 = 60 bytes
    chunk i = AES-GCM(DEK, prefix || u32(i) || flag, plaintext_i, b"frp/chunk\\x00" || fixed || aad)

Every chunk is ``chunk_size`` plaintext bytes except the final one, which holds 0..chunk_size-1
bytes and is sealed with flag 0x01 (all others 0x00). So an empty plaintext is one empty final
chunk, and a plaintext that is an exact multiple of ``chunk_size`` ends with an empty final chunk.
A reader therefore knows which chunk must be the last from its length alone, and the flag
(authenticated through the nonce) makes a dropped final chunk or a truncation detectable.

The fixed header is authenticated by every chunk and by the DEK wrap. The wrapped-DEK field is
authenticated by the wrap's own GCM tag rather than by the chunks, so that ``rewrap`` (KEK
rotation) can replace it without re-encrypting the data; a substituted wrapped DEK either fails
to unwrap or yields a DEK under which no chunk verifies.

Every failure raises ``CryptoError``; no unverified plaintext is ever returned.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"FRPENC1"
FORMAT_VERSION = 1
KEY_BYTES = 32
NONCE_PREFIX_BYTES = 7
NONCE_BYTES = 12
TAG_BYTES = 16
WRAPPED_DEK_BYTES = NONCE_BYTES + KEY_BYTES + TAG_BYTES
DEFAULT_CHUNK_SIZE = 1 << 20
MAX_CHUNK_SIZE = 64 << 20
MAX_CHUNKS = 1 << 32

_FIXED = struct.Struct(f">{len(MAGIC)}sBI{NONCE_PREFIX_BYTES}sH")
FIXED_HEADER_BYTES = _FIXED.size
HEADER_BYTES = FIXED_HEADER_BYTES + WRAPPED_DEK_BYTES

_AAD_LABEL = b"frp/v1\x00"
_WRAP_LABEL = b"frp/wrap\x00"
_CHUNK_LABEL = b"frp/chunk\x00"


class CryptoError(Exception):
    """Any encryption or decryption failure (tamper, wrong key, truncation, bad header)."""


@dataclass(frozen=True)
class EncryptResult:
    """Outcome of ``encrypt_stream``: sizes in bytes, ``sha256`` hex of all ciphertext written."""

    plaintext_bytes: int
    ciphertext_bytes: int
    sha256: str


@dataclass(frozen=True)
class Header:
    """A parsed object header. ``raw`` is the exact header bytes (``HEADER_BYTES`` long)."""

    version: int
    chunk_size: int
    nonce_prefix: bytes
    wrapped_dek: bytes
    raw: bytes

    @property
    def fixed(self) -> bytes:
        """The fixed part of the header (everything before the wrapped DEK)."""
        return self.raw[:FIXED_HEADER_BYTES]


def generate_key() -> bytes:
    """Return 32 bytes from the OS CSPRNG (``os.urandom``), usable as a KEK or DEK (AES-256)."""
    return os.urandom(KEY_BYTES)


def associated_data(*, site: str, dataset: str, version: int) -> bytes:
    """Canonical associated data binding an object to (site, dataset, version).

    Layout: ``b"frp/v1\\x00" || u32 len || UTF-8 site || u32 len || UTF-8 dataset || u64 version``
    (big-endian), so distinct triples never encode to the same bytes.

    Raises ``CryptoError`` for an empty site/dataset or a version outside 0..2**64-1.
    """
    if not site or not dataset:
        raise CryptoError("associated data needs a non-empty site and dataset")
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 1 << 64:
        raise CryptoError(f"dataset version must be an integer in 0..2**64-1, got {version!r}")
    out = bytearray(_AAD_LABEL)
    for field in (site, dataset):
        encoded = field.encode("utf-8")
        out += struct.pack(">I", len(encoded)) + encoded
    out += struct.pack(">Q", version)
    return bytes(out)


def chunk_nonce(prefix: bytes, counter: int, *, last: bool) -> bytes:
    """STREAM nonce for chunk ``counter``: ``prefix (7) || u32 counter || 0x01 if last else 0x00``.

    Raises ``CryptoError`` if the prefix is not 7 bytes or the counter is outside 0..2**32-1.
    """
    if len(prefix) != NONCE_PREFIX_BYTES:
        raise CryptoError(f"nonce prefix must be {NONCE_PREFIX_BYTES} bytes")
    if not 0 <= counter < MAX_CHUNKS:
        raise CryptoError("chunk counter overflow: object has more than 2**32 chunks")
    return prefix + struct.pack(">IB", counter, 1 if last else 0)


def seal_chunk(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM seal (NIST SP 800-38D): returns ``ciphertext || 16-byte tag``.

    ``key`` 32 bytes, ``nonce`` 12 bytes. Raises ``CryptoError`` on bad key or nonce length.
    """
    _check_key(key, "data key")
    if len(nonce) != NONCE_BYTES:
        raise CryptoError(f"nonce must be {NONCE_BYTES} bytes")
    return AESGCM(key).encrypt(nonce, plaintext, aad)


def open_chunk(key: bytes, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM open: inverse of ``seal_chunk``. Raises ``CryptoError`` if the tag fails."""
    _check_key(key, "data key")
    if len(nonce) != NONCE_BYTES:
        raise CryptoError(f"nonce must be {NONCE_BYTES} bytes")
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise CryptoError("authentication failed") from None


def encrypt_stream(
    *,
    kek: bytes,
    aad: bytes,
    source: BinaryIO,
    sink: BinaryIO,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> EncryptResult:
    """Encrypt ``source`` into ``sink`` with a fresh DEK wrapped by ``kek`` (format: module doc).

    Reads ``chunk_size`` plaintext bytes at a time (default 1 MiB), so memory is O(chunk_size)
    whatever the object size. ``aad`` should come from ``associated_data``. Returns sizes in
    bytes and the SHA-256 hex digest of everything written to ``sink``.

    Raises ``CryptoError`` for a KEK that is not 32 bytes, a chunk size outside
    1..64 MiB or more than 2**32 chunks; I/O errors of ``source``/``sink`` propagate.
    """
    _check_key(kek, "key-encryption key")
    if not isinstance(chunk_size, int) or not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise CryptoError(f"chunk size must be 1..{MAX_CHUNK_SIZE} bytes, got {chunk_size!r}")
    dek = generate_key()
    prefix = os.urandom(NONCE_PREFIX_BYTES)
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, chunk_size, prefix, WRAPPED_DEK_BYTES)
    header = fixed + _wrap(kek, dek, fixed, aad)
    chunk_aad = _CHUNK_LABEL + fixed + aad
    aead = AESGCM(dek)
    digest = hashlib.sha256(header)
    sink.write(header)
    written = len(header)
    total = 0
    counter = 0
    while True:
        block = _read_exact(source, chunk_size)
        last = len(block) < chunk_size
        sealed = aead.encrypt(chunk_nonce(prefix, counter, last=last), block, chunk_aad)
        sink.write(sealed)
        digest.update(sealed)
        written += len(sealed)
        total += len(block)
        counter += 1
        if last:
            break
    return EncryptResult(plaintext_bytes=total, ciphertext_bytes=written, sha256=digest.hexdigest())


def read_header(source: BinaryIO) -> Header:
    """Read and parse the header at the current position of ``source`` (consumes its bytes).

    Checks magic, format version, chunk size bound and wrapped-DEK length; does not need a key.
    Raises ``CryptoError`` on a short or malformed header.
    """
    raw = _read_exact(source, HEADER_BYTES)
    return parse_header(raw)


def parse_header(raw: bytes) -> Header:
    """Parse header bytes (exactly ``HEADER_BYTES`` long). Raises ``CryptoError`` if malformed."""
    if len(raw) < FIXED_HEADER_BYTES or raw[: len(MAGIC)] != MAGIC:
        raise CryptoError("not an FRP encrypted object (bad or missing magic)")
    _magic, version, chunk_size, prefix, wrapped_len = _FIXED.unpack_from(raw)
    if version != FORMAT_VERSION:
        raise CryptoError(f"unsupported format version {version} (expected {FORMAT_VERSION})")
    if not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise CryptoError(f"bad chunk size {chunk_size} in header")
    if wrapped_len != WRAPPED_DEK_BYTES:
        raise CryptoError(f"bad wrapped-key length {wrapped_len} in header")
    if len(raw) != HEADER_BYTES:
        raise CryptoError("truncated header")
    return Header(
        version=version,
        chunk_size=chunk_size,
        nonce_prefix=prefix,
        wrapped_dek=raw[FIXED_HEADER_BYTES:],
        raw=bytes(raw),
    )


def decrypt_stream(*, kek: bytes, aad: bytes, source: BinaryIO) -> Iterator[bytes]:
    """Yield verified plaintext chunks of the object read from ``source``.

    Each yielded chunk has passed its GCM tag, but the stream as a whole is only known to be
    complete once the generator finishes without error: a ``CryptoError`` can still come after
    some chunks were yielded (truncation, dropped last chunk, trailing data, a later tampered
    chunk). A streaming consumer must then discard everything it received; use
    ``decrypt_all`` for all-or-nothing semantics. Memory is O(chunk size).

    Raises ``CryptoError`` (lazily, from the generator) on a wrong KEK, wrong ``aad``, a
    tampered header/wrapped key/chunk, reordered, duplicated or missing chunks, truncation
    and trailing bytes after the final chunk.
    """
    _check_key(kek, "key-encryption key")
    header = read_header(source)
    dek = _unwrap(kek, header, aad)
    aead = AESGCM(dek)
    chunk_aad = _CHUNK_LABEL + header.fixed + aad
    full = header.chunk_size + TAG_BYTES
    counter = 0
    while True:
        sealed = _read_exact(source, full)
        if not sealed:
            raise CryptoError("truncated object: stream ended before the final chunk")
        if len(sealed) < TAG_BYTES:
            raise CryptoError(f"truncated object: chunk {counter} is shorter than its tag")
        last = len(sealed) < full
        nonce = chunk_nonce(header.nonce_prefix, counter, last=last)
        try:
            plaintext = aead.decrypt(nonce, sealed, chunk_aad)
        except InvalidTag:
            raise CryptoError(
                f"chunk {counter} failed authentication (tampered, reordered or truncated)"
            ) from None
        if last:
            if source.read(1):
                raise CryptoError("trailing data after the final chunk")
            yield plaintext
            return
        yield plaintext
        counter += 1


def decrypt_tail(*, kek: bytes, aad: bytes, source: BinaryIO, size: int) -> tuple[bytes, int]:
    """The last ``size`` plaintext bytes of the object in the seekable ``source`` (all of the
    plaintext if it is shorter) and the plaintext's total length in bytes.

    Decrypts only the final chunk and as many chunks before it as ``size`` needs (each one
    verified; the final one with the last-chunk flag, so a truncated or extended object fails):
    what a reader needs to see a trailer before streaming the whole object. It does not verify
    the chunks it skips — read the object with ``decrypt_stream`` before trusting the rest.

    Raises ``CryptoError`` like ``decrypt_stream`` (wrong key or ``aad``, tampered header or
    chunk, an object whose length is not a valid sequence of chunks) and ``ValueError`` for a
    negative ``size``; ``OSError``/``io.UnsupportedOperation`` if ``source`` cannot seek.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    _check_key(kek, "key-encryption key")
    source.seek(0)
    header = read_header(source)
    dek = _unwrap(kek, header, aad)
    aead = AESGCM(dek)
    chunk_aad = _CHUNK_LABEL + header.fixed + aad
    full = header.chunk_size + TAG_BYTES
    body = source.seek(0, os.SEEK_END) - HEADER_BYTES
    if body < TAG_BYTES:
        raise CryptoError("truncated object: stream ended before the final chunk")
    last = (body - TAG_BYTES) // full
    last_len = body - last * full  # sealed length of the final chunk
    if last_len >= full:
        raise CryptoError("truncated object: stream ended before the final chunk")
    if last >= MAX_CHUNKS:
        raise CryptoError("chunk counter overflow: object has more than 2**32 chunks")
    total = last * header.chunk_size + last_len - TAG_BYTES
    parts: list[bytes] = []
    have = 0
    index = last
    while index >= 0 and have < size:
        source.seek(HEADER_BYTES + index * full)
        sealed = _read_exact(source, last_len if index == last else full)
        nonce = chunk_nonce(header.nonce_prefix, index, last=index == last)
        try:
            plaintext = aead.decrypt(nonce, sealed, chunk_aad)
        except InvalidTag:
            raise CryptoError(
                f"chunk {index} failed authentication (tampered, reordered or truncated)"
            ) from None
        parts.append(plaintext)
        have += len(plaintext)
        index -= 1
    tail = b"".join(reversed(parts))
    return tail[len(tail) - min(size, len(tail)) :], total


def decrypt_all(*, kek: bytes, aad: bytes, source: BinaryIO) -> bytes:
    """Decrypt the whole object in memory; return plaintext only if every chunk verified.

    All-or-nothing: on any failure raises ``CryptoError`` and the partial plaintext buffer is
    overwritten before it is dropped. Memory is O(plaintext size). Errors as ``decrypt_stream``.
    """
    buffer = bytearray()
    try:
        for chunk in decrypt_stream(kek=kek, aad=aad, source=source):
            buffer += chunk
    except BaseException:
        buffer[:] = bytes(len(buffer))
        raise
    return bytes(buffer)


def rewrap(*, old_kek: bytes, new_kek: bytes, aad: bytes, header: bytes) -> bytes:
    """Re-wrap the DEK of ``header`` from ``old_kek`` to ``new_kek`` (KEK rotation).

    ``header`` is the object's header (``HEADER_BYTES``, e.g. ``read_header(f).raw``). Returns a
    new header of the same length; replacing the object's first ``HEADER_BYTES`` with it keeps
    every chunk valid, since chunks authenticate only the fixed header part (see module doc).

    Raises ``CryptoError`` if the header is malformed or ``old_kek``/``aad`` do not unwrap it.
    """
    _check_key(new_kek, "new key-encryption key")
    parsed = parse_header(header)
    dek = _unwrap(old_kek, parsed, aad)
    return parsed.fixed + _wrap(new_kek, dek, parsed.fixed, aad)


def _wrap(kek: bytes, dek: bytes, fixed: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(kek).encrypt(nonce, dek, _WRAP_LABEL + fixed + aad)


def _unwrap(kek: bytes, header: Header, aad: bytes) -> bytes:
    _check_key(kek, "key-encryption key")
    nonce, wrapped = header.wrapped_dek[:NONCE_BYTES], header.wrapped_dek[NONCE_BYTES:]
    try:
        dek = AESGCM(kek).decrypt(nonce, wrapped, _WRAP_LABEL + header.fixed + aad)
    except InvalidTag:
        raise CryptoError(
            "cannot unwrap the data key: wrong key-encryption key, wrong site/dataset/version, "
            "or a tampered header"
        ) from None
    if len(dek) != KEY_BYTES:
        raise CryptoError("unwrapped data key has the wrong length")
    return dek


def _check_key(key: bytes, what: str) -> None:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        raise CryptoError(f"{what} must be {KEY_BYTES} bytes")


def _read_exact(source: BinaryIO, size: int) -> bytes:
    """Read up to ``size`` bytes, looping over short reads; fewer only at end of stream."""
    parts: list[bytes] = []
    remaining = size
    while remaining:
        part = source.read(remaining)
        if not part:
            break
        parts.append(part)
        remaining -= len(part)
    return b"".join(parts)
