"""scripts/compose_certs.py: the files docker-compose.yml mounts, readable by the containers.

Compose bind-mounts configs and secrets with the host file's owner and mode, so every certificate
must be world-readable (0644) and every private key 0600 and owned by the user its container runs
as: uid 10001 (the image's ``frp`` user: superlink, supernodes) or root (nginx, MinIO).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from federation import pki

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "compose_certs.py"
IMAGE_UID = 10001  # Dockerfile: useradd --uid 10001

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to uid 10001 needs root")


def _run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _mounted_files() -> dict[str, str]:
    """Every ./certs and ./keys file compose mounts: path → "config" or "secret"."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    out = {}
    for kind in ("configs", "secrets"):
        for entry in compose[kind].values():
            if "file" in entry:
                out[entry["file"].removeprefix("./")] = kind
    return out


def _readers() -> dict[str, set[str]]:
    """Which services mount each secret's file (their image decides the reading user)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    by_source = {name: e["file"].removeprefix("./") for name, e in compose["secrets"].items()}
    readers: dict[str, set[str]] = {}
    for svc in compose["services"].values():
        for ref in svc.get("secrets", []):
            image = svc.get("image", "")
            readers.setdefault(by_source[ref["source"]], set()).add(image)
    return readers


def test_every_mounted_file_is_made_with_the_mode_and_owner_its_reader_needs(tmp_path):
    kits = {}
    for site in ("hospital-a", "hospital-b", "hospital-c"):
        kit = tmp_path / f"kit-{site}"
        (kit / "keyring").mkdir(parents=True)
        (kit / "supernode.key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n")
        (kit / "keyring" / f"{site}.kek").write_bytes(os.urandom(32))
        kits[site] = kit
    out = tmp_path / "deploy"
    _run("portal", "--dir", str(out), "--host", "portal.example.org")
    for site, kit in kits.items():
        (kit / "ca.crt").write_bytes((out / "certs" / "ca.crt").read_bytes())
        _run("site", site, "--dir", str(out), "--kit", str(kit))

    readers = _readers()
    for rel, kind in _mounted_files().items():
        path = out / rel
        assert path.is_file(), rel
        st = path.stat()
        if kind == "configs":
            assert stat.S_IMODE(st.st_mode) == 0o644, rel
        else:
            assert stat.S_IMODE(st.st_mode) == 0o600, rel
            ours = any("federated-research-portal" in img for img in readers[rel])
            assert st.st_uid == (IMAGE_UID if ours else 0), (rel, st.st_uid, readers[rel])
    # The CA's own key is never among the mounted files, and stays private.
    assert not [p for p in (out / "certs").rglob("*") if p.name == "ca.key"]
    assert stat.S_IMODE((out / "pki" / "ca.key").stat().st_mode) == 0o600
    # The KEK and the SuperNode key are the kit's, byte for byte.
    site_a = kits["hospital-a"]
    assert (out / "keys" / "hospital-a.kek").read_bytes() == (
        site_a / "keyring" / "hospital-a.kek"
    ).read_bytes()


def test_certificates_name_what_the_clients_dial(tmp_path):
    out = tmp_path / "deploy"
    _run("portal", "--dir", str(out), "--host", "portal.example.org")
    _run("site", "hospital-a", "--dir", str(out))
    certs = out / "certs"
    assert {"portal.example.org", "superlink"} <= set(
        pki.certificate_names(certs / "superlink.crt")
    )
    assert "portal.example.org" in pki.certificate_names(certs / "portal.crt")
    assert {"minio-hospital-a", "localhost"} <= set(
        pki.certificate_names(certs / "hospital-a" / "minio.crt")
    )
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    store_ca = x509.load_pem_x509_certificate((certs / "hospital-a" / "ca.crt").read_bytes())
    for name in ("superlink.crt", "portal.crt"):
        leaf = x509.load_pem_x509_certificate((certs / name).read_bytes())
        leaf.verify_directly_issued_by(ca)
    leaf = x509.load_pem_x509_certificate((certs / "hospital-a" / "minio.crt").read_bytes())
    leaf.verify_directly_issued_by(store_ca)  # the site's own CA, not the platform's
    assert store_ca.subject != ca.subject or store_ca.public_key() != ca.public_key()


def test_dockerfile_user_is_the_uid_the_keys_are_given_to():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"\b{IMAGE_UID}\b", dockerfile)
