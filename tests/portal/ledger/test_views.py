"""Ledger pages and API: proofs served by URL verify with merkle.py against the signed checkpoint."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from portal.ledger import checkpoint as notes
from portal.ledger.leaves import canonical_json
from portal.ledger.merkle import root, verify_consistency, verify_inclusion
from portal.ledger.models import LedgerCosignature
from portal.ledger.services import (
    ledger_append,
    ledger_append_many,
    ledger_checkpoint_create,
    ledger_witness_add,
)
from portal.ledger.signer import ledger_verifier, ledger_verifier_key
from portal.models import Role
from tests.factories import MembershipFactory, UserFactory
from tests.portal.ledger.support import isolated_ledger_key, raw_sql

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ledger_key")]

ORIGIN = "portal.example.org/ledger"
BASE = "/ledger"


@pytest.fixture
def ledger_key(settings, tmp_path):
    return isolated_ledger_key(settings, tmp_path)


@pytest.fixture
def member(client):
    membership = MembershipFactory(role=Role.RESEARCHER)
    client.force_login(membership.user)
    return membership.user


def _append(n: int, start: int = 0) -> list[bytes]:
    """Append ``n`` records and return their leaf bytes, built independently of the service."""
    records = [{"job": j, "site": j % 4, "amount": f"{j}.25"} for j in range(start, start + n)]
    ledger_append_many(entries=[("charge", r) for r in records])
    return [canonical_json({**r, "kind": "charge"}) for r in records]


def _signed(note: str) -> notes.Checkpoint:
    key_name, public_key = ledger_verifier()
    return notes.verify_note(note, key_name=key_name, public_key=public_key, origin=ORIGIN)


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


# --- who may see it -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/", "/checkpoint", "/leaves/0", "/proof/inclusion?index=0", "/proof/consistency?first=1"],
)
def test_ledger_urls_send_anonymous_visitors_to_sign_in(client, path):
    response = client.get(BASE + path)

    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/")


@pytest.mark.parametrize(
    "path",
    ["/", "/checkpoint", "/leaves/0", "/proof/inclusion?index=0", "/proof/consistency?first=1"],
)
def test_ledger_urls_refuse_users_of_no_institution(client, path):
    _append(2)
    ledger_checkpoint_create()
    client.force_login(UserFactory())

    assert client.get(BASE + path).status_code == 403


def test_ledger_page_shows_checkpoint_key_and_leaves(client, member):
    leaves = _append(3)
    checkpoint = ledger_checkpoint_create()
    ledger_append(kind="usage", record={"job": 9})

    response = client.get(BASE + "/")

    page = response.content.decode()
    assert response.status_code == 200
    assert ledger_verifier_key() in page
    assert f"{ORIGIN}\n3\n{base64.b64encode(bytes(checkpoint.root_hash)).decode()}" in page
    assert hashlib.sha256(b"\x00" + leaves[1]).hexdigest() in page
    assert "1 newer leaf not yet covered" in page
    assert f'href="{BASE}/"' in page  # the nav link
    assert "Witness this log" not in page  # researchers do not witness


def test_ledger_page_paginates_newest_first(client, member):
    _append(60)

    first = client.get(BASE + "/").content.decode()
    second = client.get(BASE + "/?page=2").content.decode()

    assert "Page 1 of 2" in first and f"{BASE}/leaves/59" in first
    assert f'{BASE}/leaves/9"' not in first
    assert f'{BASE}/leaves/9"' in second and f'{BASE}/leaves/10"' not in second


def test_ledger_page_empty_says_so(client, member):
    page = client.get(BASE + "/").content.decode()

    assert "The ledger is empty" in page and "No checkpoint yet" in page


# --- checkpoint and leaves ----------------------------------------------------------------------


def test_checkpoint_url_serves_the_signed_note_as_text(client, member):
    leaves = _append(5)
    ledger_checkpoint_create()

    response = client.get(BASE + "/checkpoint")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    signed = _signed(response.content.decode())
    assert (signed.size, signed.root_hash) == (5, root(leaves))


def test_checkpoint_url_without_checkpoint_is_404(client, member):
    assert client.get(BASE + "/checkpoint").status_code == 404
    assert client.get(BASE + "/checkpoint?size=x").status_code == 400


def test_leaf_url_returns_exact_data_and_its_leaf_hash(client, member):
    leaves = _append(3)

    body = client.get(BASE + "/leaves/2").json()

    assert body["data"].encode() == leaves[2]
    assert _b64(body["leaf_hash"]) == hashlib.sha256(b"\x00" + leaves[2]).digest()
    assert body["record"] == {"job": 2, "site": 2, "amount": "2.25", "kind": "charge"}
    assert body["index"] == 2 and body["kind"] == "charge"
    assert client.get(BASE + "/leaves/3").status_code == 404


# --- proofs -------------------------------------------------------------------------------------


def test_every_inclusion_proof_verifies_against_the_signed_checkpoint(client, member):
    leaves = _append(7)
    ledger_checkpoint_create()
    _append(3, start=7)  # later leaves: proofs still answer for the checkpoint's size 7

    for index in range(7):
        body = client.get(f"{BASE}/proof/inclusion?index={index}").json()

        signed = _signed(body["checkpoint"])
        assert body["size"] == signed.size == 7
        assert _b64(body["root"]) == signed.root_hash == root(leaves)
        leaf = hashlib.sha256(b"\x00" + leaves[index]).digest()
        assert _b64(body["leaf_hash"]) == leaf
        proof = [_b64(h) for h in body["proof"]]
        assert verify_inclusion(index, 7, leaf, proof, signed.root_hash)
        mutated = [bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:]]
        assert not verify_inclusion(index, 7, leaf, mutated, signed.root_hash)
        assert not verify_inclusion((index + 1) % 7, 7, leaf, proof, signed.root_hash)


def test_inclusion_proof_at_a_size_without_checkpoint_has_root_but_no_note(client, member):
    leaves = _append(6)

    body = client.get(f"{BASE}/proof/inclusion?index=4&size=5").json()

    assert body["checkpoint"] is None
    assert _b64(body["root"]) == root(leaves[:5])
    leaf = hashlib.sha256(b"\x00" + leaves[4]).digest()
    assert verify_inclusion(4, 5, leaf, [_b64(h) for h in body["proof"]], root(leaves[:5]))


def test_consistency_proof_between_two_checkpoints_verifies(client, member):
    leaves = _append(5)
    ledger_checkpoint_create()
    leaves += _append(6, start=5)
    ledger_checkpoint_create()

    body = client.get(f"{BASE}/proof/consistency?first=5").json()

    old, new = _signed(body["first_checkpoint"]), _signed(body["second_checkpoint"])
    assert (old.size, new.size) == (5, 11) == (body["first"], body["second"])
    assert old.root_hash == root(leaves[:5]) == _b64(body["first_root"])
    assert new.root_hash == root(leaves) == _b64(body["second_root"])
    proof = [_b64(h) for h in body["proof"]]
    assert verify_consistency(5, 11, old.root_hash, new.root_hash, proof)
    assert not verify_consistency(5, 11, new.root_hash, old.root_hash, proof)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("inclusion?index=abc", "whole number"),
        ("inclusion?index=%EF%BC%91", "digits 0-9"),  # a fullwidth one, which int() would take
        ("inclusion?index=1_0", "digits 0-9"),
        ("inclusion?index=-1", ">= 0"),
        ("inclusion?index=4&size=4", "not below"),
        ("inclusion?index=0&size=99", "exceeds"),
        ("inclusion", "whole number"),
        ("consistency?first=5&second=3", "larger"),
        ("consistency?first=1&second=50", "exceeds"),
        ("consistency?first=", "whole number"),
    ],
)
def test_proof_urls_answer_400_for_bad_parameters(client, member, query, message):
    _append(5)

    response = client.get(f"{BASE}/proof/{query}")

    assert response.status_code == 400
    assert message in response.json()["error"]


def test_proof_url_refuses_to_serve_a_tree_that_misses_its_checkpoint(client, member):
    _append(4)
    ledger_checkpoint_create()
    forged = canonical_json({"job": 1, "kind": "charge", "amount": "0.00", "site": 1})
    raw_sql(
        "UPDATE portal_ledgerentry SET data = %s, leaf_hash = %s WHERE index = 1",
        [forged.decode(), hashlib.sha256(b"\x00" + forged).digest()],
    )
    ledger_append(kind="usage", record={"job": 5})  # a new process state: the tree is re-read

    from portal.ledger import selectors

    selectors._cache.tree = selectors.MerkleTree()  # a fresh process: nothing cached yet
    selectors._cache.last_key = None
    response = client.get(f"{BASE}/proof/inclusion?index=0")

    assert response.status_code == 500
    assert "ledger_verify" in response.json()["error"]


# --- witnesses ----------------------------------------------------------------------------------


def test_institution_admin_registers_a_key_and_cosigns_through_the_page(client):
    admin = MembershipFactory(role=Role.INSTITUTION_ADMIN)
    client.force_login(admin.user)
    _append(3)
    checkpoint = ledger_checkpoint_create()
    key = Ed25519PrivateKey.generate()
    vkey = notes.encode_verifier_key("witness.example", key.public_key())

    page = client.get(BASE + "/").content.decode()
    registered = client.post(
        BASE + "/witnesses", {"institution": admin.institution.pk, "verifier_key": vkey}
    )
    cosigned = notes.cosign(checkpoint.note, key_name="witness.example", private_key=key)
    accepted = client.post(BASE + "/checkpoints/3/cosign", {"note": cosigned})
    served = client.get(BASE + "/checkpoint").content.decode()

    assert "Witness this log" in page
    assert registered.status_code == 302 and accepted.status_code == 302
    assert LedgerCosignature.objects.get().witness.verifier_key == vkey
    key_name, public_key = ledger_verifier()
    signed = notes.verify_note(
        served,
        key_name=key_name,
        public_key=public_key,
        cosigners={"witness.example": key.public_key()},
    )
    assert signed.signed_by == (key_name, "witness.example")
    after = client.get(BASE + "/").content.decode()
    assert admin.institution.name in after
    # Issue 9, finding 10: the page says how many checkpoints a witness vouches for.
    assert re.search(r'id="cosigned-checkpoints">0 <span[^>]*>of 1</span>', page)
    assert "No checkpoint is cosigned by a witness yet" in page
    assert re.search(r'id="cosigned-checkpoints">1 <span[^>]*>of 1</span>', after)
    assert "Witnesses cosigned checkpoints up to 3 leaves" in after


def test_cosign_form_shows_the_error_inline_and_stores_nothing(client):
    admin = MembershipFactory(role=Role.INSTITUTION_ADMIN)
    client.force_login(admin.user)
    _append(2)
    checkpoint = ledger_checkpoint_create()
    key = Ed25519PrivateKey.generate()
    ledger_witness_add(
        by=admin.user,
        institution=admin.institution,
        verifier_key=notes.encode_verifier_key("w", key.public_key()),
    )
    forged = notes.cosign(checkpoint.note, key_name="w", private_key=key).replace(
        f"{ORIGIN}\n2\n", f"{ORIGIN}\n3\n"
    )

    response = client.post(BASE + "/checkpoints/2/cosign", {"note": forged})

    assert response.status_code == 400
    assert "not checkpoint 2" in response.content.decode()
    assert not LedgerCosignature.objects.exists()


def test_researcher_cannot_register_a_witness_key(client, member):
    vkey = notes.encode_verifier_key("w", Ed25519PrivateKey.generate().public_key())
    institution = member.memberships.get().institution

    response = client.post(
        BASE + "/witnesses", {"institution": institution.pk, "verifier_key": vkey}
    )

    assert response.status_code == 400  # not among the institutions they may choose
    assert not institution.ledger_witnesses.exists()
