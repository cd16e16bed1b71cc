"""Object-store boundary of a site's sandbox (site-side, imports no Django).

Contract (``ObjectStore``), the same for every backend:

* keys are ``/``-separated relative paths of segments made of ``A-Z a-z 0-9 . _ -``; a segment may
  not be empty or start with ``.`` (so no ``..``, no hidden/temp names, no absolute keys);
* ``put_file`` is atomic: the object appears only complete, and a failed put leaves nothing
  (a filesystem temp file + ``os.replace``; an S3 PUT or multipart upload completes whole or not);
  an existing object under the same key is replaced;
* ``open`` returns a readable binary stream the caller must close; ``get_bytes`` reads it whole;
* ``exists`` is ``False`` only for a missing object, never for a missing bucket or bad credentials;
* ``delete`` is idempotent (no error for a missing object);
* ``url`` names the store and never contains credentials;
* every failure raises ``StorageError`` with a message naming the key and store; nothing outside
  this module sees ``minio``/``urllib3`` types or exceptions.

Backends: ``FilesystemStore`` (one directory per site, mode 0700 — the embedded default) and
``S3Store`` (any S3 API via the minio SDK: MinIO, SeaweedFS, AWS). ``store_from_url`` builds one
from ``file:///abs/path`` or ``s3://ACCESS:SECRET@host:port/bucket`` (``s3s://`` for TLS).

TLS (``s3s://``, ``secure=True``): the server's certificate and host name are always verified,
against the CA file named by ``?ca=/abs/path/ca.crt`` in the URL (``ca_file``), else
``FRP_S3_CA_FILE``, else the system trust store (``SSL_CERT_FILE`` or certifi's bundle). A
certificate that does not verify, or plain HTTP to a TLS port, raises ``StorageError`` saying so
(with the CA it checked against); such failures are not retried.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import ssl
import tempfile
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable
from urllib.parse import parse_qs, unquote, urlsplit

_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
MAX_KEY_LENGTH = 512
ENV_ACCESS_KEY = "FRP_S3_ACCESS_KEY"
ENV_SECRET_KEY = "FRP_S3_SECRET_KEY"  # noqa: S105 - a variable name
ENV_CA_FILE = "FRP_S3_CA_FILE"
# What Go's HTTP server (MinIO, SeaweedFS) and nginx answer to plain HTTP on a TLS port.
_PLAIN_TO_TLS = re.compile(
    r"HTTP request (was )?sent to (an )?HTTPS|HTTP request to an HTTPS", re.I
)


class StorageError(Exception):
    """Raised for every object-store failure (bad key, missing object/bucket, access, I/O)."""


@runtime_checkable
class ObjectStore(Protocol):
    """What the sandbox needs from an object store; see the module docstring for the contract."""

    @property
    def url(self) -> str:
        """Where the store is, without credentials (``file:///…``, ``s3://host:port/bucket``)."""
        ...

    def put_file(self, key: str, path: Path) -> None:
        """Upload the local file ``path`` as object ``key``, atomically."""
        ...

    def open(self, key: str) -> BinaryIO:
        """Open object ``key`` for reading; the caller closes the stream."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """Return the whole object ``key``."""
        ...

    def exists(self, key: str) -> bool:
        """Whether object ``key`` exists."""
        ...

    def delete(self, key: str) -> None:
        """Remove object ``key`` if present."""
        ...


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key (see module doc), else raise ``StorageError``."""
    if not isinstance(key, str) or not key:
        raise StorageError("object key must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise StorageError(f"object key longer than {MAX_KEY_LENGTH} characters")
    if key.startswith("/"):
        raise StorageError(f"object key {key!r} must be relative, not absolute")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise StorageError(f"object key {key!r} has an empty, '.' or '..' segment")
        if not _SEGMENT.fullmatch(segment):
            raise StorageError(
                f"object key {key!r}: segment {segment!r} must use only A-Z a-z 0-9 . _ - "
                "and not start with '.'"
            )
    return key


class FilesystemStore:
    """Objects as files under ``root`` (created with mode 0700; objects are mode 0600).

    Raises ``StorageError`` if ``root`` cannot be created or made private.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not self.root.is_absolute():
            raise StorageError(f"filesystem store root must be absolute, got {str(root)!r}")
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)
        except OSError as exc:
            raise StorageError(f"cannot create store directory {self.root}: {exc}") from exc

    def __repr__(self) -> str:
        return f"FilesystemStore({str(self.root)!r})"

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def put_file(self, key: str, path: Path) -> None:
        """Copy ``path`` to ``key`` via a temp file in the target directory and ``os.replace``.

        The temp name starts with ``.`` so it can never be read as an object; it is removed on
        any failure. Raises ``StorageError`` (missing source, I/O error).
        """
        target = self._path(key)
        self._make_private_dirs(target.parent)
        fd, tmp_name = tempfile.mkstemp(prefix=".put-", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, target)
            self._fsync_dir(target.parent)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise StorageError(f"cannot store object {key!r} in {self.url}: {exc}") from exc
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise

    def open(self, key: str) -> BinaryIO:
        """Open the object's file for reading. Raises ``StorageError`` if missing."""
        path = self._path(key)
        try:
            return open(path, "rb")  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            raise StorageError(f"object {key!r} not found in {self.url}") from None
        except OSError as exc:
            raise StorageError(f"cannot open object {key!r} in {self.url}: {exc}") from exc

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as stream:
            return stream.read()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete object {key!r} in {self.url}: {exc}") from exc

    def _make_private_dirs(self, directory: Path) -> None:
        """Create ``directory`` and missing parents under root, each with mode 0700."""
        try:
            relative = directory.relative_to(self.root)
            current = self.root
            for part in relative.parts:
                current = current / part
                if not current.is_dir():
                    current.mkdir(mode=0o700, exist_ok=True)
                    os.chmod(current, 0o700)
        except OSError as exc:
            raise StorageError(f"cannot create directory {directory}: {exc}") from exc

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _S3Reader(io.RawIOBase):
    """A raw readable stream over a minio ``get_object`` response; close releases the connection."""

    def __init__(self, response, *, key: str, where: str) -> None:
        super().__init__()
        self._response = response
        self._key = key
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._response.read(len(buffer))
        except Exception as exc:  # urllib3 errors must not leak past the boundary
            raise StorageError(
                f"cannot read object {self._key!r} from {self._where}: {exc}"
            ) from exc
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._response.close()
                self._response.release_conn()
            finally:
                super().close()


class S3Store:
    """Objects in one bucket of an S3 API server, through the minio SDK.

    ``endpoint`` is ``host:port`` (no scheme); ``secure`` selects HTTPS, verified against
    ``ca_file`` (a PEM CA bundle; ``None``: the system trust store). The constructor makes no
    network call (it reads ``ca_file``); ``check()`` verifies the bucket and credentials. Raises
    ``StorageError`` (also for ``ca_file`` without ``secure``, or an unreadable ``ca_file``).
    """

    def __init__(
        self,
        *,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        secure: bool = False,
        region: str | None = None,
        ca_file: Path | None = None,
    ) -> None:
        from minio import Minio  # local import: the ClientApp path rarely needs S3

        if not endpoint or "/" in endpoint:
            raise StorageError(f"S3 endpoint must be 'host:port', got {endpoint!r}")
        if not bucket:
            raise StorageError("S3 bucket name is required")
        if not access_key or not secret_key:
            raise StorageError(f"S3 credentials are required for {endpoint}/{bucket}")
        if ca_file is not None and not secure:
            raise StorageError(
                f"a CA file ({ca_file}) is for TLS: use s3s:// (secure=True) for {endpoint}"
            )
        self.endpoint = endpoint
        self.bucket = bucket
        self.secure = secure
        self.ca_file = Path(ca_file) if ca_file is not None else None
        self._http_url = f"{'https' if secure else 'http'}://{endpoint}"
        try:
            self._client = Minio(
                endpoint,
                access_key=access_key,
                secret_key=secret_key,
                secure=secure,
                region=region,
                http_client=_http_client(self.ca_file),
            )
        except ValueError as exc:
            raise StorageError(f"invalid S3 endpoint {endpoint!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    @property
    def url(self) -> str:
        return f"{'s3s' if self.secure else 's3'}://{self.endpoint}/{self.bucket}"

    def check(self) -> None:
        """Verify the bucket exists and the credentials are accepted. Raises ``StorageError``."""
        try:
            found = self._client.bucket_exists(self.bucket)
        except Exception as exc:
            raise self._error(exc, "check") from exc
        if not found:
            raise StorageError(self._no_bucket())

    def put_file(self, key: str, path: Path) -> None:
        """Upload with ``fput_object`` (multipart above the SDK's part size; atomic in S3)."""
        validate_key(key)
        if not Path(path).is_file():
            raise StorageError(f"cannot store object {key!r}: source file {path} does not exist")
        try:
            self._client.fput_object(self.bucket, key, str(path))
        except Exception as exc:
            raise self._error(exc, "store", key) from exc

    def open(self, key: str) -> BinaryIO:
        """Stream the object (``get_object``); closing the stream releases the connection."""
        validate_key(key)
        try:
            response = self._client.get_object(self.bucket, key)
        except Exception as exc:
            raise self._error(exc, "open", key) from exc
        return io.BufferedReader(_S3Reader(response, key=key, where=self.url), 1 << 20)

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as stream:
            return stream.read()

    def exists(self, key: str) -> bool:
        validate_key(key)
        try:
            self._client.stat_object(self.bucket, key)
            return True
        except Exception as exc:
            if getattr(exc, "code", None) != "NoSuchKey":
                raise self._error(exc, "look up", key) from exc
        # A HEAD on a missing bucket also reports NoSuchKey: tell the two apart.
        self.check()
        return False

    def delete(self, key: str) -> None:
        validate_key(key)
        try:
            self._client.remove_object(self.bucket, key)
        except Exception as exc:
            raise self._error(exc, "delete", key) from exc

    def _no_bucket(self) -> str:
        return f"bucket {self.bucket!r} does not exist at {self._http_url}"

    def _trusted(self) -> str:
        if self.ca_file is not None:
            return f"the CA file {self.ca_file}"
        return (
            f"the system trust store (name the CA with ?ca=/path/ca.crt in the s3s:// URL "
            f"or {ENV_CA_FILE})"
        )

    def _error(self, exc: Exception, action: str, key: str | None = None) -> StorageError:
        from minio.error import InvalidResponseError, S3Error

        what = f"object {key!r} in " if key else ""
        where = f"{what}bucket {self.bucket!r} at {self._http_url}"
        if isinstance(exc, StorageError):
            return exc
        tls = _ssl_cause(exc)
        if isinstance(tls, ssl.SSLCertVerificationError):
            return StorageError(
                f"cannot {action} {where}: the TLS certificate of {self.endpoint} is not trusted "
                f"(certificate verify failed: {tls.verify_message}); checked against "
                f"{self._trusted()}"
            )
        if tls is not None:
            return StorageError(
                f"cannot {action} {where}: TLS handshake with {self.endpoint} failed ({tls}); "
                "is it an HTTPS server? (s3:// is plain HTTP, s3s:// is TLS)"
            )
        if (
            not self.secure
            and isinstance(exc, InvalidResponseError)
            and _PLAIN_TO_TLS.search(str(exc))
        ):
            return StorageError(
                f"cannot {action} {where}: plain HTTP sent to {self.endpoint}, which speaks TLS: "
                "use an s3s:// URL (secure=True) and the CA that signed its certificate"
            )
        if isinstance(exc, S3Error):
            code = exc.code
            if code == "NoSuchBucket":
                return StorageError(self._no_bucket())
            if code == "NoSuchKey":
                return StorageError(f"object {key!r} not found in {self.url}")
            if code in {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"}:
                return StorageError(
                    f"access denied ({code}) to {where}: check the S3 access key and secret key"
                )
            return StorageError(f"cannot {action} {where}: S3 error {code}: {exc.message}")
        return StorageError(f"cannot {action} {where}: {type(exc).__name__}: {exc}")


def _http_client(ca_file: Path | None):
    """The urllib3 pool the minio client uses: minio's own defaults (5 min timeouts, 10
    connections, five retries on 5xx and broken connections), certificates always verified
    against ``ca_file`` (else ``SSL_CERT_FILE`` or certifi's bundle, as minio does), and TLS
    failures not retried (``other=0``: a certificate that does not verify will not later)."""
    import certifi
    import urllib3

    if ca_file is not None:
        try:
            ssl.create_default_context(cafile=str(ca_file))  # readable, and PEM certificates
        except (OSError, ssl.SSLError) as exc:
            raise StorageError(f"the CA file {ca_file} cannot be used: {exc}") from None
    timeout = 300
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=timeout, read=timeout),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=str(ca_file) if ca_file else os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(
            total=5, other=0, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
        ),
    )


def _ssl_cause(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind ``exc`` (urllib3 wraps it in ``SSLError`` and
    ``MaxRetryError.reason``), or ``None``."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        stack += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        stack += [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]
    return None


def store_from_url(url: str) -> ObjectStore:
    """Build a store from a URL.

    * ``file:///abs/path`` → ``FilesystemStore(Path("/abs/path"))``;
    * ``s3://ACCESS:SECRET@host:port/bucket`` → ``S3Store`` over HTTP, ``s3s://…`` over HTTPS;
      without credentials in the URL they come from ``FRP_S3_ACCESS_KEY``/``FRP_S3_SECRET_KEY``;
      an optional ``?region=…`` query sets the region; for ``s3s://``, ``?ca=/abs/path/ca.crt``
      names the CA file the server's certificate is verified with (else ``FRP_S3_CA_FILE``, else
      the system trust store). Credentials are percent-decoded.

    Raises ``StorageError`` for an unknown scheme, a relative path, a missing bucket name,
    missing credentials, or a CA file with ``s3://`` or that cannot be read (messages never
    contain the secret).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise StorageError(f"invalid object store URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StorageError(
                f"file store URL must be file:///abs/path, not host {parts.netloc!r}"
            )
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise StorageError("file store URL must be file:///absolute/path")
        return FilesystemStore(Path(path))
    if scheme in ("s3", "s3s"):
        host = parts.hostname
        if not host:
            raise StorageError("S3 store URL needs a host: s3://ACCESS:SECRET@host:port/bucket")
        if ":" in host:
            host = f"[{host}]"
        endpoint = f"{host}:{port}" if port else host
        bucket = parts.path.strip("/")
        if not bucket or "/" in bucket:
            raise StorageError(f"S3 store URL must name one bucket, got path {parts.path!r}")
        access_key = unquote(parts.username) if parts.username else os.environ.get(ENV_ACCESS_KEY)
        secret_key = unquote(parts.password) if parts.password else os.environ.get(ENV_SECRET_KEY)
        if not access_key or not secret_key:
            raise StorageError(
                f"no S3 credentials for {scheme}://{endpoint}/{bucket}: put them in the URL or set "
                f"{ENV_ACCESS_KEY} and {ENV_SECRET_KEY}"
            )
        query = parse_qs(parts.query)
        region = query.get("region", [None])[0]
        ca = query.get("ca", [None])[0]
        if ca is not None and scheme != "s3s":
            raise StorageError(f"?ca= is for TLS: use s3s://{endpoint}/{bucket} (not s3://)")
        if ca is None and scheme == "s3s":
            ca = os.environ.get(ENV_CA_FILE) or None
        return S3Store(
            endpoint=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            bucket=bucket,
            secure=scheme == "s3s",
            region=region,
            ca_file=Path(ca) if ca else None,
        )
    raise StorageError(
        f"unsupported object store URL scheme {parts.scheme!r} (expected file, s3 or s3s)"
    )
