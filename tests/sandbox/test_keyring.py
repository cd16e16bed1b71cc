"""Tests for sandbox.keyring: site key-encryption keys kept in a private directory."""

from __future__ import annotations

import os
import stat

import pytest

from sandbox.keyring import KeyringError, SiteKeyring, env_var_name


@pytest.fixture(autouse=True)
def _no_kek_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("FRP_KEK_"):
            monkeypatch.delenv(name)


def test_create_then_get(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")

    key = ring.create("hospital-a")

    assert len(key) == 32
    assert ring.get("hospital-a") == key
    assert ring.exists("hospital-a")
    assert not ring.exists("hospital-b")
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "keys" / "hospital-a.kek").stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["hospital-a.kek"]


def test_keys_differ_per_site(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    assert ring.create("hospital-a") != ring.create("hospital-b")


def test_create_refuses_to_overwrite(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    key = ring.create("hospital-a")

    with pytest.raises(KeyringError, match="already exists"):
        ring.create("hospital-a")

    assert ring.get("hospital-a") == key
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["hospital-a.kek"]


def test_env_var_name():
    assert env_var_name("hospital-a") == "FRP_KEK_HOSPITAL_A"
    assert env_var_name("uni_b2") == "FRP_KEK_UNI_B2"


def test_env_overrides_file(tmp_path, monkeypatch):
    ring = SiteKeyring(tmp_path / "keys")
    ring.create("hospital-a")
    override = bytes(range(32))
    monkeypatch.setenv("FRP_KEK_HOSPITAL_A", override.hex())

    assert ring.get("hospital-a") == override


def test_env_only_key(tmp_path, monkeypatch):
    monkeypatch.setenv("FRP_KEK_HOSPITAL_C", "ab" * 32)
    ring = SiteKeyring(tmp_path / "nowhere")

    assert ring.exists("hospital-c")
    assert ring.get("hospital-c") == b"\xab" * 32
    with pytest.raises(KeyringError, match="FRP_KEK_HOSPITAL_C"):
        ring.create("hospital-c")


@pytest.mark.parametrize("value", ["zz" * 32, "ab" * 16, ""])
def test_env_bad_value(tmp_path, monkeypatch, value):
    monkeypatch.setenv("FRP_KEK_HOSPITAL_A", value)
    with pytest.raises(KeyringError, match="FRP_KEK_HOSPITAL_A") as info:
        SiteKeyring(tmp_path).get("hospital-a")
    if value:
        assert value not in str(info.value)


def test_missing_key_names_site_and_places(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    with pytest.raises(KeyringError) as info:
        ring.get("hospital-a")
    message = str(info.value)
    assert "'hospital-a'" in message
    assert "FRP_KEK_HOSPITAL_A" in message
    assert str(tmp_path / "keys" / "hospital-a.kek") in message


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o601])
def test_insecure_permissions_refused(tmp_path, mode):
    ring = SiteKeyring(tmp_path / "keys")
    ring.create("hospital-a")
    path = tmp_path / "keys" / "hospital-a.kek"
    os.chmod(path, mode)

    with pytest.raises(KeyringError, match="insecure permissions"):
        ring.get("hospital-a")


def test_owner_only_read_is_fine(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    key = ring.create("hospital-a")
    os.chmod(tmp_path / "keys" / "hospital-a.kek", 0o400)
    assert ring.get("hospital-a") == key


def test_wrong_length_key_file(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    path = keys / "hospital-a.kek"
    path.write_bytes(b"short")
    os.chmod(path, 0o600)
    with pytest.raises(KeyringError, match="32 bytes"):
        SiteKeyring(keys).get("hospital-a")


def test_symlinked_key_file_refused(tmp_path):
    keys = tmp_path / "keys"
    ring = SiteKeyring(keys)
    ring.create("hospital-a")
    (keys / "hospital-b.kek").symlink_to(keys / "hospital-a.kek")
    with pytest.raises(KeyringError):
        ring.get("hospital-b")


@pytest.mark.parametrize("site", ["../etc", "a/b", "", ".hidden", "x" * 101])
def test_invalid_site_names(tmp_path, site):
    with pytest.raises(KeyringError, match="invalid site name"):
        SiteKeyring(tmp_path).get(site)
