"""Signed-note checkpoint tests, including published golang.org/x/mod/sumdb/note vectors."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from portal.ledger.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_body,
    cosign,
    decode_signer_key,
    decode_verifier_key,
    encode_signer_key,
    encode_verifier_key,
    key_id,
    open_note,
    parse_checkpoint,
    parse_note,
    sign_note,
    verify_note,
)
from portal.ledger.merkle import leaf_hash, root

VECTORS = json.loads((Path(__file__).parent / "vectors" / "signed_note.json").read_text())
GO = VECTORS["golang_mod_note_test"]
FORMATS = VECTORS["transparency_dev_formats"]
C2SP = VECTORS["c2sp"]

ORIGIN = "portal.example.org/ledger"
ROOT = root([b"entry-0", b"entry-1", b"entry-2"])
LOG_NAME, LOG_KEY = decode_signer_key(FORMATS["keys"][0][1])  # "Log"
WITNESS_NAME, WITNESS_KEY = decode_signer_key(FORMATS["keys"][1][1])  # "Known"


def signed_checkpoint(size: int = 3, root_hash: bytes = ROOT) -> str:
    body = checkpoint_body(ORIGIN, size, root_hash)
    return sign_note(body, key_name=LOG_NAME, private_key=LOG_KEY)


def flip_base64_char(line_start: str, note: str, position: int) -> str:
    """Change one base64 character of the signature on the line starting with line_start."""
    lines = note.split("\n")
    index = next(i for i, line in enumerate(lines) if line.startswith(line_start))
    prefix, payload = lines[index].rsplit(" ", 1)
    swapped = "A" if payload[position] != "A" else "B"
    lines[index] = f"{prefix} {payload[:position]}{swapped}{payload[position + 1 :]}"
    return "\n".join(lines)


# --- format ---


def test_checkpoint_body_has_the_c2sp_format():
    body = checkpoint_body(ORIGIN, 3, ROOT)

    assert body == f"{ORIGIN}\n3\n{base64.b64encode(ROOT).decode()}\n"


def test_checkpoint_body_with_extension_lines_round_trips():
    body = checkpoint_body(ORIGIN, 0, ROOT, ["ext one", "ext two"])

    assert parse_checkpoint(body) == Checkpoint(ORIGIN, 0, ROOT, ("ext one", "ext two"))


@pytest.mark.parametrize(
    ("origin", "size", "root_hash", "extensions"),
    [
        ("", 1, ROOT, ()),
        ("two\nlines", 1, ROOT, ()),
        ("tab\there", 1, ROOT, ()),
        (ORIGIN, -1, ROOT, ()),
        (ORIGIN, 2**64, ROOT, ()),
        (ORIGIN, True, ROOT, ()),
        (ORIGIN, 1, ROOT[:31], ()),
        (ORIGIN, 1, ROOT, ("",)),
    ],
)
def test_checkpoint_body_rejects_bad_fields(origin, size, root_hash, extensions):
    with pytest.raises(CheckpointError):
        checkpoint_body(origin, size, root_hash, extensions)


@pytest.mark.parametrize("body", FORMATS["invalid_checkpoints"])
def test_parse_checkpoint_rejects_transparency_dev_invalid_cases(body):
    with pytest.raises(CheckpointError):
        parse_checkpoint(body)


@pytest.mark.parametrize("size_line", ["007", "+7", " 7", "7.0", "18446744073709551616"], ids=repr)
def test_parse_checkpoint_rejects_non_canonical_sizes(size_line):
    body = f"{ORIGIN}\n{size_line}\n{base64.b64encode(ROOT).decode()}\n"
    with pytest.raises(CheckpointError):
        parse_checkpoint(body)


def test_parse_checkpoint_reads_the_c2sp_spec_example():
    text, signatures = parse_note(C2SP["checkpoint_example"])

    checkpoint = parse_checkpoint(text)

    assert checkpoint.origin == "example.com/behind-the-sofa"
    assert checkpoint.size == 20852163
    assert len(checkpoint.root_hash) == 32
    assert [s.name for s in signatures] == ["example.com/behind-the-sofa"]
    assert len(signatures[0].signature) == 64


def test_parse_note_reads_the_signed_note_spec_example():
    text, signatures = parse_note(C2SP["note_example"])

    assert text.endswith("ed è subito sera.\n")
    assert "\n\n" in text  # the text may contain blank lines; the last one separates
    assert signatures[0].name == "quasimodo.example/salvatore"


# --- round trip, tampering, cosigning ---


def test_sign_and_verify_round_trip():
    note = signed_checkpoint()

    checkpoint = verify_note(
        note, key_name=LOG_NAME, public_key=LOG_KEY.public_key(), origin=ORIGIN
    )

    assert checkpoint == Checkpoint(ORIGIN, 3, ROOT, (), (LOG_NAME,))
    assert note.startswith(checkpoint.body() + "\n\u2014 Log ")


def test_tampered_size_is_rejected():
    note = signed_checkpoint().replace(f"{ORIGIN}\n3\n", f"{ORIGIN}\n4\n")

    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(note, key_name=LOG_NAME, public_key=LOG_KEY.public_key())


def test_tampered_root_is_rejected():
    other_root = base64.b64encode(leaf_hash(b"forged")).decode()
    note = signed_checkpoint().replace(base64.b64encode(ROOT).decode(), other_root)

    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(note, key_name=LOG_NAME, public_key=LOG_KEY.public_key())


@pytest.mark.parametrize("position", [10, 40, 80])
def test_tampered_signature_is_rejected(position):
    note = flip_base64_char("\u2014 ", signed_checkpoint(), position)

    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(note, key_name=LOG_NAME, public_key=LOG_KEY.public_key())


def test_wrong_key_name_is_rejected():
    note = signed_checkpoint()

    with pytest.raises(CheckpointError):
        verify_note(note, key_name="Other", public_key=LOG_KEY.public_key())


def test_wrong_public_key_is_rejected():
    note = signed_checkpoint()
    stranger = Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key()

    with pytest.raises(CheckpointError, match="no verifiable"):
        verify_note(note, key_name=LOG_NAME, public_key=stranger)


def test_origin_mismatch_is_rejected():
    with pytest.raises(CheckpointError, match="origin"):
        verify_note(
            signed_checkpoint(),
            key_name=LOG_NAME,
            public_key=LOG_KEY.public_key(),
            origin="someone.else/log",
        )


def test_cosignature_by_a_second_key_verifies():
    note = cosign(signed_checkpoint(), key_name=WITNESS_NAME, private_key=WITNESS_KEY)

    checkpoint = verify_note(
        note,
        key_name=LOG_NAME,
        public_key=LOG_KEY.public_key(),
        cosigners={WITNESS_NAME: WITNESS_KEY.public_key()},
    )

    assert checkpoint.signed_by == (LOG_NAME, WITNESS_NAME)
    assert note.count("\n\u2014 ") == 2
    # Unknown signatures are ignored: the log key alone still verifies the note.
    alone = verify_note(note, key_name=LOG_NAME, public_key=LOG_KEY.public_key())
    assert alone.signed_by == (LOG_NAME,)


def test_tampered_cosignature_is_rejected_when_the_cosigner_is_known():
    note = cosign(signed_checkpoint(), key_name=WITNESS_NAME, private_key=WITNESS_KEY)
    note = flip_base64_char(f"\u2014 {WITNESS_NAME} ", note, 40)

    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(
            note,
            key_name=LOG_NAME,
            public_key=LOG_KEY.public_key(),
            cosigners=[(WITNESS_NAME, WITNESS_KEY.public_key())],
        )


def test_cosigning_twice_replaces_the_earlier_cosignature():
    once = cosign(signed_checkpoint(), key_name=WITNESS_NAME, private_key=WITNESS_KEY)

    twice = cosign(once, key_name=WITNESS_NAME, private_key=WITNESS_KEY)

    assert twice == once


def test_verify_note_requires_the_log_signature():
    body = checkpoint_body(ORIGIN, 3, ROOT)
    witness_only = sign_note(body, key_name=WITNESS_NAME, private_key=WITNESS_KEY)

    with pytest.raises(CheckpointError, match="log key"):
        verify_note(
            witness_only,
            key_name=LOG_NAME,
            public_key=LOG_KEY.public_key(),
            cosigners={WITNESS_NAME: WITNESS_KEY.public_key()},
        )


def test_open_note_accepts_any_of_several_keys():
    body = checkpoint_body(ORIGIN, 3, ROOT)
    witness_only = sign_note(body, key_name=WITNESS_NAME, private_key=WITNESS_KEY)

    opened = open_note(
        witness_only,
        [(LOG_NAME, LOG_KEY.public_key()), (WITNESS_NAME, WITNESS_KEY.public_key())],
    )

    assert opened.text == body
    assert opened.verified == (WITNESS_NAME,)


def test_verify_note_rejects_a_signed_non_checkpoint():
    note = sign_note("hello\n", key_name=LOG_NAME, private_key=LOG_KEY)

    with pytest.raises(CheckpointError):
        verify_note(note, key_name=LOG_NAME, public_key=LOG_KEY.public_key())


@pytest.mark.parametrize("body", ["", "\n", "no newline", "ctrl\x07char\n"], ids=repr)
def test_sign_note_rejects_malformed_text(body):
    with pytest.raises(CheckpointError):
        sign_note(body, key_name=LOG_NAME, private_key=LOG_KEY)


@pytest.mark.parametrize("name", ["", "has space", "a+b", "tab\tname"], ids=repr)
def test_key_names_with_spaces_or_plus_are_rejected(name):
    with pytest.raises(CheckpointError):
        sign_note("text\n", key_name=name, private_key=LOG_KEY)


def test_signer_key_round_trip():
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))

    name, decoded = decode_signer_key(encode_signer_key("portal", key))

    assert name == "portal"
    assert encode_verifier_key(name, decoded.public_key()) == encode_verifier_key(
        "portal", key.public_key()
    )


# --- published vectors: golang.org/x/mod/sumdb/note note_test.go ---


def test_sign_reproduces_the_go_peter_neumann_note_byte_for_byte():
    name, private_key = decode_signer_key(GO["peter_skey"])

    note = sign_note(GO["text"], key_name=name, private_key=private_key)

    assert note == GO["signed_by_peter"]
    assert note.encode() == GO["signed_by_peter"].encode()


def test_verifier_key_encoding_matches_the_go_vkey():
    name, private_key = decode_signer_key(GO["peter_skey"])

    assert encode_verifier_key(name, private_key.public_key()) == GO["peter_vkey"]
    assert key_id(name, private_key.public_key()).hex() == GO["peter_key_id"]
    enoch_name, enoch_key = decode_verifier_key(GO["enoch_vkey"])
    assert key_id(enoch_name, enoch_key).hex() == GO["enoch_key_id"]


def _manglings(key: str):
    """TestNewVerifier/TestNewSigner manglings: every proper substring, every byte + 1."""
    raw = key.encode()
    for i in range(len(raw) + 1):
        for j in range(i + 1, len(raw) + 1):
            if i != 0 or j != len(raw):
                yield raw[i:j].decode()
    for i in range(len(raw)):
        yield (raw[:i] + bytes([raw[i] + 1]) + raw[i + 1 :]).decode()


def test_mangled_verifier_keys_are_rejected():
    decode_verifier_key(GO["peter_vkey"])
    accepted = []
    for mangled in [*_manglings(GO["peter_vkey"]), *GO["bad_vkeys"]]:
        try:
            decode_verifier_key(mangled)
        except CheckpointError:
            continue
        accepted.append(mangled)
    assert accepted == []


def test_mangled_signer_keys_are_rejected():
    accepted = []
    for mangled in _manglings(GO["peter_skey"]):
        try:
            decode_signer_key(mangled)
        except CheckpointError:
            continue
        accepted.append(mangled)
    assert accepted == []


PETER = decode_verifier_key(GO["peter_vkey"])
ENOCH = decode_verifier_key(GO["enoch_vkey"])
TWO_SIGS = GO["text"] + "\n" + GO["peter_sig"] + GO["enoch_sig"]


def test_open_verifies_peter_and_ignores_unknown_enoch():
    opened = open_note(TWO_SIGS, [PETER])

    assert opened.text == GO["text"]
    assert opened.verified == ("PeterNeumann",)
    assert [s.name for s in opened.unverified] == ["EnochRoot"]


def test_open_verifies_both_published_signatures():
    opened = open_note(TWO_SIGS, [PETER, ENOCH])

    assert opened.verified == ("PeterNeumann", "EnochRoot")
    assert opened.unverified == ()


def test_open_without_known_keys_is_rejected():
    with pytest.raises(CheckpointError, match="no verifiable signatures"):
        open_note(TWO_SIGS, [])


def test_open_rejects_more_than_100_signatures():
    with pytest.raises(CheckpointError, match="malformed"):
        open_note(GO["text"] + "\n" + GO["peter_sig"] * 101, [PETER])


def _insert_abcd_at_byte_60(line: str) -> str:
    raw = line.encode()
    return (raw[:60] + b"ABCD" + raw[60:]).decode()


def test_open_rejects_an_invalid_published_signature():
    note = GO["text"] + "\n" + _insert_abcd_at_byte_60(GO["peter_sig"])

    with pytest.raises(CheckpointError, match="invalid signature for key PeterNeumann"):
        open_note(note, [PETER])


def test_open_ignores_duplicated_and_corrupt_unknown_signatures():
    sigs = GO["peter_sig"] * 2 + GO["enoch_sig"] * 2 + _insert_abcd_at_byte_60(GO["enoch_sig"])

    opened = open_note(GO["text"] + "\n" + sigs, [PETER])

    assert opened.verified == ("PeterNeumann",)
    assert len(opened.unverified) == 2  # enoch, enoch with ABCD (duplicates collapsed)


@pytest.mark.parametrize(
    "note",
    [
        GO["text"],
        GO["text"] + "\n",
        GO["text"] + "\n" + GO["peter_sig"][:-1],
        "\x01" + GO["text"] + "\n" + GO["peter_sig"],
        b"\xff" + (GO["text"] + "\n" + GO["peter_sig"]).encode(),
        GO["text"] + "\n" + GO["peter_sig"].replace("PeterNeumann", "Bad Name")[:-1],
        GO["text"] + "\n" + GO["peter_sig"] + "Unexpected line.\n",
    ],
    ids=["text", "no sigs", "no final newline", "ctrl", "invalid utf8", "bad name", "extra"],
)
def test_open_rejects_go_malformed_notes(note):
    with pytest.raises(CheckpointError, match="malformed|control|space"):
        open_note(note, [PETER])


@pytest.mark.parametrize(
    "note",
    [
        GO["text"] + "\n" + GO["peter_sig"].replace("PeterNeumann", "CarmenSandiego"),
        GO["text"] + "\n" + GO["peter_sig"].replace("x08g", "xxxx"),
    ],
    ids=["misnamed", "wrong key id"],
)
def test_signature_with_wrong_name_or_key_id_is_not_peters(note):
    with pytest.raises(CheckpointError, match="no verifiable"):
        open_note(note, [PETER])


def test_the_same_verifier_listed_twice_is_not_ambiguous():
    # Go's VerifierList reports "ambiguous key" here; the same key twice is harmless, and two
    # different keys cannot share a name and key ID without a SHA-256 collision.
    opened = open_note(TWO_SIGS, [PETER, decode_verifier_key(GO["peter_vkey"])])

    assert opened.verified == ("PeterNeumann",)


# --- published vectors: transparency-dev/formats log/note_test.go ---


@pytest.mark.parametrize(("vkey", "skey"), FORMATS["keys"])
def test_verifier_keys_derived_from_signer_keys_match_published_pairs(vkey, skey):
    name, private_key = decode_signer_key(skey)

    assert encode_verifier_key(name, private_key.public_key()) == vkey
    assert encode_signer_key(name, private_key) == skey


def test_real_sum_golang_org_checkpoint_verifies():
    name, public_key = decode_verifier_key(FORMATS["sumdb_vkey"])

    checkpoint = verify_note(
        FORMATS["sumdb_note"], key_name=name, public_key=public_key, origin=FORMATS["sumdb_origin"]
    )

    assert checkpoint.size == FORMATS["sumdb_size"]
    assert checkpoint.origin == "go.sum database tree"
    assert checkpoint.signed_by == ("sum.golang.org",)


def test_real_sum_golang_org_checkpoint_with_wrong_origin_is_rejected():
    name, public_key = decode_verifier_key(FORMATS["sumdb_vkey"])

    with pytest.raises(CheckpointError, match="origin"):
        verify_note(
            FORMATS["sumdb_note"],
            key_name=name,
            public_key=public_key,
            origin="Go rocks but I might have the wrong ID",
        )


def test_real_sum_golang_org_checkpoint_with_tampered_size_is_rejected():
    name, public_key = decode_verifier_key(FORMATS["sumdb_vkey"])
    note = FORMATS["sumdb_note"].replace("\n6476701\n", "\n6476702\n")

    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(note, key_name=name, public_key=public_key)


KEYS = {decode_signer_key(skey)[0]: decode_signer_key(skey)[1] for _, skey in FORMATS["keys"]}


@pytest.mark.parametrize(
    ("signers", "ok", "want"),
    [
        ([], False, ()),
        (["Log"], True, ("Log",)),
        (["Log", "Known"], True, ("Log", "Known")),
        (["Log", "Known", "Unknown"], True, ("Log", "Known")),
        (["Log", "Known", "KnownAgain"], True, ("Log", "Known", "KnownAgain")),
        (["Log", "Known", "Known"], True, ("Log", "Known")),
        (["KnownAgain", "Log", "Known"], True, ("Log", "KnownAgain", "Known")),
        (["Log", "Known", "KnownAgain", "Unknown"], True, ("Log", "Known", "KnownAgain")),
        (["Known", "KnownAgain"], False, ()),
    ],
)
def test_transparency_dev_parse_checkpoint_signer_combinations(signers, ok, want):
    # TestParseCheckpoint, with a 32-byte root instead of "abcdef" (C2SP roots are SHA-256).
    body = checkpoint_body("TestParseCheckpoint", 42, ROOT)
    note = body
    for index, name in enumerate(signers):
        if index == 0:
            note = sign_note(body, key_name=name, private_key=KEYS[name])
        else:
            note = cosign(note, key_name=name, private_key=KEYS[name])
    witnesses = {name: KEYS[name].public_key() for name in ("Known", "KnownAgain")}

    def verify():
        return verify_note(
            note,
            key_name="Log",
            public_key=KEYS["Log"].public_key(),
            cosigners=witnesses,
            origin="TestParseCheckpoint",
        )

    if ok:
        assert verify().signed_by == want
    else:
        with pytest.raises(CheckpointError):
            verify()
