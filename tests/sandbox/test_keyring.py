"""Tests for sandbox.keyring: site key-encryption keys kept in a private directory."""

from __future__ import annotations

import hashlib
import io
import os
import stat

import pytest

from sandbox.crypto import (
    FIXED_HEADER_BYTES,
    HEADER_BYTES,
    CryptoError,
    associated_data,
    decrypt_all,
    encrypt_stream,
    generate_key,
)
from sandbox.ingest import ingest_csv
from sandbox.keyring import KeyringError, SiteKeyring, env_var_name, rewrap_object
from sandbox.loader import LoaderError, load_table
from sandbox.storage import FilesystemStore


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


# --- rotation and re-wrapping -------------------------------------------------------------------


def _stored_object(tmp_path, kek, plaintext: bytes = b"id,x\n" + b"1,2\n" * 5000):
    store = FilesystemStore(tmp_path / "store")
    aad = associated_data(site="hospital-a", dataset="cohort", version=1)
    sink = io.BytesIO()
    encrypt_stream(kek=kek, aad=aad, source=io.BytesIO(plaintext), sink=sink, chunk_size=4096)
    blob = tmp_path / "blob.enc"
    blob.write_bytes(sink.getvalue())
    store.put_file("hospital-a/cohort/v1.csv.enc", blob)
    return store, "hospital-a/cohort/v1.csv.enc", aad, plaintext


def test_rotate_keeps_the_old_key_beside_the_new(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    first = ring.create("hospital-a")

    old, new = ring.rotate("hospital-a")

    assert old == first and new != first and len(new) == 32
    assert ring.get("hospital-a") == new
    assert ring.previous("hospital-a") == [1]
    assert ring.get_previous("hospital-a", 1) == old
    kept = tmp_path / "keys" / "hospital-a.kek.1"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys" / "hospital-a.kek").stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "hospital-a.kek",
        "hospital-a.kek.1",
    ]


def test_rotate_twice_numbers_previous_keys(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    k0 = ring.create("hospital-a")
    _, k1 = ring.rotate("hospital-a")
    old, k2 = ring.rotate("hospital-a")

    assert old == k1
    assert ring.previous("hospital-a") == [1, 2]
    assert [ring.get_previous("hospital-a", n) for n in (1, 2)] == [k0, k1]
    assert ring.get("hospital-a") == k2
    assert ring.previous("hospital-b") == []


def test_retire_removes_a_previous_key(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    ring.create("hospital-a")
    ring.rotate("hospital-a")

    ring.retire("hospital-a", 1)

    assert ring.previous("hospital-a") == []
    with pytest.raises(KeyringError, match="no previous key 1"):
        ring.retire("hospital-a", 1)
    with pytest.raises(KeyringError, match="hospital-a.kek.1"):
        ring.get_previous("hospital-a", 1)


def test_rotate_without_a_key_is_a_clear_error(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    with pytest.raises(KeyringError, match="no key-encryption key for site 'hospital-a'"):
        ring.rotate("hospital-a")


def test_rotate_refuses_an_environment_key(tmp_path, monkeypatch):
    monkeypatch.setenv("FRP_KEK_HOSPITAL_A", "ab" * 32)
    with pytest.raises(KeyringError, match="set by FRP_KEK_HOSPITAL_A"):
        SiteKeyring(tmp_path / "keys").rotate("hospital-a")


def test_rewrap_object_changes_only_the_header(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    first = ring.create("hospital-a")
    store, key, aad, plaintext = _stored_object(tmp_path, first)
    before = store.get_bytes(key)
    old, new = ring.rotate("hospital-a")

    result = rewrap_object(store, key, old_kek=old, new_kek=new, aad=aad, tmp_dir=tmp_path)

    after = store.get_bytes(key)
    assert result.changed
    assert (result.size_bytes, result.ciphertext_sha256) == (
        len(after),
        hashlib.sha256(after).hexdigest(),
    )
    assert len(after) == len(before)
    assert after[HEADER_BYTES:] == before[HEADER_BYTES:]  # data bytes untouched
    assert after[:FIXED_HEADER_BYTES] == before[:FIXED_HEADER_BYTES]
    assert after[:HEADER_BYTES] != before[:HEADER_BYTES]
    assert decrypt_all(kek=new, aad=aad, source=io.BytesIO(after)) == plaintext
    with pytest.raises(CryptoError, match="cannot unwrap"):
        decrypt_all(kek=old, aad=aad, source=io.BytesIO(after))
    assert not list(tmp_path.glob(".frp-rewrap-*"))


def test_rewrap_object_again_is_a_no_op(tmp_path):
    old = generate_key()
    new = generate_key()
    store, key, aad, _ = _stored_object(tmp_path, old)
    rewrap_object(store, key, old_kek=old, new_kek=new, aad=aad)
    once = store.get_bytes(key)

    result = rewrap_object(store, key, old_kek=old, new_kek=new, aad=aad)

    assert not result.changed
    assert store.get_bytes(key) == once
    assert result.ciphertext_sha256 == hashlib.sha256(once).hexdigest()


@pytest.mark.parametrize("wrong", ["key", "aad"])
def test_rewrap_object_with_wrong_key_or_ids_changes_nothing(tmp_path, wrong):
    old = generate_key()
    store, key, aad, _ = _stored_object(tmp_path, old)
    before = store.get_bytes(key)
    kwargs = {"old_kek": old, "new_kek": generate_key(), "aad": aad}
    if wrong == "key":
        kwargs["old_kek"] = generate_key()
    else:
        kwargs["aad"] = associated_data(site="hospital-a", dataset="cohort", version=2)

    with pytest.raises(KeyringError, match="neither the old nor the new key"):
        rewrap_object(store, key, **kwargs)

    assert store.get_bytes(key) == before


def test_rewrap_object_refuses_a_tampered_object(tmp_path):
    old, new = generate_key(), generate_key()
    store, key, aad, _ = _stored_object(tmp_path, old)
    data = bytearray(store.get_bytes(key))
    data[-5] ^= 0x01
    tampered = tmp_path / "t.enc"
    tampered.write_bytes(bytes(data))
    store.put_file(key, tampered)

    with pytest.raises(KeyringError, match="failed authentication"):
        rewrap_object(store, key, old_kek=old, new_kek=new, aad=aad)

    assert store.get_bytes(key) == bytes(data)  # not replaced


def test_rewrap_object_missing_object_and_same_keys(tmp_path):
    store = FilesystemStore(tmp_path / "store")
    k = generate_key()
    aad = associated_data(site="s", dataset="d", version=1)
    with pytest.raises(KeyringError, match="not found"):
        rewrap_object(store, "s/d/v1.csv.enc", old_kek=k, new_kek=generate_key(), aad=aad)
    with pytest.raises(KeyringError, match="the same"):
        rewrap_object(store, "s/d/v1.csv.enc", old_kek=k, new_kek=k, aad=aad)


def test_ingested_dataset_loads_after_rotation_and_rewrap(tmp_path):
    ring = SiteKeyring(tmp_path / "keys")
    kek = ring.create("hospital-a")
    store = FilesystemStore(tmp_path / "store")
    src = tmp_path / "d.csv"
    src.write_text("x,y\n1,a\n2,b\n")
    ids = {"site": "hospital-a", "dataset": "d", "version": 1}
    result = ingest_csv(src, store=store, kek=kek, tmp_dir=tmp_path, **ids)
    old, new = ring.rotate("hospital-a")

    rewrap_object(store, result.store_key, old_kek=old, new_kek=new, aad=associated_data(**ids))

    table = load_table(store=store, kek=ring.get("hospital-a"), store_key=result.store_key, **ids)
    assert table.data["y"].tolist() == ["a", "b"]
    with pytest.raises(LoaderError, match="cannot decrypt"):
        load_table(store=store, kek=old, store_key=result.store_key, **ids)
