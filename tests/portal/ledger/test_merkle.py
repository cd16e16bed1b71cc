"""RFC 9162 Merkle tree tests against published vectors (see vectors/README.md for sources).

No expected value in this file is computed by ``portal.ledger.merkle``: roots, node hashes and
proofs come from google/certificate-transparency and transparency-dev/merkle.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from portal.ledger.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    root_from_hashes,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).parent / "vectors"
TESTDATA = VECTORS / "transparency-dev-merkle" / "testdata"
CT = json.loads((VECTORS / "ct_python_merkle_test.json").read_text())
TD = json.loads((VECTORS / "transparency_dev_merkle.json").read_text())
U64 = 1 << 64


def h(hex_string: str) -> bytes:
    return bytes.fromhex(hex_string)


def hs(hex_strings: list[str]) -> list[bytes]:
    return [h(x) for x in hex_strings]


LEAVES = hs(TD["leaves"])
LEAF_HASHES = [leaf_hash(d) for d in LEAVES]
ROOTS = hs(TD["roots"])  # ROOTS[i] = root of the first i + 1 leaves
NODES = [hs(level) for level in TD["node_hashes"]]
SOME_HASH = h(TD["sha256_some_hash"])
EMPTY_TREE_HASH = h(TD["sha256_empty_tree_hash"])


# --- hashing (google/certificate-transparency merkle_test.py, transparency-dev rfc6962) ---


def test_empty_root_is_sha256_of_empty_string():
    assert h(CT["sha256_empty_hash"]) == EMPTY_ROOT
    assert root([]) == EMPTY_ROOT
    assert root_from_hashes([]) == EMPTY_ROOT
    assert MerkleTree().root() == EMPTY_ROOT


@pytest.mark.parametrize(("data", "expected"), CT["sha256_leaves"])
def test_leaf_hash_matches_ct_vectors(data, expected):
    assert leaf_hash(h(data)) == h(expected)


@pytest.mark.parametrize(("left", "right", "expected"), CT["sha256_nodes"])
def test_node_hash_matches_ct_vectors(left, right, expected):
    assert node_hash(h(left), h(right)) == h(expected)


def test_hasher_matches_transparency_dev_rfc6962_vectors():
    vectors = TD["rfc6962_hasher"]
    assert h(vectors["empty_root"]) == EMPTY_ROOT
    assert leaf_hash(b"") == h(vectors["empty_leaf"])
    assert leaf_hash(b"L123456") == h(vectors["leaf_L123456"])
    assert node_hash(b"N123", b"N456") == h(vectors["node_N123_N456"])


@pytest.mark.parametrize("size", range(1, 9))
def test_root_of_leaf_data_matches_ct_vectors(size):
    leaves = hs(CT["test_vector_leaves"])[:size]
    expected = h(CT["test_vector_hashes"][size - 1])
    assert root(leaves) == expected
    assert root_from_hashes([leaf_hash(d) for d in leaves]) == expected
    assert MerkleTree.from_leaves(leaves).root() == expected


def test_tree_root_at_every_past_size_matches_transparency_dev_roots():
    tree = MerkleTree(LEAF_HASHES)
    assert tree.root(0) == EMPTY_TREE_HASH
    for size in range(1, 9):
        assert tree.root(size) == ROOTS[size - 1]


def test_complete_subtrees_match_transparency_dev_node_hashes():
    tree = MerkleTree(LEAF_HASHES)
    for level, nodes in enumerate(NODES):
        width = 1 << level
        for index, expected in enumerate(nodes):
            assert tree.subtree_root(index * width, (index + 1) * width) == expected


def test_append_one_by_one_gives_the_same_roots():
    tree = MerkleTree()
    for size, leaf in enumerate(LEAF_HASHES, start=1):
        tree.append(leaf)
        assert tree.root() == ROOTS[size - 1]
    assert len(tree) == 8


def test_tree_rejects_hash_of_wrong_length():
    with pytest.raises(ValueError):
        MerkleTree([b"short"])
    with pytest.raises(ValueError):
        root_from_hashes([LEAF_HASHES[0], b"x" * 31])
    tree = MerkleTree(LEAF_HASHES[:2])
    with pytest.raises(ValueError):
        tree.append(b"x" * 33)
    assert tree.root() == ROOTS[1]


# --- proof generation against published proofs ---


@pytest.mark.parametrize(("leaf", "size", "proof"), TD["inclusion_proofs"])
def test_inclusion_proof_matches_transparency_dev_verify_test(leaf, size, proof):
    assert inclusion_proof(leaf - 1, LEAF_HASHES[:size]) == hs(proof)


@pytest.mark.parametrize(("index", "size", "proof"), TD["ref_inclusion_proofs"])
def test_inclusion_proof_matches_transparency_dev_reference_test(index, size, proof):
    assert MerkleTree(LEAF_HASHES).inclusion_proof(index, size) == hs(proof)


@pytest.mark.parametrize(
    ("size1", "size2", "proof"), TD["consistency_proofs"] + TD["ref_consistency_proofs"]
)
def test_consistency_proof_matches_transparency_dev(size1, size2, proof):
    assert consistency_proof(size1, LEAF_HASHES[:size2]) == hs(proof)
    assert MerkleTree(LEAF_HASHES).consistency_proof(size1, size2) == hs(proof)


@pytest.mark.parametrize(("size1", "size2", "root1", "root2", "proof"), CT["sha256_proofs"])
def test_consistency_proof_matches_ct_vectors(size1, size2, root1, root2, proof):
    tree = MerkleTree(LEAF_HASHES)
    assert tree.root(size1) == h(root1)
    assert tree.root(size2) == h(root2)
    assert tree.consistency_proof(size1, size2) == hs(proof)


def _node(level: int, index: int) -> bytes:
    return NODES[level][index]


# Ephemeral node l = MTH(D[4:7]) = hash(i, j) of transparency-dev proof/proof_test.go, whose
# trees are drawn over the same 8 leaves; every other node is a published complete subtree.
a, b, c, d, e, f, j, leaf7 = (_node(0, i) for i in range(8))
g, hh, i_ = (_node(1, i) for i in range(3))
k, l8 = _node(2, 0), _node(2, 1)
l7 = node_hash(i_, j)

# (size, index, nodes) from TestInclusion in transparency-dev/merkle proof/proof_test.go.
INCLUSION_NODE_CASES = [
    (1, 0, []),
    (2, 0, [b]),
    (2, 1, [a]),
    (3, 1, [a, c]),
    (7, 0, [b, hh, l7]),
    (7, 1, [a, hh, l7]),
    (7, 2, [d, g, l7]),
    (7, 3, [c, g, l7]),
    (7, 4, [f, j, k]),
    (7, 5, [e, j, k]),
    (7, 6, [i_, k]),
    (4, 2, [d, g]),
    (5, 3, [c, g, e]),
    (6, 3, [c, g, i_]),
    (6, 4, [f, k]),
]

# (size1, size2, nodes) from TestConsistency in the same file.
CONSISTENCY_NODE_CASES = [
    (1, 2, [b]),
    (1, 4, [b, hh]),
    (1, 6, [b, hh, i_]),
    (2, 3, [c]),
    (2, 8, [hh, l8]),
    (3, 7, [c, d, g, l7]),
    (4, 7, [l7]),
    (5, 7, [e, f, j, k]),
    (6, 7, [i_, j, k]),
    (7, 8, [j, leaf7, i_, k]),
    *((s, s, []) for s in (1, 2, 3, 4, 5, 7, 8)),
    (2, 4, [hh]),
    (3, 5, [c, d, g, e]),
    (3, 6, [c, d, g, i_]),
    (4, 6, [i_]),
    (1, 7, [b, hh, l7]),
]


@pytest.mark.parametrize(("size", "index", "nodes"), INCLUSION_NODE_CASES)
def test_inclusion_proof_nodes_match_transparency_dev_proof_test(size, index, nodes):
    assert MerkleTree(LEAF_HASHES).inclusion_proof(index, size) == nodes


@pytest.mark.parametrize(("size1", "size2", "nodes"), CONSISTENCY_NODE_CASES)
def test_consistency_proof_nodes_match_transparency_dev_proof_test(size1, size2, nodes):
    assert MerkleTree(LEAF_HASHES).consistency_proof(size1, size2) == nodes


@pytest.mark.parametrize(("size", "index"), [(0, 0), (0, 1), (1, 2), (0, 3), (7, 8), (7, -1)])
def test_inclusion_proof_rejects_bad_index(size, index):
    with pytest.raises(ValueError):
        MerkleTree(LEAF_HASHES).inclusion_proof(index, size)


@pytest.mark.parametrize(("size1", "size2"), [(5, 0), (9, 8), (-1, 4), (1, 9)])
def test_consistency_proof_rejects_bad_sizes(size1, size2):
    with pytest.raises(ValueError):
        MerkleTree(LEAF_HASHES).consistency_proof(size1, size2)


def test_proof_generation_rejects_size_beyond_tree():
    with pytest.raises(ValueError):
        MerkleTree(LEAF_HASHES).inclusion_proof(0, 9)
    with pytest.raises(ValueError):
        MerkleTree(LEAF_HASHES).root(9)


# --- verification: transparency-dev/merkle proof/verify_test.go, ported ---


def _corrupt_inclusion(index, size, proof, root_hash, leaf):
    """Probes of corruptInclusionProof(); every one must fail (uint64 arithmetic kept)."""
    probes = [
        ((index - 1) % U64, size, root_hash, leaf, proof, "leafIndex - 1"),
        (index + 1, size, root_hash, leaf, proof, "leafIndex + 1"),
        (index ^ 2, size, root_hash, leaf, proof, "leafIndex ^ 2"),
        (index, size * 2, root_hash, leaf, proof, "treeSize * 2"),
        (index, size // 2, root_hash, leaf, proof, "treeSize / 2"),
        (index, size, root_hash, b"WrongLeaf", proof, "wrong leaf"),
        (index, size, EMPTY_TREE_HASH, leaf, proof, "empty root"),
        (index, size, SOME_HASH, leaf, proof, "random root"),
        (index, size, root_hash, leaf, [*proof, b""], "trailing garbage"),
        (index, size, root_hash, leaf, [*proof, root_hash], "trailing root"),
        (index, size, root_hash, leaf, [b"", *proof], "preceding garbage"),
        (index, size, root_hash, leaf, [root_hash, *proof], "preceding root"),
    ]
    for position in range(len(proof)):
        wrong = list(proof)
        wrong[position] = bytes([wrong[position][0] ^ 8]) + wrong[position][1:]
        probes.append((index, size, root_hash, leaf, wrong, f"modified proof[{position}] bit 3"))
    if proof:
        probes.append((index, size, root_hash, leaf, proof[:-1], "removed component"))
    if len(proof) > 1:
        inserted = [proof[0], SOME_HASH, *proof[1:]]
        probes.append((index, size, root_hash, leaf, inserted, "inserted component"))
    return probes


@pytest.mark.parametrize(("leaf", "size", "proof"), TD["inclusion_proofs"])
def test_verify_inclusion_accepts_published_and_rejects_every_corruption(leaf, size, proof):
    proof = hs(proof)
    leaf_h = leaf_hash(LEAVES[leaf - 1])
    assert verify_inclusion(leaf - 1, size, leaf_h, proof, ROOTS[size - 1])
    accepted = [
        desc
        for index, tree_size, root_hash, leaf_value, path, desc in _corrupt_inclusion(
            leaf - 1, size, proof, ROOTS[size - 1], leaf_h
        )
        if verify_inclusion(index, tree_size, leaf_value, path, root_hash)
    ]
    assert accepted == []


def _corrupt_consistency(size1, size2, root1, root2, proof):
    """Probes of corruptConsistencyProof(); every one must fail."""
    probes = [
        ((size1 - 1) % U64, size2, root1, root2, proof, "size1 - 1"),
        (size1 + 1, size2, root1, root2, proof, "size1 + 1"),
        (size1 ^ 2, size2, root1, root2, proof, "size1 ^ 2"),
        (size1, size2 * 2, root1, root2, proof, "size2 * 2"),
        (size1, size2 // 2, root1, root2, proof, "size2 / 2"),
        (size1, size2, b"WrongRoot", root2, proof, "wrong root1"),
        (size1, size2, root1, b"WrongRoot", proof, "wrong root2"),
        (size1, size2, root2, root1, proof, "swapped roots"),
        (size1, size2, root1, root2, [], "empty proof"),
        (size1, size2, root1, root2, [*proof, b""], "trailing garbage"),
        (size1, size2, root1, root2, [*proof, root1], "trailing root1"),
        (size1, size2, root1, root2, [*proof, root2], "trailing root2"),
        (size1, size2, root1, root2, [b"", *proof], "preceding garbage"),
        (size1, size2, root1, root2, [root1, *proof], "preceding root1"),
        (size1, size2, root1, root2, [root2, *proof], "preceding root2"),
        (size1, size2, root1, root2, [proof[0], *proof], "preceding proof[0]"),
        (size1, size2, root1, root2, proof[:-1], "truncated proof"),
    ]
    for position in range(len(proof)):
        wrong = list(proof)
        wrong[position] = bytes([wrong[position][0] ^ 16]) + wrong[position][1:]
        probes.append((size1, size2, root1, root2, wrong, f"modified proof[{position}] bit 4"))
    return probes


@pytest.mark.parametrize(("size1", "size2", "proof"), TD["consistency_proofs"])
def test_verify_consistency_accepts_published_and_rejects_every_corruption(size1, size2, proof):
    proof = hs(proof)
    root1, root2 = ROOTS[size1 - 1], ROOTS[size2 - 1]
    assert verify_consistency(size1, size2, root1, root2, proof)
    if not proof:  # the Go test only corrupts non-trivial proofs
        return
    accepted = [
        desc
        for s1, s2, r1, r2, path, desc in _corrupt_consistency(size1, size2, root1, root2, proof)
        if verify_consistency(s1, s2, r1, r2, path)
    ]
    assert accepted == []


ROOT1, ROOT2 = b"don't care 1", b"don't care 2"


@pytest.mark.parametrize(
    ("size1", "size2", "root1", "root2", "proof", "ok"),
    [
        (0, 0, ROOT1, ROOT2, [], False),
        (1, 1, ROOT1, ROOT2, [], False),
        (0, 0, ROOT1, ROOT1, [], True),
        (0, 1, ROOT1, ROOT2, [], True),
        (1, 1, ROOT2, ROOT2, [], True),
        (1, 0, ROOT1, ROOT2, [], False),
        (2, 1, ROOT1, ROOT2, [], False),
        (1, 2, ROOT1, ROOT2, [], False),
        (0, 0, EMPTY_TREE_HASH, ROOT2, [], False),
        (1, 1, EMPTY_TREE_HASH, ROOT2, [], False),
        (0, 0, EMPTY_TREE_HASH, EMPTY_TREE_HASH, [EMPTY_TREE_HASH], False),
        (0, 1, EMPTY_TREE_HASH, EMPTY_TREE_HASH, [EMPTY_TREE_HASH], False),
        (1, 1, EMPTY_TREE_HASH, EMPTY_TREE_HASH, [EMPTY_TREE_HASH], False),
    ],
)
def test_verify_consistency_edge_cases_of_transparency_dev(size1, size2, root1, root2, proof, ok):
    assert verify_consistency(size1, size2, root1, root2, proof) is ok


@pytest.mark.parametrize(
    ("root_hash", "leaf", "ok"),
    [("hash", "hash", True), ("hash", "", False), ("", "hash", False), ("", "", False)],
)
def test_verify_inclusion_single_entry(root_hash, leaf, ok):
    value = {"hash": leaf_hash(b"data"), "": b""}
    assert verify_inclusion(0, 1, value[leaf], [], value[root_hash]) is ok


@pytest.mark.parametrize(("index", "size"), [(0, 0), (0, 1), (1, 0), (2, 1)])
def test_verify_inclusion_rejects_invalid_root_or_leaf(index, size):
    assert not verify_inclusion(index, size, SOME_HASH, [], b"")
    assert not verify_inclusion(index, size, b"", [], EMPTY_TREE_HASH)
    assert not verify_inclusion(index, size, SOME_HASH, [], EMPTY_TREE_HASH)


# --- transparency-dev/merkle testdata/*.json (mutated proofs with wantErr) ---


def _b64(value: str) -> bytes:
    return base64.b64decode(value)


INCLUSION_FILES = sorted((TESTDATA / "inclusion").glob("*/*.json"))
CONSISTENCY_FILES = sorted((TESTDATA / "consistency").glob("*/*.json"))


def test_testdata_files_are_present():
    assert len(INCLUSION_FILES) >= 40
    assert len(CONSISTENCY_FILES) >= 40


@pytest.mark.parametrize(
    "path", INCLUSION_FILES, ids=[str(p.relative_to(TESTDATA)) for p in INCLUSION_FILES]
)
def test_inclusion_testdata(path):
    case = json.loads(path.read_text())
    proof = [_b64(p) for p in case["proof"] or []]
    ok = verify_inclusion(
        case["leafIdx"], case["treeSize"], _b64(case["leafHash"]), proof, _b64(case["root"])
    )
    assert ok is not case["wantErr"], case["desc"]


@pytest.mark.parametrize(
    "path", CONSISTENCY_FILES, ids=[str(p.relative_to(TESTDATA)) for p in CONSISTENCY_FILES]
)
def test_consistency_testdata(path):
    case = json.loads(path.read_text())
    proof = [_b64(p) for p in case["proof"] or []]
    ok = verify_consistency(
        case["size1"], case["size2"], _b64(case["root1"]), _b64(case["root2"]), proof
    )
    assert ok is not case["wantErr"], case["desc"]


# --- google/certificate-transparency: a real log entry and bad proofs ---


def test_real_ct_log_entry_inclusion():
    leaf_h = h(CT["leaf_hash"])
    assert leaf_hash(h(CT["raw_hex_leaf"])) == leaf_h
    path = hs(CT["sha256_audit_path"])
    expected = h(CT["expected_root_hash"])
    assert verify_inclusion(CT["leaf_index"], CT["tree_size"], leaf_h, path, expected)
    assert not verify_inclusion(CT["leaf_index"], CT["tree_size"], leaf_h, path, b"\0" * 32)
    # test_calculate_root_too_short_proof: an index far beyond what the path can reach.
    too_far = CT["leaf_index"] + 2 ** (len(path) + 1)
    assert not verify_inclusion(too_far, CT["tree_size"], leaf_h, path, expected)


@pytest.mark.parametrize(("size1", "size2", "root1", "root2", "proof"), CT["sha256_proofs"])
def test_verify_consistency_accepts_ct_vectors(size1, size2, root1, root2, proof):
    assert verify_consistency(size1, size2, h(root1), h(root2), hs(proof))


@pytest.mark.parametrize(("size1", "size2", "root1", "root2", "proof"), CT["bad_consistency"])
def test_verify_consistency_rejects_ct_bad_vectors(size1, size2, root1, root2, proof):
    assert not verify_consistency(size1, size2, h(root1), h(root2), hs(proof))


def test_verify_inclusion_all_nodes_all_tree_sizes_up_to_4():
    # CT merkle_test.py builds these proofs from leaf hashes of "aa", "bb", "cc", "dd".
    lh = [leaf_hash(h(x)) for x in ("aa", "bb", "cc", "dd")]
    proofs = {
        1: [[]],
        2: [[lh[1]], [lh[0]]],
        3: [[lh[1], lh[2]], [lh[0], lh[2]], [node_hash(lh[0], lh[1])]],
        4: [
            [lh[1], node_hash(lh[2], lh[3])],
            [lh[0], node_hash(lh[2], lh[3])],
            [lh[3], node_hash(lh[0], lh[1])],
            [lh[2], node_hash(lh[0], lh[1])],
        ],
    }
    tree = MerkleTree()
    for size in range(1, 5):
        tree.append(lh[size - 1])
        for index in range(size):
            assert tree.inclusion_proof(index) == proofs[size][index]
            assert verify_inclusion(index, size, lh[index], proofs[size][index], tree.root())


# --- robustness and larger trees (self-consistency, no published values) ---


GOOD_INCLUSION = dict(
    index=0, size=8, leaf_hash=LEAF_HASHES[0], proof=hs(TD["inclusion_proofs"][1][2]), root=ROOTS[7]
)


@pytest.mark.parametrize(
    "bad",
    [
        dict(index=None),
        dict(index=-1),
        dict(index=True),
        dict(size="8"),
        dict(leaf_hash="x" * 32),
        dict(proof="abc"),
        dict(proof=[1, 2, 3]),
        dict(proof=None),
        dict(root=None),
    ],
)
def test_verify_inclusion_returns_false_instead_of_raising(bad):
    assert verify_inclusion(**GOOD_INCLUSION)
    assert not verify_inclusion(**{**GOOD_INCLUSION, **bad})


GOOD_CONSISTENCY = dict(
    old_size=6,
    new_size=8,
    old_root=ROOTS[5],
    new_root=ROOTS[7],
    proof=hs(TD["consistency_proofs"][2][2]),
)


@pytest.mark.parametrize(
    "bad",
    [
        dict(old_size=None),
        dict(old_size=-6),
        dict(new_size=8.0),
        dict(old_root="x" * 32),
        dict(new_root=None),
        dict(proof="abc"),
        dict(proof=[None]),
        dict(proof=42),
    ],
)
def test_verify_consistency_returns_false_instead_of_raising(bad):
    assert verify_consistency(**GOOD_CONSISTENCY)
    assert not verify_consistency(**{**GOOD_CONSISTENCY, **bad})


def test_every_proof_of_a_1000_leaf_tree_verifies():
    leaves = [leaf_hash(i.to_bytes(4, "big")) for i in range(1000)]
    tree = MerkleTree(leaves)
    grown = MerkleTree()
    grown.extend(leaves[:333])
    grown.extend(leaves[333:])
    assert grown.levels == tree.levels
    assert tree.root() == root_from_hashes(leaves)
    for size in (1, 2, 3, 127, 128, 129, 500, 999, 1000):
        tree_root = tree.root(size)
        assert tree_root == root_from_hashes(leaves[:size])
        for index in {0, size // 2, size - 1}:
            path = tree.inclusion_proof(index, size)
            assert verify_inclusion(index, size, leaves[index], path, tree_root)
            assert not verify_inclusion(index, size, leaves[(index + 1) % 1000], path, tree_root)
        for old in (1, size // 3, size - 1):
            if 0 < old < size:
                proof = tree.consistency_proof(old, size)
                assert verify_consistency(old, size, tree.root(old), tree_root, proof)
                assert not verify_consistency(old, size, tree.root(old), SOME_HASH, proof)
