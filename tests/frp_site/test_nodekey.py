"""The SuperNode key pair made at the site (frp_site.nodekey), checked against OpenSSH itself."""

from __future__ import annotations

import shutil
import stat
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from frp_site import nodekey


def test_key_pair_private_0600_public_line_matches(tmp_path):
    line = nodekey.key_pair_create(tmp_path / "k" / "supernode.key", comment="hospital-a")
    key = tmp_path / "k" / "supernode.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert line.startswith("ecdsa-sha2-nistp384 ") and line.endswith(" hospital-a")
    assert (tmp_path / "k" / "supernode.key.pub").read_text().strip() == line
    assert nodekey.public_key_of(key) == " ".join(line.split()[:2])
    assert nodekey.public_key_check(line) == " ".join(line.split()[:2])


def test_key_pair_never_overwritten(tmp_path):
    nodekey.key_pair_create(tmp_path / "supernode.key")
    before = (tmp_path / "supernode.key").read_bytes()
    with pytest.raises(nodekey.NodeKeyError, match="exists"):
        nodekey.key_pair_create(tmp_path / "supernode.key")
    assert (tmp_path / "supernode.key").read_bytes() == before


@pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="OpenSSH's ssh-keygen is not installed")
def test_fingerprint_is_openssh_s(tmp_path):
    line = nodekey.key_pair_create(tmp_path / "supernode.key")
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(tmp_path / "supernode.key.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert nodekey.fingerprint(line) == out[1]


def _ssh_public(key) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no public key"),
        ("ssh-ed25519 AAAA", "not an OpenSSH public key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nxx", "private key"),
        ("x" * 2000, "at most"),
    ],
)
def test_public_key_check_refuses_garbage(text, message):
    with pytest.raises(nodekey.NodeKeyError, match=message):
        nodekey.public_key_check(text)


@pytest.mark.parametrize(
    "make",
    [lambda: ed25519.Ed25519PrivateKey.generate(), lambda: rsa.generate_private_key(65537, 2048)],
)
def test_public_key_check_refuses_keys_flower_does_not_take(make):
    with pytest.raises(nodekey.NodeKeyError, match="NIST curve"):
        nodekey.public_key_check(_ssh_public(make()))
