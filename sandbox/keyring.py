"""A site's key-encryption keys (KEKs), kept only at the site (site-side, imports no Django).

Layout: a directory (mode 0700) holding one ``<site>.kek`` file per site: 32 raw bytes, mode 0600.
An environment variable ``FRP_KEK_<SITE>`` (site upper-cased, every character other than A-Z and
0-9 replaced by ``_``; e.g. ``hospital-a`` → ``FRP_KEK_HOSPITAL_A``) holding 64 hex digits
overrides the file, for deployments that inject secrets through the environment.

A KEK only wraps per-dataset-version data keys (``sandbox.crypto``); it never leaves the site.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path

from sandbox.crypto import KEY_BYTES, generate_key

_SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")


class KeyringError(Exception):
    """Raised when a key is missing, malformed, insecurely stored or would be overwritten."""


def env_var_name(site: str) -> str:
    """The environment variable that overrides ``site``'s key file, e.g. ``FRP_KEK_HOSPITAL_A``."""
    return "FRP_KEK_" + re.sub(r"[^A-Z0-9]", "_", _check_site(site).upper())


def _check_site(site: str) -> str:
    if not isinstance(site, str) or not _SITE.fullmatch(site):
        raise KeyringError(
            f"invalid site name {site!r}: use letters, digits, '-' and '_' (at most 100)"
        )
    return site


class SiteKeyring:
    """KEKs of the sites hosted on this machine, stored under ``path`` (see module doc).

    The directory is created with mode 0700 on first ``create``; reading does not create it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"SiteKeyring({str(self.path)!r})"

    def key_path(self, site: str) -> Path:
        """Path of ``site``'s key file (whether or not it exists)."""
        return self.path / f"{_check_site(site)}.kek"

    def exists(self, site: str) -> bool:
        """Whether a key for ``site`` is available (environment variable or key file)."""
        return env_var_name(site) in os.environ or self.key_path(site).is_file()

    def get(self, site: str) -> bytes:
        """Return ``site``'s 32-byte KEK, from ``FRP_KEK_<SITE>`` (hex) if set, else the key file.

        Raises ``KeyringError`` if neither exists (naming the variable and file it looked at),
        the variable is not 64 hex digits, the file is not a regular 32-byte file, or the file
        has any group/other permission bit set (it must be 0600 or stricter).
        """
        var = env_var_name(site)
        value = os.environ.get(var)
        if value is not None:
            try:
                key = bytes.fromhex(value.strip())
            except ValueError:
                raise KeyringError(f"{var} is not valid hex (expected 64 hex digits)") from None
            if len(key) != KEY_BYTES:
                raise KeyringError(f"{var} must hold {2 * KEY_BYTES} hex digits")
            return key
        path = self.key_path(site)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise KeyringError(
                f"no key-encryption key for site {site!r}: looked for environment variable "
                f"{var} and file {path}"
            ) from None
        except OSError as exc:
            raise KeyringError(f"cannot read key file {path} for site {site!r}: {exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise KeyringError(f"key file {path} is not a regular file")
            mode = stat.S_IMODE(info.st_mode)
            if mode & 0o077:
                raise KeyringError(
                    f"key file {path} has insecure permissions {mode:04o}: it must not be "
                    f"accessible by group or others (chmod 600 {path})"
                )
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            raise KeyringError(f"key file {path} must hold exactly {KEY_BYTES} bytes")
        return key

    def create(self, site: str) -> bytes:
        """Generate, store (mode 0600) and return a new 32-byte KEK for ``site``.

        The file appears atomically and complete (temp file + ``os.link``, which never
        overwrites). Raises ``KeyringError`` if a key file already exists, if ``FRP_KEK_<SITE>``
        is set (a file would be shadowed by it), or on an I/O error.
        """
        var = env_var_name(site)
        if var in os.environ:
            raise KeyringError(
                f"the key for site {site!r} is set by {var}; refusing to create a key file it "
                "would shadow"
            )
        path = self.key_path(site)
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.path, 0o700)
        except OSError as exc:
            raise KeyringError(f"cannot create keyring directory {self.path}: {exc}") from exc
        key = generate_key()
        fd, tmp = tempfile.mkstemp(prefix=".new-", dir=self.path)
        try:
            os.write(fd, key)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.link(tmp, path)
        except FileExistsError:
            raise KeyringError(
                f"a key for site {site!r} already exists at {path}; refusing to overwrite it"
            ) from None
        except OSError as exc:
            raise KeyringError(f"cannot write key file {path}: {exc}") from exc
        finally:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return key
