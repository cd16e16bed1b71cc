"""Signatures of ServerApp → portal callbacks (shared by both sides; imports no Django, no flwr).

Who holds what (ADR 0014): one **platform callback key** (``FRP_CALLBACK_KEY``, ≥ 32 characters, or
a file named by ``FRP_CALLBACK_KEY_FILE``) exists only in the portal's settings and in the
environment of the SuperLink, whose ServerApp processes inherit it (flwr 1.42: ``flower-superlink``
starts ``flower-superexec``, which starts ``flwr-serverapp``, both with ``subprocess.Popen`` and
no ``env=``). It never travels in a run config, node config or message, so no SuperNode sees it.

Each run signs with its own **job key** = HKDF-SHA256 (RFC 5869) of the platform key with salt
``frp-callback-v1`` and info ``job=<job id>;run=<Flower run id>``: a key seen anywhere is good for one
run of one job only.

Scheme (after Stripe's webhook signatures): ``X-FRP-Timestamp: <unix seconds>`` and
``X-FRP-Signature: v1=<hex HMAC-SHA256(job key, b"<ts>." + body)>`` (RFC 2104). The receiver
recomputes it in constant time and refuses timestamps more than ``MAX_SKEW_SECONDS`` from its
clock; within that window the body's ``seq`` (``frp_flwr.contract``) stops replays.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TIMESTAMP_HEADER = "X-FRP-Timestamp"
SIGNATURE_HEADER = "X-FRP-Signature"
MAX_SKEW_SECONDS = 300

#: Environment of the ServerApp's host: the platform callback key, or the file holding it.
KEY_ENV = "FRP_CALLBACK_KEY"
KEY_FILE_ENV = "FRP_CALLBACK_KEY_FILE"
#: Fewest characters of a platform callback key (``secrets.token_hex(32)`` gives 64).
MIN_KEY_CHARS = 32
_SALT = b"frp-callback-v1"


class SignatureError(Exception):
    """The signature is missing, malformed, stale or wrong — or no key is configured."""


def master_key_from_text(text: str, *, source: str) -> bytes:
    """The platform key's bytes from its text (surrounding whitespace ignored).

    Raises ``SignatureError`` when it is shorter than ``MIN_KEY_CHARS`` characters.
    """
    text = (text or "").strip()
    if len(text) < MIN_KEY_CHARS:
        raise SignatureError(
            f"the callback key from {source} is missing or shorter than {MIN_KEY_CHARS} characters"
        )
    return text.encode()


def master_key_from_environ(environ: Mapping[str, str] | None = None) -> bytes:
    """The platform key on the ServerApp's host: ``FRP_CALLBACK_KEY``, else the file named by
    ``FRP_CALLBACK_KEY_FILE``. Raises ``SignatureError`` when neither gives a key."""
    environ = os.environ if environ is None else environ
    if environ.get(KEY_ENV):
        return master_key_from_text(environ[KEY_ENV], source=KEY_ENV)
    path = environ.get(KEY_FILE_ENV)
    if not path:
        raise SignatureError(
            f"no callback key on this host: set {KEY_ENV} or {KEY_FILE_ENV} in the SuperLink's "
            "environment"
        )
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SignatureError(f"cannot read {KEY_FILE_ENV}: {exc.strerror}") from None
    return master_key_from_text(text, source=KEY_FILE_ENV)


def job_key(master: bytes, *, job_id: int, run_id: int | str) -> bytes:
    """The 32-byte key that signs the callbacks of Flower run ``run_id`` of portal job ``job_id``.

    HKDF-SHA256 (RFC 5869), salt ``b"frp-callback-v1"``, info ``b"job=<job_id>;run=<run_id>"``.
    """
    info = f"job={int(job_id)};run={int(run_id)}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info).derive(master)


def sign(key: bytes, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """Return the two headers that sign ``body`` (bytes) with ``key`` (a job key, bytes)."""
    if isinstance(key, str):
        key = key.encode()
    ts = int(time.time()) if timestamp is None else int(timestamp)
    mac = hmac.new(key, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: f"v1={mac}"}


def verify(
    key: bytes,
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
    try:
        skew = abs(now - ts)
    except OverflowError:  # an integer too large for a float (over 308 digits)
        raise SignatureError("timestamp outside the allowed window") from None
    if skew > MAX_SKEW_SECONDS:
        raise SignatureError("timestamp outside the allowed window")
    if not signature.startswith("v1="):
        raise SignatureError("unknown signature scheme")
    expected = sign(key, body, timestamp=ts)[SIGNATURE_HEADER]
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise SignatureError("signature does not match")
