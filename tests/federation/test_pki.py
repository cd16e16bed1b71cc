"""The platform CA (federation.pki): certificates that a real TLS handshake accepts or refuses.

Each test serves the issued certificate from a real ``ssl`` server socket on a free loopback port
and dials it with Python's ``ssl`` client (OpenSSL's chain and host-name checks, not our own).
"""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from contextlib import contextmanager

import pytest

from federation import pki


@contextmanager
def _tls_server(cert: pki.ServerCertificate):
    """A TLS server on 127.0.0.1 that completes one handshake per connection; yields its port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert, cert.key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()
        thread.join(timeout=10)


def _dial(port: int, *, cafile, server_hostname: str) -> bytes:
    ctx = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        return tls.recv(2)


def test_server_certificate_verified_by_its_ca_for_every_name(tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    cert = pki.server_certificate_issue(
        ca, tmp_path / "tls", name="superlink", hosts=["127.0.0.1", "localhost", "sl.example.org"]
    )
    assert sorted(pki.certificate_names(cert.cert)) == ["127.0.0.1", "localhost", "sl.example.org"]
    with _tls_server(cert) as port:
        assert _dial(port, cafile=ca.cert, server_hostname="127.0.0.1") == b"ok"
        assert _dial(port, cafile=ca.cert, server_hostname="localhost") == b"ok"


def test_certificate_refused_for_another_name(tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    cert = pki.server_certificate_issue(ca, tmp_path / "tls", name="superlink", hosts=["10.9.0.1"])
    with _tls_server(cert) as port, pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _dial(port, cafile=ca.cert, server_hostname="127.0.0.1")


def test_certificate_refused_by_another_ca(tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    other = pki.ca_create(tmp_path / "other")
    cert = pki.server_certificate_issue(ca, tmp_path / "tls", name="superlink", hosts=["127.0.0.1"])
    with _tls_server(cert) as port, pytest.raises(ssl.SSLCertVerificationError):
        _dial(port, cafile=other.cert, server_hostname="127.0.0.1")


def test_private_files_0600_and_never_overwritten(tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    assert stat.S_IMODE((tmp_path / "ca").stat().st_mode) == 0o700
    for path in (ca.key, ca.cert):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = ca.key.read_bytes()
    with pytest.raises(pki.PkiError, match="not overwritten"):
        pki.ca_create(tmp_path / "ca")
    assert ca.key.read_bytes() == before
    assert pki.ca_load_or_create(tmp_path / "ca") == ca  # reuses, does not replace
    assert ca.key.read_bytes() == before


def test_mismatched_ca_key_refused(tmp_path):
    ca = pki.ca_create(tmp_path / "ca")
    other = pki.ca_create(tmp_path / "other")
    ca.key.write_bytes(other.key.read_bytes())
    with pytest.raises(pki.PkiError, match="is not the key of"):
        pki.server_certificate_issue(ca, tmp_path / "tls", name="x", hosts=["127.0.0.1"])


@pytest.mark.parametrize("bad", ["", "bad name", "-leading.example", "a" * 254])
def test_bad_host_name_refused(tmp_path, bad):
    ca = pki.ca_create(tmp_path / "ca")
    with pytest.raises(pki.PkiError):
        pki.server_certificate_issue(ca, tmp_path / "tls", name="x", hosts=[bad] if bad else [])
