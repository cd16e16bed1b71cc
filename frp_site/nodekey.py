"""A SuperNode's authentication key pair, made at the site (Flower node authentication).

Flower 1.42 authenticates a SuperNode by an ECDSA key on a NIST curve in OpenSSH format
(``flower-supernode --auth-supernode-private-key``; the SuperLink knows the public key from
``flwr supernode register``). ``key_pair_create`` writes the private key (OpenSSH PEM, mode 0600)
and ``<path>.pub`` (one line, ``ecdsa-sha2-nistp384 AAAA… <comment>``); only the public key ever
leaves the site. ``public_key_check`` is what the portal applies to an uploaded key, and
``fingerprint`` is OpenSSH's ``SHA256:…`` (base64 of the SHA-256 of the key blob, no padding;
the same string ``ssh-keygen -lf`` prints). Raises ``NodeKeyError``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

#: The curves Flower accepts (``flwr.supercore.primitives.asymmetric.uses_nist_ec_curve``).
NIST_CURVES = ("secp256r1", "secp384r1", "secp521r1")
MAX_PUBLIC_KEY_CHARS = 1000


class NodeKeyError(Exception):
    """A key pair could not be made, or a public key is not one Flower accepts."""


def key_pair_create(path: Path, *, comment: str = "") -> str:
    """Write a new P-384 key pair: the private key at ``path`` (0600, never overwritten) and the
    public key at ``<path>.pub``; return the public key line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise NodeKeyError(
            f"{path} exists: a site keeps its key (delete it to make a new one)"
        ) from exc
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    line = f"{public} {comment}".strip()
    Path(f"{path}.pub").write_text(line + "\n")
    return line


def public_key_of(path: Path) -> str:
    """The OpenSSH public key line of the private key at ``path`` (no comment)."""
    try:
        key = serialization.load_ssh_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, UnsupportedAlgorithm) as exc:
        raise NodeKeyError(f"cannot read the SuperNode key {path}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in NIST_CURVES:
        raise NodeKeyError(f"{path} is not an ECDSA key on a NIST curve")
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def public_key_check(text: str) -> str:
    """``text`` as the canonical public key line Flower accepts (type and base64 blob, comment
    dropped). Raises ``NodeKeyError`` for anything else (a private key, RSA, Ed25519, garbage)."""
    if not isinstance(text, str) or not text.strip():
        raise NodeKeyError("no public key given")
    if len(text) > MAX_PUBLIC_KEY_CHARS:
        raise NodeKeyError(f"a public key has at most {MAX_PUBLIC_KEY_CHARS} characters")
    if "PRIVATE KEY" in text:
        raise NodeKeyError("this is a private key: upload only the public key (the .pub file)")
    parts = text.strip().split()
    try:
        key = serialization.load_ssh_public_key(" ".join(parts[:2]).encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise NodeKeyError(f"not an OpenSSH public key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in NIST_CURVES:
        raise NodeKeyError(
            "Flower authenticates SuperNodes only by ECDSA keys on a NIST curve "
            "(e.g. ecdsa-sha2-nistp384)"
        )
    return key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def fingerprint(public_key: str) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a public key line."""
    blob = base64.b64decode(public_key_check(public_key).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
