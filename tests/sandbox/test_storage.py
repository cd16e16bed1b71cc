"""Tests for sandbox.storage: the filesystem store and the S3 store against a real SeaweedFS."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import uuid

import pytest

from sandbox.storage import (
    FilesystemStore,
    ObjectStore,
    S3Store,
    StorageError,
    store_from_url,
    validate_key,
)


def _file(tmp_path, content: bytes, name: str = "src.bin"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


# --- FilesystemStore -------------------------------------------------------------------------


def test_filesystem_store_round_trip(tmp_path):
    store = FilesystemStore(tmp_path / "store")
    src = _file(tmp_path, b"ciphertext bytes")

    store.put_file("site-a/ds/v1.csv.enc", src)

    assert store.exists("site-a/ds/v1.csv.enc")
    assert store.get_bytes("site-a/ds/v1.csv.enc") == b"ciphertext bytes"
    with store.open("site-a/ds/v1.csv.enc") as stream:
        assert stream.read(4) == b"ciph"
    store.delete("site-a/ds/v1.csv.enc")
    assert not store.exists("site-a/ds/v1.csv.enc")
    store.delete("site-a/ds/v1.csv.enc")  # idempotent


def test_filesystem_store_is_an_object_store(tmp_path):
    assert isinstance(FilesystemStore(tmp_path / "s"), ObjectStore)


def test_filesystem_store_directories_are_private(tmp_path):
    store = FilesystemStore(tmp_path / "store")
    store.put_file("a/b/c.enc", _file(tmp_path, b"x"))

    for path in (store.root, store.root / "a", store.root / "a" / "b"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE((store.root / "a" / "b" / "c.enc").stat().st_mode) == 0o600


def test_filesystem_store_tightens_existing_root(tmp_path):
    root = tmp_path / "store"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # noqa: S103 - the loose mode under test

    FilesystemStore(root)

    assert stat.S_IMODE(root.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    "key",
    [
        "../escape",
        "a/../../b",
        "/etc/passwd",
        "a//b",
        "",
        "a/./b",
        ".hidden",
        "a/.put-x.tmp",
        "a\\b",
    ],
)
def test_filesystem_store_key_traversal_refused(tmp_path, key):
    store = FilesystemStore(tmp_path / "store")
    with pytest.raises(StorageError):
        store.put_file(key, _file(tmp_path, b"x"))
    with pytest.raises(StorageError):
        store.exists(key)
    assert not (tmp_path / "escape").exists()


def test_validate_key_accepts_dataset_keys():
    assert (
        validate_key("hospital-a/cohort_2024/v12.csv.enc") == "hospital-a/cohort_2024/v12.csv.enc"
    )


def test_filesystem_store_failed_put_leaves_nothing(tmp_path, monkeypatch):
    store = FilesystemStore(tmp_path / "store")
    src = _file(tmp_path, b"x" * 100_000)

    def broken_copy(src_f, dst_f, length=0):
        dst_f.write(src_f.read(10))
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "copyfileobj", broken_copy)
    with pytest.raises(StorageError, match="disk full"):
        store.put_file("s/d/v1.csv.enc", src)

    assert not store.exists("s/d/v1.csv.enc")
    assert [p.name for p in (store.root / "s" / "d").iterdir()] == []


def test_filesystem_store_failed_put_keeps_previous_object(tmp_path, monkeypatch):
    store = FilesystemStore(tmp_path / "store")
    store.put_file("s/obj", _file(tmp_path, b"old"))

    def broken_replace(src, dst):
        raise OSError("replace failed")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(StorageError):
        store.put_file("s/obj", _file(tmp_path, b"new", "new.bin"))

    assert store.get_bytes("s/obj") == b"old"
    assert [p.name for p in (store.root / "s").iterdir()] == ["obj"]


def test_filesystem_store_missing_source_or_object(tmp_path):
    store = FilesystemStore(tmp_path / "store")
    with pytest.raises(StorageError):
        store.put_file("s/obj", tmp_path / "missing.bin")
    assert list((store.root / "s").iterdir()) == []
    with pytest.raises(StorageError, match="not found"):
        store.open("s/obj")


# --- store_from_url --------------------------------------------------------------------------


def test_store_from_url_file(tmp_path):
    store = store_from_url((tmp_path / "sitestore").as_uri())
    assert isinstance(store, FilesystemStore)
    assert store.root == tmp_path / "sitestore"
    assert store.url == (tmp_path / "sitestore").as_uri()


def test_store_from_url_s3_with_credentials_in_url():
    store = store_from_url("s3://AK%2F1:SE%40CRET@127.0.0.1:9000/bucket-a")
    assert isinstance(store, S3Store)
    assert (store.endpoint, store.bucket, store.secure) == ("127.0.0.1:9000", "bucket-a", False)
    assert store.url == "s3://127.0.0.1:9000/bucket-a"
    assert "SE" not in store.url


def test_store_from_url_s3s_credentials_from_env(monkeypatch):
    monkeypatch.setenv("FRP_S3_ACCESS_KEY", "ak")
    monkeypatch.setenv("FRP_S3_SECRET_KEY", "sk")
    store = store_from_url("s3s://minio.site-a.example:9443/data")
    assert store.secure
    assert store.url == "s3s://minio.site-a.example:9443/data"


def test_store_from_url_s3_without_credentials(monkeypatch):
    monkeypatch.delenv("FRP_S3_ACCESS_KEY", raising=False)
    monkeypatch.delenv("FRP_S3_SECRET_KEY", raising=False)
    with pytest.raises(StorageError, match="FRP_S3_ACCESS_KEY"):
        store_from_url("s3://127.0.0.1:9000/bucket")


@pytest.mark.parametrize(
    "url", ["ftp://host/x", "file://remotehost/x", "file:relative/path", "s3://a:b@host:1/"]
)
def test_store_from_url_rejects(url):
    with pytest.raises(StorageError) as info:
        store_from_url(url)
    assert ":b@" not in str(info.value)


def test_store_from_url_unknown_scheme_names_it():
    with pytest.raises(StorageError, match="unsupported object store URL scheme 'ftp'"):
        store_from_url("ftp://host/x")


# --- S3Store against SeaweedFS -----------------------------------------------------------------


@pytest.mark.integration
def test_s3_store_round_trip(seaweed_s3, tmp_path):
    store = seaweed_s3.store()
    key = f"site-a/{uuid.uuid4().hex}/v1.csv.enc"
    payload = os.urandom(3 * 1024 * 1024 + 17)
    src = _file(tmp_path, payload)

    assert not store.exists(key)
    store.put_file(key, src)

    assert store.exists(key)
    assert store.get_bytes(key) == payload
    with store.open(key) as stream:
        assert stream.read(10) == payload[:10]
        assert stream.read() == payload[10:]
    store.delete(key)
    assert not store.exists(key)
    store.delete(key)


@pytest.mark.integration
def test_s3_store_multipart_upload(seaweed_s3, tmp_path):
    store = seaweed_s3.store()
    key = f"site-a/{uuid.uuid4().hex}/big.enc"
    payload = os.urandom(12 * 1024 * 1024 + 5)  # above minio's 5 MiB multipart threshold
    store.put_file(key, _file(tmp_path, payload))
    try:
        assert store.get_bytes(key) == payload
    finally:
        store.delete(key)


@pytest.mark.integration
def test_s3_store_missing_object(seaweed_s3):
    store = seaweed_s3.store()
    with pytest.raises(StorageError, match="not found"):
        store.open("site-a/none/v1.csv.enc")


@pytest.mark.integration
def test_s3_store_wrong_secret_key(seaweed_s3, tmp_path):
    store = seaweed_s3.store(secret_key="not-the-secret")
    with pytest.raises(StorageError, match="access denied") as info:
        store.exists("site-a/x")
    assert "not-the-secret" not in str(info.value)
    with pytest.raises(StorageError, match="access denied"):
        store.put_file("site-a/x", _file(tmp_path, b"x"))
    with pytest.raises(StorageError, match="access denied"):
        store.check()


@pytest.mark.integration
def test_s3_store_unknown_access_key(seaweed_s3):
    store = seaweed_s3.store(access_key="nobody")
    with pytest.raises(StorageError, match="access denied"):
        store.get_bytes("site-a/x")


@pytest.mark.integration
def test_s3_store_missing_bucket(seaweed_s3, tmp_path):
    store = seaweed_s3.store(bucket="no-such-bucket")
    expected = f"bucket 'no-such-bucket' does not exist at http://{seaweed_s3.endpoint}"
    with pytest.raises(StorageError, match=expected):
        store.check()
    with pytest.raises(StorageError, match=expected):
        store.exists("site-a/x")
    with pytest.raises(StorageError, match=expected):
        store.open("site-a/x")
    with pytest.raises(StorageError, match=expected):
        store.put_file("site-a/x", _file(tmp_path, b"x"))


@pytest.mark.integration
def test_s3_store_from_url(seaweed_s3, tmp_path):
    url = f"s3://{seaweed_s3.access_key}:{seaweed_s3.secret_key}@{seaweed_s3.endpoint}/frp-test"
    store = store_from_url(url)
    key = f"site-b/{uuid.uuid4().hex}/v2.csv.enc"
    store.put_file(key, _file(tmp_path, b"hello"))
    assert store.get_bytes(key) == b"hello"
    store.delete(key)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_s3_store_unreachable_endpoint():
    port = _unused_port()
    store = S3Store(endpoint=f"127.0.0.1:{port}", access_key="a", secret_key="b", bucket="x")
    with pytest.raises(StorageError, match=f"127.0.0.1:{port}"):
        store.exists("k")
