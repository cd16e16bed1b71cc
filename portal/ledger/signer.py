"""The platform's checkpoint signing key (Ed25519, as a C2SP note signer key).

From ``settings.FRP_LEDGER_SIGNER_KEY``, or from the key file ``settings.FRP_LEDGER_KEY_FILE``, which
is created (mode 0600, key named after ``settings.FRP_LEDGER_ORIGIN``) the first time it is needed.
Every process that signs (the worker) or shows the key (the web) must see the same key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.conf import settings

from portal.ledger import checkpoint as notes
from portal.ledger.leaves import LedgerError

_signer_lock = threading.Lock()
_signer_cache: dict[tuple[str, str], tuple[str, Ed25519PrivateKey]] = {}


def _create_key_file(path: Path, origin: str) -> None:
    """Write a fresh signer key to ``path`` (mode 0600) unless another process got there first."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    skey = notes.encode_signer_key(origin, Ed25519PrivateKey.generate())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".signer-")  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(skey + "\n")
        with contextlib.suppress(FileExistsError):  # the first writer wins
            os.link(tmp, path)  # atomic, and fails if the file exists
    finally:
        os.unlink(tmp)


def ledger_signer() -> tuple[str, Ed25519PrivateKey]:
    """The platform's checkpoint signer: ``(key name, Ed25519 private key)``.

    From ``settings.FRP_LEDGER_SIGNER_KEY`` when set, else from the file
    ``settings.FRP_LEDGER_KEY_FILE``; the file is created with a new key named after
    ``settings.FRP_LEDGER_ORIGIN`` (mode 0600, its folder 0700) when it does not exist. Every
    process that signs or shows the key must see the same key: in a multi-host deployment set
    ``FRP_LEDGER_SIGNER_KEY`` (or share the file).

    Raises:
        LedgerError: the configured key (or the file's content) is not a valid note signer key.
    """
    skey_setting = settings.FRP_LEDGER_SIGNER_KEY
    path = Path(settings.FRP_LEDGER_KEY_FILE)
    cache_key = (skey_setting, str(path))
    with _signer_lock:
        cached = _signer_cache.get(cache_key)
        if cached is not None:
            return cached
        source = "FRP_LEDGER_SIGNER_KEY"
        if not skey_setting:
            source = str(path)
            if not path.exists():
                _create_key_file(path, settings.FRP_LEDGER_ORIGIN)
            skey_setting = path.read_text().strip()
        try:
            signer = notes.decode_signer_key(skey_setting)
        except notes.CheckpointError as exc:
            raise LedgerError(f"ledger signer key from {source} is invalid: {exc}") from exc
        _signer_cache[cache_key] = signer
        return signer


def ledger_verifier() -> tuple[str, Ed25519PublicKey]:
    """The platform's checkpoint verifier: ``(key name, Ed25519 public key)``."""
    name, private_key = ledger_signer()
    return name, private_key.public_key()


def ledger_verifier_key() -> str:
    """The platform's note verifier key ``<name>+<hex key ID>+<base64>`` (publish it)."""
    name, public_key = ledger_verifier()
    return notes.encode_verifier_key(name, public_key)
