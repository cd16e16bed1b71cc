"""Secrets at rest in the portal's database (OIDC client secrets), encrypted with a key from the
environment.

Fernet (``cryptography``: AES-128-CBC + HMAC-SHA256, a timestamped token) under ``MultiFernet``:
``FRP_FIELD_KEYS`` is a comma-separated list of Fernet keys (``Fernet.generate_key()``), the first
encrypts and every one decrypts, so a key is rotated by putting the new one first and re-saving.
Without it the embedded default uses the key file ``FRP_FIELD_KEY_FILE`` (created on first use,
mode 0600 in a 0700 folder). A stored value is ``fernet:<token>``; a database dump without the key
holds no usable secret.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

PREFIX = "fernet:"


class SecretBoxError(Exception):
    """A stored secret cannot be decrypted (wrong or missing key), or the key is malformed."""


def _key_file_keys() -> list[bytes]:
    path = Path(settings.FRP_FIELD_KEY_FILE)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".field-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(Fernet.generate_key() + b"\n")
            with contextlib.suppress(FileExistsError):  # the first writer wins
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    return [line.strip() for line in path.read_bytes().splitlines() if line.strip()]


def _box() -> MultiFernet:
    raw = [k.strip().encode() for k in settings.FRP_FIELD_KEYS if k.strip()]
    keys = raw or _key_file_keys()
    try:
        return MultiFernet([Fernet(k) for k in keys])
    except (ValueError, TypeError) as exc:
        raise SecretBoxError(f"FRP_FIELD_KEYS holds a malformed Fernet key: {exc}") from None


def is_sealed(value: str) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def seal(plaintext: str) -> str:
    """``fernet:<token>`` of ``plaintext`` under the first key; ``""`` stays ``""``."""
    if not plaintext:
        return ""
    return PREFIX + _box().encrypt(plaintext.encode()).decode()


def unseal(stored: str) -> str:
    """The plaintext of a sealed value (a value without the prefix is returned as it is: a row
    written before encryption, sealed by migration ``portal/0005``). Raises ``SecretBoxError``."""
    if not is_sealed(stored):
        return stored or ""
    try:
        return _box().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise SecretBoxError(
            "a stored secret does not open with FRP_FIELD_KEYS (was the key changed?)"
        ) from None
