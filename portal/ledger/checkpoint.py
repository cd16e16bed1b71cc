"""C2SP signed notes and transparency-log checkpoints with Ed25519 (pure, no Django).

This module owns the *signed checkpoint* format of the contribution ledger: the log signs
``(origin, tree size, root hash)`` of its RFC 9162 Merkle tree (see :mod:`portal.ledger.merkle`)
as a signed note, and witnesses (other institutions) may cosign it by appending their own
signature lines.

Formats (all text is UTF-8):

* Checkpoint body, c2sp.org/tlog-checkpoint (C2SP/C2SP ``tlog-checkpoint.md``)::

      <origin>\\n<tree size, decimal, no leading zeros>\\n<base64 root hash>\\n[<extension>\\n ...]

* Signed note, c2sp.org/signed-note (C2SP/C2SP ``signed-note.md``): the text (ending in a
  newline), a blank line, then one line per signature::

      — <key name> <base64(4-byte key ID || Ed25519 signature)>\\n

  with ``key ID = SHA-256(key name || 0x0A || 0x01 || 32-byte public key)[:4]`` (signature
  type ``0x01`` = Ed25519, RFC 8032 signature over the note text).

* Verifier and signer keys, as golang.org/x/mod/sumdb/note (``NewVerifier``/``NewSigner``)::

      <name>+<8 hex digits key ID>+<base64(0x01 || 32-byte public key)>
      PRIVATE+KEY+<name>+<8 hex digits key ID>+<base64(0x01 || 32-byte seed)>

Verification follows the note rules: signatures from unknown keys (name *and* key ID must
match) are ignored; a signature from a known key that does not verify rejects the whole note;
a note with no verified signature from a known key is rejected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

SIGNATURE_TYPE_ED25519 = 0x01
"""Signature type byte of Ed25519 note signatures (c2sp.org/signed-note)."""

MAX_SIGNATURES = 100
"""Most signature lines accepted in one note (the spec requires at least 16; Go allows 100)."""

ROOT_HASH_SIZE = 32
"""A checkpoint's root is an RFC 9162 SHA-256 Merkle tree head."""

_EM_DASH_PREFIX = "\u2014 "
_SIGNER_PREFIX = "PRIVATE+KEY+"
_HEX_KEY_ID = re.compile(r"[0-9a-fA-F]{8}")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_MAX_SIZE = 1 << 64


class CheckpointError(ValueError):
    """A note, checkpoint or key is malformed, or its signatures do not verify."""


@dataclass(frozen=True)
class Checkpoint:
    """A parsed (and, from :func:`verify_note`, verified) checkpoint.

    Attributes:
        origin: the log's identity line, e.g. ``"portal.example.org/ledger"``.
        size: tree size in leaves.
        root_hash: 32-byte RFC 9162 root of the tree at ``size``.
        extensions: optional extension lines (without newlines).
        signed_by: names of the keys whose signatures verified, log key first; empty when
            the checkpoint was only parsed.
    """

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()
    signed_by: tuple[str, ...] = ()

    def body(self) -> str:
        """The checkpoint's note text (see :func:`checkpoint_body`)."""
        return checkpoint_body(self.origin, self.size, self.root_hash, self.extensions)


@dataclass(frozen=True)
class NoteSignature:
    """One signature line of a note.

    Attributes:
        name: key name.
        key_id: the 4-byte key ID.
        signature: the signature bytes after the key ID (64 bytes for Ed25519).
    """

    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        """The signature line, including the trailing newline."""
        payload = base64.b64encode(self.key_id + self.signature).decode("ascii")
        return f"{_EM_DASH_PREFIX}{self.name} {payload}\n"


@dataclass(frozen=True)
class OpenedNote:
    """Result of :func:`open_note`.

    Attributes:
        text: the signed text, including its final newline.
        verified: names of known keys whose signatures verified, in note order, unique.
        unverified: signatures from unknown keys (not checked), in note order.
    """

    text: str
    verified: tuple[str, ...]
    unverified: tuple[NoteSignature, ...]


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _check_key_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise CheckpointError("key name must be a non-empty string")
    if "+" in name or any(ch.isspace() for ch in name):
        raise CheckpointError(f"key name {name!r} contains a space or '+'")


def _check_text(text: str, what: str) -> None:
    if any(ch < " " and ch != "\n" for ch in text):
        raise CheckpointError(f"{what} contains a control character")


def key_id(name: str, public_key: Ed25519PublicKey) -> bytes:
    """Note key ID: ``SHA-256(name || 0x0A || 0x01 || public key)[:4]`` (c2sp.org/signed-note).

    Args:
        name: key name (non-empty, no spaces or ``+``).
        public_key: the Ed25519 public key.

    Returns:
        4 bytes (a big-endian uint32 in the spec's terms).

    Raises:
        CheckpointError: invalid key name.
    """
    _check_key_name(name)
    material = name.encode() + b"\n" + bytes([SIGNATURE_TYPE_ED25519]) + _raw_public(public_key)
    return hashlib.sha256(material).digest()[:4]


def encode_verifier_key(name: str, public_key: Ed25519PublicKey) -> str:
    """Encode a public key as a note verifier key ``<name>+<hex key ID>+<base64(0x01||key)>``.

    Args:
        name: key name (non-empty, no spaces or ``+``).
        public_key: the Ed25519 public key.

    Returns:
        The ``vkey`` string accepted by :func:`decode_verifier_key` and by Go's
        ``note.NewVerifier``.

    Raises:
        CheckpointError: invalid key name.
    """
    encoded = base64.b64encode(bytes([SIGNATURE_TYPE_ED25519]) + _raw_public(public_key))
    return f"{name}+{key_id(name, public_key).hex()}+{encoded.decode('ascii')}"


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise CheckpointError("invalid base64") from exc


def _split_key(text: str, fields: int) -> list[str]:
    if not isinstance(text, str):
        raise CheckpointError("key must be a string")
    parts = text.split("+", fields - 1)  # the base64 key may itself contain '+'
    if len(parts) != fields:
        raise CheckpointError("malformed key")
    return parts


def decode_verifier_key(vkey: str) -> tuple[str, Ed25519PublicKey]:
    """Decode a verifier key made by :func:`encode_verifier_key` (or Go's ``note`` package).

    Args:
        vkey: ``<name>+<hex key ID>+<base64(0x01 || 32-byte public key)>``.

    Returns:
        ``(name, public_key)``.

    Raises:
        CheckpointError: malformed string, unknown signature type, wrong key length, or a key
            ID that does not match the name and key.
    """
    name, hex_id, encoded = _split_key(vkey, 3)
    _check_key_name(name)
    if not _HEX_KEY_ID.fullmatch(hex_id):
        raise CheckpointError("key ID must be 8 hex digits")
    raw = _b64decode(encoded)
    if len(raw) != 33 or raw[0] != SIGNATURE_TYPE_ED25519:
        raise CheckpointError("not an Ed25519 verifier key")
    public_key = Ed25519PublicKey.from_public_bytes(raw[1:])
    if key_id(name, public_key) != bytes.fromhex(hex_id):
        raise CheckpointError("key ID does not match name and key")
    return name, public_key


def encode_signer_key(name: str, private_key: Ed25519PrivateKey) -> str:
    """Encode a private key as ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x01 || seed)>``.

    The format of Go's ``note.GenerateKey``; keep it secret (environment or key store).

    Raises:
        CheckpointError: invalid key name.
    """
    seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    encoded = base64.b64encode(bytes([SIGNATURE_TYPE_ED25519]) + seed).decode("ascii")
    hex_id = key_id(name, private_key.public_key()).hex()
    return f"{_SIGNER_PREFIX}{name}+{hex_id}+{encoded}"


def decode_signer_key(skey: str) -> tuple[str, Ed25519PrivateKey]:
    """Decode a signer key made by :func:`encode_signer_key` (or Go's ``note.GenerateKey``).

    Args:
        skey: ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x01 || 32-byte seed)>``.

    Returns:
        ``(name, private_key)``.

    Raises:
        CheckpointError: malformed string, unknown signature type, wrong seed length, or a key
            ID that does not match the name and derived public key.
    """
    private, key, name, hex_id, encoded = _split_key(skey, 5)
    if f"{private}+{key}+" != _SIGNER_PREFIX:
        raise CheckpointError("signer key must start with PRIVATE+KEY+")
    _check_key_name(name)
    if not _HEX_KEY_ID.fullmatch(hex_id):
        raise CheckpointError("key ID must be 8 hex digits")
    raw = _b64decode(encoded)
    if len(raw) != 33 or raw[0] != SIGNATURE_TYPE_ED25519:
        raise CheckpointError("not an Ed25519 signer key")
    private_key = Ed25519PrivateKey.from_private_bytes(raw[1:])
    if key_id(name, private_key.public_key()) != bytes.fromhex(hex_id):
        raise CheckpointError("key ID does not match name and key")
    return name, private_key


def checkpoint_body(
    origin: str, size: int, root_hash: bytes, extensions: Iterable[str] = ()
) -> str:
    """Checkpoint note text ``"<origin>\\n<size>\\n<base64 root>\\n"`` (c2sp.org/tlog-checkpoint).

    Args:
        origin: the log's identity, non-empty, one line (a schema-less URL is recommended).
        size: tree size in leaves, ``0 <= size < 2**64``.
        root_hash: the 32-byte RFC 9162 root at ``size``.
        extensions: optional non-empty extension lines (not recommended by the spec).

    Returns:
        The body, ending in a newline.

    Raises:
        CheckpointError: empty or multi-line origin or extension, control characters, size out
            of range, or a root that is not 32 bytes.
    """
    if not isinstance(origin, str) or not origin or "\n" in origin:
        raise CheckpointError("origin must be a non-empty single line")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < _MAX_SIZE:
        raise CheckpointError(f"tree size {size!r} outside [0, 2**64)")
    if not isinstance(root_hash, bytes | bytearray) or len(root_hash) != ROOT_HASH_SIZE:
        raise CheckpointError(f"root hash must be {ROOT_HASH_SIZE} bytes")
    lines = [origin, str(size), base64.b64encode(bytes(root_hash)).decode("ascii")]
    for line in extensions:
        if not isinstance(line, str) or not line or "\n" in line:
            raise CheckpointError("extension lines must be non-empty single lines")
        lines.append(line)
    body = "\n".join(lines) + "\n"
    _check_text(body, "checkpoint")
    return body


def parse_checkpoint(body: str) -> Checkpoint:
    """Parse checkpoint note text (c2sp.org/tlog-checkpoint, "Note text").

    Args:
        body: note text: at least three non-empty lines, each ending in a newline.

    Returns:
        :class:`Checkpoint` with empty ``signed_by`` (nothing is verified here).

    Raises:
        CheckpointError: fewer than three lines, empty origin or extension line, a size with a
            sign, leading zero or value >= 2**64, or a root that is not base64 of 32 bytes.
    """
    if not isinstance(body, str) or not body.endswith("\n"):
        raise CheckpointError("checkpoint must end with a newline")
    _check_text(body, "checkpoint")
    lines = body[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError("checkpoint needs origin, size and root lines")
    origin, size_text, root_text, *extensions = lines
    if not origin:
        raise CheckpointError("empty origin")
    if not _DECIMAL.fullmatch(size_text) or int(size_text) >= _MAX_SIZE:
        raise CheckpointError(f"invalid tree size {size_text!r}")
    root_hash = _b64decode(root_text)
    if len(root_hash) != ROOT_HASH_SIZE:
        raise CheckpointError(f"root hash must be {ROOT_HASH_SIZE} bytes")
    if any(not line for line in extensions):
        raise CheckpointError("empty extension line")
    return Checkpoint(origin, int(size_text), root_hash, tuple(extensions))


def parse_note(note: str | bytes) -> tuple[str, tuple[NoteSignature, ...]]:
    """Split a signed note into its text and signature lines, verifying nothing.

    Args:
        note: the whole note (``str``, or UTF-8 ``bytes``).

    Returns:
        ``(text, signatures)``: the text including its final newline, and the signature lines
        in order.

    Raises:
        CheckpointError: invalid UTF-8, control characters, no blank line before the
            signatures, a malformed signature line, no signature, or more than
            :data:`MAX_SIGNATURES`.
    """
    if isinstance(note, bytes | bytearray):
        try:
            note = bytes(note).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError("malformed note: not UTF-8") from exc
    if not isinstance(note, str):
        raise CheckpointError("malformed note")
    _check_text(note, "note")
    split = note.rfind("\n\n")
    if split < 0 or not note.endswith("\n"):
        raise CheckpointError("malformed note")
    text, block = note[: split + 1], note[split + 2 :]
    lines = block.split("\n")[:-1]
    if not lines:
        raise CheckpointError("malformed note: no signatures")
    if len(lines) > MAX_SIGNATURES:
        raise CheckpointError("malformed note: too many signatures")
    signatures = []
    for line in lines:
        if not line.startswith(_EM_DASH_PREFIX):
            raise CheckpointError("malformed note: bad signature line")
        name, sep, encoded = line[len(_EM_DASH_PREFIX) :].partition(" ")
        if not sep:
            raise CheckpointError("malformed note: bad signature line")
        _check_key_name(name)
        raw = _b64decode(encoded)
        if len(raw) < 5:
            raise CheckpointError("malformed note: signature too short")
        signatures.append(NoteSignature(name, raw[:4], raw[4:]))
    return text, tuple(signatures)


_VerifierInput = Mapping[str, Ed25519PublicKey] | Iterable[tuple[str, Ed25519PublicKey]]


def _verifier_table(verifiers: _VerifierInput) -> dict[tuple[str, bytes], Ed25519PublicKey]:
    pairs = verifiers.items() if isinstance(verifiers, Mapping) else verifiers
    table: dict[tuple[str, bytes], Ed25519PublicKey] = {}
    for name, public_key in pairs:
        ident = (name, key_id(name, public_key))
        known = table.get(ident)
        if known is not None and _raw_public(known) != _raw_public(public_key):
            raise CheckpointError(f"ambiguous key {name}+{ident[1].hex()}")
        table[ident] = public_key
    return table


def open_note(note: str | bytes, verifiers: _VerifierInput) -> OpenedNote:
    """Verify a signed note against any of several keys (c2sp.org/signed-note, "Signatures").

    Signatures whose (name, key ID) matches no verifier are ignored; every signature that
    matches a verifier must verify; at least one must.

    Args:
        note: the whole note.
        verifiers: ``{name: public key}`` or ``(name, public key)`` pairs (several keys may
            share a name, e.g. during key rotation).

    Returns:
        :class:`OpenedNote` with the text and the names that verified.

    Raises:
        CheckpointError: malformed note, an invalid signature from a known key, two different
            verifiers with the same name and key ID, or no verified signature.
    """
    text, signatures = parse_note(note)
    table = _verifier_table(verifiers)
    message = text.encode("utf-8")
    verified: list[str] = []
    unverified: list[NoteSignature] = []
    for sig in signatures:
        public_key = table.get((sig.name, sig.key_id))
        if public_key is None:
            if sig not in unverified:
                unverified.append(sig)
            continue
        try:
            public_key.verify(sig.signature, message)
        except InvalidSignature as exc:
            raise CheckpointError(
                f"invalid signature for key {sig.name}+{sig.key_id.hex()}"
            ) from exc
        if sig.name not in verified:
            verified.append(sig.name)
    if not verified:
        raise CheckpointError("note has no verifiable signatures")
    return OpenedNote(text, tuple(verified), tuple(unverified))


def _signature_line(text: str, key_name: str, private_key: Ed25519PrivateKey) -> NoteSignature:
    ident = key_id(key_name, private_key.public_key())
    return NoteSignature(key_name, ident, private_key.sign(text.encode("utf-8")))


def sign_note(body: str, *, key_name: str, private_key: Ed25519PrivateKey) -> str:
    """Sign note text with Ed25519 (c2sp.org/signed-note).

    Args:
        body: the note text, ending in a newline (e.g. from :func:`checkpoint_body`).
        key_name: the signer's key name (for a log, its origin is recommended).
        private_key: the Ed25519 private key.

    Returns:
        ``body + "\\n" + "— <key name> <base64(key ID || signature)>\\n"``.

    Raises:
        CheckpointError: empty body, no final newline, control characters, or bad key name.
    """
    if not isinstance(body, str) or not body.endswith("\n") or body == "\n":
        raise CheckpointError("note text must be non-empty and end with a newline")
    _check_text(body, "note text")
    return body + "\n" + _signature_line(body, key_name, private_key).line()


def cosign(note: str, *, key_name: str, private_key: Ed25519PrivateKey) -> str:
    """Append a cosignature (another key's signature line) to a signed note.

    The text is not re-verified here (a witness should :func:`verify_note` first). A previous
    signature by the same key (same name and key ID) is replaced.

    Args:
        note: a signed note.
        key_name: the cosigner's key name.
        private_key: the cosigner's Ed25519 private key.

    Returns:
        The note with the cosignature as its last line.

    Raises:
        CheckpointError: malformed note or bad key name.
    """
    text, signatures = parse_note(note)
    new = _signature_line(text, key_name, private_key)
    kept = [s for s in signatures if (s.name, s.key_id) != (new.name, new.key_id)]
    if len(kept) + 1 > MAX_SIGNATURES:
        raise CheckpointError("too many signatures")
    return text + "\n" + "".join(s.line() for s in [*kept, new])


def verify_note(
    note: str | bytes,
    *,
    key_name: str,
    public_key: Ed25519PublicKey,
    cosigners: _VerifierInput | None = None,
    origin: str | None = None,
) -> Checkpoint:
    """Verify a signed checkpoint: the log's signature is required, cosignatures are checked.

    Args:
        note: the signed checkpoint note.
        key_name: the log's key name.
        public_key: the log's Ed25519 public key.
        cosigners: optional witness keys (``{name: key}`` or pairs); their signatures are
            verified when present and listed in ``signed_by``, but not required.
        origin: if given, the checkpoint's origin line must equal it.

    Returns:
        :class:`Checkpoint` with ``signed_by`` = log key name, then verified cosigners.

    Raises:
        CheckpointError: malformed note or checkpoint, no valid signature by
            ``key_name``/``public_key`` (including a wrong key name), an invalid signature from
            any known key, or an origin mismatch.
    """
    log = (key_name, public_key)
    extra = (
        []
        if cosigners is None
        else list(cosigners.items() if isinstance(cosigners, Mapping) else cosigners)
    )
    opened = open_note(note, [log, *extra])
    log_ident = (key_name, key_id(key_name, public_key))
    _, signatures = parse_note(note)
    if not any((s.name, s.key_id) == log_ident for s in signatures):
        raise CheckpointError(f"no signature by log key {key_name}+{log_ident[1].hex()}")
    checkpoint = parse_checkpoint(opened.text)
    if origin is not None and checkpoint.origin != origin:
        raise CheckpointError(f"origin {checkpoint.origin!r} is not {origin!r}")
    signed_by = (key_name, *(name for name in opened.verified if name != key_name))
    return Checkpoint(
        checkpoint.origin, checkpoint.size, checkpoint.root_hash, checkpoint.extensions, signed_by
    )
