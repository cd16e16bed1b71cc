"""A site's key-encryption keys (KEKs), kept only at the site (site-side, imports no Django).

Layout: a directory (mode 0700) holding one ``<site>.kek`` file per site: 32 raw bytes, mode 0600.
After a rotation (``SiteKeyring.rotate``) the previous keys stay beside it as ``<site>.kek.<n>``
(``n`` = 1, 2, … in rotation order, mode 0600) until every object wrapped under them has been
re-wrapped (``rewrap_object``) and the steward retires them (``SiteKeyring.retire``).
An environment variable ``FRP_KEK_<SITE>`` (site upper-cased, every character other than A-Z and
0-9 replaced by ``_``; e.g. ``hospital-a`` → ``FRP_KEK_HOSPITAL_A``) holding 64 hex digits
overrides the file, for deployments that inject secrets through the environment.

A KEK only wraps per-dataset-version data keys (``sandbox.crypto``); it never leaves the site.
Rotation therefore never re-encrypts data: ``rewrap_object`` replaces only an object's header
(its wrapped data key, ``crypto.rewrap``), keeping every ciphertext byte after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandbox.crypto import (
    HEADER_BYTES,
    KEY_BYTES,
    CryptoError,
    decrypt_stream,
    generate_key,
    read_header,
    rewrap,
)
from sandbox.storage import ObjectStore, StorageError

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

    def previous_path(self, site: str, n: int) -> Path:
        """Path of ``site``'s ``n``-th previous key file, ``<site>.kek.<n>``."""
        return self.path / f"{_check_site(site)}.kek.{int(n)}"

    def previous(self, site: str) -> list[int]:
        """Numbers ``n`` of ``site``'s kept previous keys (``<site>.kek.<n>``), oldest first."""
        prefix = f"{_check_site(site)}.kek."
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(
            int(name[len(prefix) :])
            for name in names
            if name.startswith(prefix) and name[len(prefix) :].isdigit()
        )

    def get_previous(self, site: str, n: int) -> bytes:
        """Return ``site``'s ``n``-th previous KEK (same checks as ``get``'s key file).

        Raises ``KeyringError`` if it is missing, insecure or malformed.
        """
        path = self.previous_path(site, n)
        return self._read_file(path, f"previous key {n} of site {site!r}")

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
        if not path.exists() and not path.is_symlink():
            raise KeyringError(
                f"no key-encryption key for site {site!r}: looked for environment variable "
                f"{var} and file {path}"
            )
        return self._read_file(path, f"the key of site {site!r}")

    @staticmethod
    def _read_file(path: Path, what: str) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise KeyringError(f"no key file {path} ({what})") from None
        except OSError as exc:
            raise KeyringError(f"cannot read key file {path} for {what}: {exc}") from exc
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
        try:
            with _staged_key_file(self.path, key) as tmp:
                os.link(tmp, path)
        except FileExistsError:
            raise KeyringError(
                f"a key for site {site!r} already exists at {path}; refusing to overwrite it"
            ) from None
        except OSError as exc:
            raise KeyringError(f"cannot write key file {path}: {exc}") from exc
        return key

    def rotate(self, site: str) -> tuple[bytes, bytes]:
        """Replace ``site``'s KEK by a new one; return ``(old_kek, new_kek)``.

        The old key is kept as ``<site>.kek.<n>`` (``n`` one above the highest kept, from 1; a
        hard link to the old file, so it keeps its 0600 mode) and the new key replaces
        ``<site>.kek`` atomically (temp file + ``os.replace``): a crash leaves either the old key
        in place or both keys on disk, never no key. Objects wrapped under the old key must then
        be re-wrapped with ``rewrap_object``; ``retire`` removes the old key afterwards.

        Raises ``KeyringError`` if the site has no key (``get``'s message), if its key comes from
        ``FRP_KEK_<SITE>`` (rotate it where the variable is managed), or on an I/O error.
        """
        var = env_var_name(site)
        if var in os.environ:
            raise KeyringError(
                f"the key of site {site!r} is set by {var}: rotate it where that variable is "
                "managed, not in the keyring directory"
            )
        old = self.get(site)
        path = self.key_path(site)
        keep = self.previous_path(site, max(self.previous(site), default=0) + 1)
        new = generate_key()
        try:
            with _staged_key_file(self.path, new) as tmp:
                os.link(path, keep)
                os.replace(tmp, path)
            _fsync_dir(self.path)
        except FileExistsError:
            raise KeyringError(
                f"{keep} already exists: another rotation of site {site!r} is running"
            ) from None
        except OSError as exc:
            raise KeyringError(f"cannot rotate the key of site {site!r}: {exc}") from exc
        return old, new

    def retire(self, site: str, n: int) -> None:
        """Delete ``site``'s ``n``-th previous key — only once no object is wrapped under it.

        Raises ``KeyringError`` if that key does not exist.
        """
        path = self.previous_path(site, n)
        try:
            path.unlink()
        except FileNotFoundError:
            raise KeyringError(f"no previous key {n} of site {site!r} at {path}") from None
        except OSError as exc:
            raise KeyringError(f"cannot delete {path}: {exc}") from exc


@contextlib.contextmanager
def _staged_key_file(directory: Path, key: bytes):
    """Yield the path of a temp file in ``directory`` holding ``key`` (mode 0600, fsynced); the
    caller links or renames it into place; whatever is left is removed afterwards."""
    fd, tmp = tempfile.mkstemp(prefix=".new-", dir=directory)  # mkstemp creates it 0600
    try:
        try:
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RewrapResult:
    """Outcome of ``rewrap_object``: the object's new size (bytes) and SHA-256 hex (record it:
    the header changed, so the object's hash did), and ``changed`` — ``False`` when the object
    was already wrapped under the new key (a resumed rotation) and was left untouched."""

    key: str
    changed: bool
    size_bytes: int
    ciphertext_sha256: str


def _unwraps(kek: bytes, header: bytes, aad: bytes) -> bool:
    try:
        rewrap(old_kek=kek, new_kek=kek, aad=aad, header=header)
    except CryptoError:
        return False
    return True


def _hash_object(store: ObjectStore, key: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with store.open(key) as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def rewrap_object(
    store: ObjectStore,
    key: str,
    *,
    old_kek: bytes,
    new_kek: bytes,
    aad: bytes,
    tmp_dir: Path | None = None,
) -> RewrapResult:
    """Re-wrap the data key of encrypted object ``key`` from ``old_kek`` to ``new_kek``.

    Only the header changes (``crypto.rewrap``); every byte after ``HEADER_BYTES`` is copied
    unchanged, so the data is never re-encrypted. The new object is written to a temp file
    (ciphertext only; in ``tmp_dir``, default the system temp dir), verified there — it must
    decrypt completely under ``new_kek`` and its data key must no longer unwrap under
    ``old_kek`` — and only then replaces the object (``ObjectStore.put_file``, atomic). An
    object already wrapped under ``new_kek`` is left as is (``changed=False``), so an
    interrupted rotation can simply be run again. ``aad`` is the object's associated data
    (``crypto.associated_data(site=…, dataset=…, version=…)``).

    Raises ``KeyringError`` if the keys are equal, neither key unwraps the object's data key
    (wrong key or wrong ``aad``), the object is malformed or fails verification, or the store
    fails (the store's message is included).
    """
    if bytes(old_kek) == bytes(new_kek):
        raise KeyringError("the old and new key-encryption keys are the same")
    try:
        with store.open(key) as source:
            header = read_header(source).raw
            try:
                new_header = rewrap(old_kek=old_kek, new_kek=new_kek, aad=aad, header=header)
            except CryptoError:
                if not _unwraps(new_kek, header, aad):
                    raise KeyringError(
                        f"object {key!r}: neither the old nor the new key unwraps its data key "
                        "(wrong key, or wrong site/dataset/version)"
                    ) from None
                size, sha256 = _hash_object(store, key)
                return RewrapResult(
                    key=key, changed=False, size_bytes=size, ciphertext_sha256=sha256
                )
            fd, tmp_name = tempfile.mkstemp(prefix=".frp-rewrap-", suffix=".enc", dir=tmp_dir)
            try:
                digest = hashlib.sha256(new_header)
                size = len(new_header)
                with os.fdopen(fd, "wb") as sink:
                    sink.write(new_header)
                    while block := source.read(1 << 20):
                        sink.write(block)
                        digest.update(block)
                        size += len(block)
                    sink.flush()
                    os.fsync(sink.fileno())
                _verify(Path(tmp_name), key=key, old_kek=old_kek, new_kek=new_kek, aad=aad)
                store.put_file(key, Path(tmp_name))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name)
        with store.open(key) as check:
            if check.read(HEADER_BYTES) != new_header:
                raise KeyringError(f"object {key!r} changed while it was being re-wrapped")
    except CryptoError as exc:
        raise KeyringError(f"object {key!r}: {exc}") from None
    except StorageError as exc:
        raise KeyringError(f"cannot re-wrap object {key!r}: {exc}") from exc
    return RewrapResult(
        key=key, changed=True, size_bytes=size, ciphertext_sha256=digest.hexdigest()
    )


def _verify(path: Path, *, key: str, old_kek: bytes, new_kek: bytes, aad: bytes) -> None:
    with open(path, "rb") as stream:
        for _chunk in decrypt_stream(kek=new_kek, aad=aad, source=stream):
            pass  # every chunk authenticates under the new key's data key
        stream.seek(0)
        header = stream.read(HEADER_BYTES)
    if _unwraps(old_kek, header, aad):
        raise KeyringError(f"object {key!r}: the old key still unwraps the re-wrapped data key")
