"""The portal's half of the ServerApp callback credential (ADR 0014).

The platform callback key is read from ``settings.FRP_CALLBACK_KEY``, else from the file
``settings.FRP_CALLBACK_KEY_FILE``, which the embedded default creates on first use (mode 0600 in a
0700 folder). Only two places hold it: the portal (which verifies) and the environment of the
SuperLink, whose ServerApp processes inherit it (``serverapp_environment`` says what to set there).
Nothing here goes into a run config. Each job run signs with its own key,
``frp_flwr.signing.job_key(platform key, job id, Flower run id)``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

from django.conf import settings

from frp_flwr.checkpoints import STORE_ENV
from frp_flwr.signing import KEY_ENV, KEY_FILE_ENV, SignatureError, job_key, master_key_from_text


class CallbackKeyError(Exception):
    """The platform callback key is missing or invalid; the message says where it was looked for."""


def _create_key_file(path: Path) -> None:
    """Write a fresh key (64 hex characters) to ``path`` with mode 0600 unless it exists."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".callback-")  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
        with contextlib.suppress(FileExistsError):  # the first writer wins
            os.link(tmp, path)  # atomic, and fails if the file exists
    finally:
        os.unlink(tmp)


def master_key() -> bytes:
    """The platform callback key (bytes). Raises ``CallbackKeyError`` when it is unusable.

    ``FRP_CALLBACK_KEY`` when set; otherwise the key file, created (with a new random key) when it
    does not exist yet.
    """
    if settings.FRP_CALLBACK_KEY:
        text, source = settings.FRP_CALLBACK_KEY, "FRP_CALLBACK_KEY"
    else:
        path = Path(settings.FRP_CALLBACK_KEY_FILE)
        if not path.exists():
            _create_key_file(path)
        text, source = path.read_text(), str(path)
    try:
        return master_key_from_text(text, source=source)
    except SignatureError as exc:
        raise CallbackKeyError(str(exc)) from None


def serverapp_environment() -> dict[str, str]:
    """What the SuperLink's environment needs so its ServerApps can sign (and nothing else).

    ``{"FRP_CALLBACK_KEY_FILE": path}`` for the key file (the key stays in a 0600 file), or
    ``{"FRP_CALLBACK_KEY": key}`` when the portal has it from its own environment; and
    ``FRP_MODEL_STORE_URL``, where the ServerApps save their round checkpoints (it may hold the
    store's credentials).
    """
    master_key()  # creates the file when needed, and checks the key
    store = {STORE_ENV: settings.FRP_MODEL_STORE_URL}  # round checkpoints (frp_flwr.checkpoints)
    if settings.FRP_CALLBACK_KEY:
        return {KEY_ENV: settings.FRP_CALLBACK_KEY, **store}
    return {KEY_FILE_ENV: str(Path(settings.FRP_CALLBACK_KEY_FILE)), **store}


#: Environment variables that must never reach a SuperNode (or its ClientApps).
SECRET_ENV = (KEY_ENV, KEY_FILE_ENV, STORE_ENV)


def run_key(*, job_id: int, run_id: str) -> bytes:
    """The key that signs the callbacks of Flower run ``run_id`` of job ``job_id``."""
    return job_key(master_key(), job_id=job_id, run_id=run_id)
