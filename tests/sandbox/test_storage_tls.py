"""The object-store link over TLS (issue 13, point 3): a real SeaweedFS whose S3 port speaks only
HTTPS, with a certificate from the portal's own CA (``federation.pki``), reached by the same
``sandbox.storage`` client the sites (``--node-config store=…``) and the portal
(``FRP_MODEL_STORE_URL``: final models, the ServerApp's round checkpoints) use.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from federation import pki
from sandbox.storage import ENV_CA_FILE, S3Store, StorageError, store_from_url

REPO = Path(__file__).resolve().parents[2]


def _url(server, *, scheme: str = "s3s", ca: Path | None = None) -> str:
    query = f"?ca={ca}" if ca is not None else ""
    return (
        f"{scheme}://{server.access_key}:{server.secret_key}@{server.endpoint}/{server.bucket}"
        f"{query}"
    )


def _file(tmp_path, content: bytes) -> Path:
    path = tmp_path / "src.bin"
    path.write_bytes(content)
    return path


# --- configuration (no server) ---------------------------------------------------------------


def test_ca_file_from_the_url_and_from_the_environment(tmp_path, monkeypatch):
    ca = pki.ca_create(tmp_path / "ca")
    store = store_from_url(f"s3s://a:b@127.0.0.1:9000/bucket?ca={ca.cert}")
    assert (store.secure, store.ca_file) == (True, ca.cert)
    assert store.url == "s3s://127.0.0.1:9000/bucket"  # the URL names the store, nothing else

    monkeypatch.setenv(ENV_CA_FILE, str(ca.cert))
    assert store_from_url("s3s://a:b@127.0.0.1:9000/bucket").ca_file == ca.cert
    monkeypatch.delenv(ENV_CA_FILE)
    assert store_from_url("s3s://a:b@127.0.0.1:9000/bucket").ca_file is None  # system trust


def test_ca_file_needs_https(tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    with pytest.raises(StorageError, match=r"s3s://"):
        store_from_url(f"s3://a:b@127.0.0.1:9000/bucket?ca={ca.cert}")
    with pytest.raises(StorageError, match="secure"):
        S3Store(
            endpoint="127.0.0.1:9000", access_key="a", secret_key="b", bucket="x", ca_file=ca.cert
        )


def test_unreadable_ca_file_is_refused_when_configured(tmp_path):
    missing = tmp_path / "nope.crt"
    with pytest.raises(StorageError, match=f"CA file {missing}"):
        store_from_url(f"s3s://a:b@127.0.0.1:9000/bucket?ca={missing}")
    not_pem = tmp_path / "junk.crt"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(StorageError, match=f"CA file {not_pem}"):
        store_from_url(f"s3s://a:b@127.0.0.1:9000/bucket?ca={not_pem}")


@pytest.mark.parametrize("top", ["sandbox", "federation", "frp_site", "portal", "accounting"])
def test_no_certificate_check_is_switched_off(top):
    """No product code turns TLS verification off (minio's cert_check, requests' verify, ssl's)."""
    banned = (
        "cert_check=False",
        "verify=False",
        "CERT_NONE",
        "check_hostname = False",
        "check_hostname=False",
        "_create_unverified_context",
    )
    found = []
    for path in (REPO / top).rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(REPO)}: {b}" for b in banned if b in text]
    assert found == []


# --- a real S3 server over TLS -----------------------------------------------------------------


@pytest.mark.integration
def test_upload_and_download_over_tls(seaweed_s3_tls, tmp_path):
    store = store_from_url(_url(seaweed_s3_tls, ca=seaweed_s3_tls.ca_file))
    store.check()
    key = f"site-a/{uuid.uuid4().hex}/v1.csv.enc"
    payload = os.urandom(6 * 1024 * 1024 + 3)  # above minio's 5 MiB part size: multipart too
    store.put_file(key, _file(tmp_path, payload))
    try:
        assert store.exists(key)
        assert store.get_bytes(key) == payload
        with store.open(key) as stream:
            assert stream.read(7) == payload[:7]
    finally:
        store.delete(key)
    assert not store.exists(key)


@pytest.mark.integration
def test_a_different_ca_is_refused(seaweed_s3_tls, tmp_path):
    other = pki.ca_create(tmp_path / "other-ca")
    store = store_from_url(_url(seaweed_s3_tls, ca=other.cert))
    with pytest.raises(StorageError) as info:
        store.put_file("site-a/x", _file(tmp_path, b"x"))
    message = str(info.value)
    assert "certificate verify failed" in message
    assert seaweed_s3_tls.endpoint in message
    assert str(other.cert) in message  # says which CA it checked against
    assert seaweed_s3_tls.secret_key not in message
    with pytest.raises(StorageError, match="certificate verify failed"):
        store.check()


@pytest.mark.integration
def test_the_system_trust_store_does_not_trust_the_portal_ca(seaweed_s3_tls, monkeypatch):
    monkeypatch.delenv(ENV_CA_FILE, raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    store = store_from_url(_url(seaweed_s3_tls))
    with pytest.raises(StorageError, match="certificate verify failed.*system trust store"):
        store.check()


@pytest.mark.integration
def test_plain_http_to_the_tls_port_fails(seaweed_s3_tls, tmp_path):
    store = store_from_url(_url(seaweed_s3_tls, scheme="s3"))
    with pytest.raises(StorageError, match=r"plain HTTP.*TLS.*s3s://") as info:
        store.check()
    assert seaweed_s3_tls.endpoint in str(info.value)
    with pytest.raises(StorageError, match="plain HTTP"):
        store.put_file("site-a/x", _file(tmp_path, b"x"))


@pytest.mark.integration
def test_portal_model_store_and_serverapp_checkpoints_over_tls(seaweed_s3_tls, settings):
    """The portal's boundary (``federation.artifacts``) and the ServerApp's
    (``frp_flwr.checkpoints``) read and write the same TLS store through ``FRP_MODEL_STORE_URL``."""
    from federation import artifacts
    from frp_flwr import checkpoints

    url = _url(seaweed_s3_tls, ca=seaweed_s3_tls.ca_file)
    settings.FRP_MODEL_STORE_URL = url
    key = f"checkpoints/job-{uuid.uuid4().int % 10**9}/latest.json"
    serverapp_store = checkpoints.store_from_environ({checkpoints.STORE_ENV: url})
    checkpoints.put_bytes(serverapp_store, key, b'{"round": 2}')
    try:
        assert artifacts.model_store().get_bytes(key) == b'{"round": 2}'
    finally:
        artifacts.model_store().delete(key)


@pytest.mark.integration
def test_tls_to_a_plain_http_port_fails(seaweed_s3, tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    store = store_from_url(_url(seaweed_s3, ca=ca.cert))
    with pytest.raises(StorageError, match=r"TLS handshake with .* failed.*HTTPS server") as info:
        store.check()
    assert seaweed_s3.endpoint in str(info.value)
