"""RFC 9162 (Certificate Transparency v2) Merkle tree hashing and proofs, section 2.1.

This module owns the tamper-evidence math of the contribution ledger: leaf and node hashes,
tree heads, inclusion proofs and consistency proofs. It imports no Django; the ledger stores
*leaf hashes* (``leaf_hash(entry_bytes)``) and rebuilds a :class:`MerkleTree` from them.

Definitions (RFC 9162 §2.1.1, unchanged from RFC 6962 §2.1), with SHA-256 as HASH:

* ``MTH({}) = SHA-256()``, the hash of the empty string;
* ``MTH({d0}) = SHA-256(0x00 || d0)`` (leaf hash);
* ``MTH(D[n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))`` where ``k`` is the largest
  power of two smaller than ``n`` (node hash).

Proof *generation* raises :class:`ValueError` on impossible sizes or indices. Proof
*verification* never raises: malformed input (wrong hash lengths, wrong proof length,
impossible sizes, non-bytes values) simply returns ``False``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HASH_SIZE = 32
"""Bytes in a SHA-256 digest, the size of every leaf hash, node hash and root."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""``MTH({})``: the root of the empty tree (RFC 9162 §2.1.1)."""

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"
_sha256 = hashlib.sha256


def leaf_hash(data: bytes) -> bytes:
    """Leaf hash ``SHA-256(0x00 || data)`` (RFC 9162 §2.1.1).

    Args:
        data: the leaf's entry bytes (any length).

    Returns:
        32-byte digest.
    """
    return _sha256(_LEAF_PREFIX + bytes(data)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Interior node hash ``SHA-256(0x01 || left || right)`` (RFC 9162 §2.1.1).

    Args:
        left: hash of the left subtree (32 bytes in a real tree; any length is hashed).
        right: hash of the right subtree.

    Returns:
        32-byte digest.
    """
    return _sha256(_NODE_PREFIX + bytes(left) + bytes(right)).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def _is_hash(value: object) -> bool:
    return _is_bytes(value) and len(value) == HASH_SIZE


def _is_bytes(value: object) -> bool:
    return isinstance(value, bytes | bytearray | memoryview)


def _as_bytes(value: object) -> bytes | None:
    return bytes(value) if _is_bytes(value) else None


def _proof_hashes(proof: object) -> list[bytes] | None:
    """The proof as a list of 32-byte hashes, or None if it is not one."""
    if isinstance(proof, str | bytes | bytearray | memoryview):
        return None
    try:
        items = list(proof)
    except TypeError:
        return None
    if not all(_is_hash(p) for p in items):
        return None
    return [bytes(p) for p in items]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def root_from_hashes(hashes: Sequence[bytes]) -> bytes:
    """Merkle tree head ``MTH`` of a list of precomputed *leaf hashes*.

    Pairs adjacent nodes level by level and promotes an unpaired last node unchanged, which
    yields exactly the left-balanced tree of RFC 9162 §2.1.1.

    Args:
        hashes: leaf hashes in log order, each 32 bytes.

    Returns:
        32-byte root; :data:`EMPTY_ROOT` for an empty list.

    Raises:
        ValueError: an element is not a 32-byte hash.
    """
    level = [bytes(h) for h in hashes]
    for index, value in enumerate(level):
        if len(value) != HASH_SIZE:
            raise ValueError(f"leaf hash {index} is {len(value)} bytes, expected {HASH_SIZE}")
    if not level:
        return EMPTY_ROOT
    while len(level) > 1:
        paired = [
            _sha256(_NODE_PREFIX + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def root(leaves: Sequence[bytes]) -> bytes:
    """Merkle tree head ``MTH(D[n])`` of leaf *data* (RFC 9162 §2.1.1).

    Args:
        leaves: the entries' bytes in log order.

    Returns:
        32-byte root; ``SHA-256(b"")`` for an empty list.
    """
    return root_from_hashes([leaf_hash(d) for d in leaves])


class MerkleTree:
    """An append-only RFC 9162 Merkle tree over leaf hashes, with every full subtree cached.

    ``levels[h]`` is one ``bytearray`` holding, back to back, the 32-byte hashes of all
    *complete* subtrees of height ``h`` (``levels[0]`` are the leaf hashes), so the node
    covering leaves ``[j·2^h, (j+1)·2^h)`` is a slice lookup. Hashes of incomplete right-edge
    subtrees are combined on demand from O(log n) cached nodes, which makes inclusion and
    consistency proofs O(log n) (or O(log² n) hashes in the worst case) for any past tree
    size. Memory is about 64 bytes per leaf (32 for the leaf, 32 for all interior nodes).
    """

    def __init__(self, hashes: Iterable[bytes] = ()) -> None:
        """Build the tree from leaf hashes.

        Args:
            hashes: leaf hashes in log order, each 32 bytes.

        Raises:
            ValueError: an element is not a 32-byte hash.
        """
        self.levels: list[bytearray] = [bytearray()]
        self.extend(hashes)

    @classmethod
    def from_leaves(cls, leaves: Iterable[bytes]) -> MerkleTree:
        """Build a tree from leaf *data* (each entry hashed with :func:`leaf_hash`)."""
        return cls(leaf_hash(d) for d in leaves)

    @property
    def size(self) -> int:
        """Number of leaves."""
        return len(self.levels[0]) // HASH_SIZE

    def __len__(self) -> int:
        return self.size

    def append(self, hash_: bytes) -> None:
        """Append one leaf hash, updating the cached complete subtrees (O(log n) amortised).

        Raises:
            ValueError: ``hash_`` is not 32 bytes.
        """
        self.extend((hash_,))

    def extend(self, hashes: Iterable[bytes]) -> None:
        """Append leaf hashes in order.

        Raises:
            ValueError: an element is not a 32-byte hash (earlier elements stay appended).
        """
        leaves = self.levels[0]
        start = self.size
        for offset, hash_ in enumerate(hashes):
            if not _is_hash(hash_):
                self._rebuild_from(start)
                raise ValueError(f"leaf hash {start + offset} is not {HASH_SIZE} bytes")
            leaves += hash_
        self._rebuild_from(start)

    def _rebuild_from(self, start: int) -> None:
        """Recompute the complete nodes that cover leaves at index >= ``start``."""
        height = 0
        first = start  # first node index at this height that may be new
        while True:
            below = self.levels[height]
            pairs = len(below) // (2 * HASH_SIZE)
            first //= 2
            if pairs == 0:
                break
            if height + 1 == len(self.levels):
                self.levels.append(bytearray())
            above = self.levels[height + 1]
            del above[first * HASH_SIZE :]
            view = memoryview(below)
            above += b"".join(
                _sha256(_NODE_PREFIX + view[2 * j * HASH_SIZE : (2 * j + 2) * HASH_SIZE]).digest()
                for j in range(first, pairs)
            )
            view.release()
            height += 1

    def leaf(self, index: int) -> bytes:
        """Leaf hash at ``index``.

        Raises:
            IndexError: ``index`` is outside ``[0, size)``.
        """
        if not 0 <= index < self.size:
            raise IndexError(f"leaf index {index} outside [0, {self.size})")
        return self._node(0, index)

    def _node(self, height: int, index: int) -> bytes:
        offset = index * HASH_SIZE
        return bytes(self.levels[height][offset : offset + HASH_SIZE])

    def _check_size(self, size: int | None) -> int:
        if size is None:
            return self.size
        if not _is_count(size) or size > self.size:
            raise ValueError(f"tree size {size} outside [0, {self.size}]")
        return size

    def subtree_root(self, start: int, end: int) -> bytes:
        """``MTH(D[start:end])`` for ``0 <= start < end <= size``.

        Aligned ranges (those that occur in RFC 9162 proofs) cost O(log n) lookups and
        hashes; an arbitrary unaligned range costs up to O(end − start) hashes.

        Raises:
            ValueError: the range is empty or outside the tree.
        """
        if not (_is_count(start) and _is_count(end) and start < end <= self.size):
            raise ValueError(f"subtree [{start}, {end}) outside [0, {self.size})")
        return self._range_hash(start, end)

    def _range_hash(self, start: int, end: int) -> bytes:
        width = end - start
        if width & (width - 1) == 0 and start % width == 0:
            return self._node(width.bit_length() - 1, start // width)
        k = _split(width)
        return node_hash(self._range_hash(start, start + k), self._range_hash(start + k, end))

    def root(self, size: int | None = None) -> bytes:
        """Root ``MTH(D[0:size])`` of the tree at ``size`` leaves (default: all).

        Raises:
            ValueError: ``size`` is negative or larger than the tree.
        """
        size = self._check_size(size)
        if size == 0:
            return EMPTY_ROOT
        return self._range_hash(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """Audit path ``PATH(index, D[0:size])`` (RFC 9162 §2.1.3.1).

        Args:
            index: leaf index, ``0 <= index < size``.
            size: tree size the proof is against (default: all leaves).

        Returns:
            Sibling hashes from the leaf upwards (32 bytes each); empty for a one-leaf tree.

        Raises:
            ValueError: ``size`` exceeds the tree or ``index`` is outside ``[0, size)``.
        """
        size = self._check_size(size)
        if not _is_count(index) or index >= size:
            raise ValueError(f"leaf index {index} outside [0, {size})")
        path: list[bytes] = []
        lo, hi = 0, size
        while hi - lo > 1:
            k = _split(hi - lo)
            if index < lo + k:
                path.append(self._range_hash(lo + k, hi))
                hi = lo + k
            else:
                path.append(self._range_hash(lo, lo + k))
                lo += k
        path.reverse()
        return path

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """Consistency proof ``PROOF(old_size, D[0:new_size])`` (RFC 9162 §2.1.4.1).

        ``PROOF(m, D[n]) = SUBPROOF(m, D[n], true)``; the proof is empty when
        ``old_size == new_size`` and, by convention (any tree extends the empty tree), when
        ``old_size == 0``.

        Args:
            old_size: size of the earlier tree, ``0 <= old_size <= new_size``.
            new_size: size of the later tree (default: all leaves).

        Returns:
            Node hashes (32 bytes each) in RFC order.

        Raises:
            ValueError: ``new_size`` exceeds the tree, or ``old_size`` is negative or larger
                than ``new_size``.
        """
        new_size = self._check_size(new_size)
        if not _is_count(old_size) or old_size > new_size:
            raise ValueError(f"old size {old_size} outside [0, {new_size}]")
        if old_size in (0, new_size):
            return []
        proof: list[bytes] = []
        lo, hi, complete = 0, new_size, True
        while old_size != hi:
            k = _split(hi - lo)
            if old_size - lo <= k:
                proof.append(self._range_hash(lo + k, hi))
                hi = lo + k
            else:
                proof.append(self._range_hash(lo, lo + k))
                lo += k
                complete = False
        if not complete:
            proof.append(self._range_hash(lo, hi))
        proof.reverse()
        return proof


def inclusion_proof(index: int, hashes: Sequence[bytes]) -> list[bytes]:
    """Audit path of leaf ``index`` in the tree of all ``hashes`` (RFC 9162 §2.1.3.1).

    Builds a :class:`MerkleTree` (O(n)); keep a tree for repeated proofs.

    Args:
        index: leaf index, ``0 <= index < len(hashes)``.
        hashes: leaf hashes in log order, each 32 bytes.

    Returns:
        Sibling hashes from the leaf upwards.

    Raises:
        ValueError: ``index`` is out of range or an element is not a 32-byte hash.
    """
    return MerkleTree(hashes).inclusion_proof(index)


def consistency_proof(old_size: int, hashes: Sequence[bytes]) -> list[bytes]:
    """Consistency proof from the first ``old_size`` leaves to all ``hashes`` (RFC 9162 §2.1.4.1).

    Args:
        old_size: ``0 <= old_size <= len(hashes)``.
        hashes: leaf hashes of the newer tree in log order, each 32 bytes.

    Returns:
        Node hashes in RFC order (empty when ``old_size`` is 0 or ``len(hashes)``).

    Raises:
        ValueError: ``old_size`` is out of range or an element is not a 32-byte hash.
    """
    return MerkleTree(hashes).consistency_proof(old_size)


def verify_inclusion(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """Verify an inclusion proof with the algorithm of RFC 9162 §2.1.3.2.

    Args:
        index: the leaf's index.
        size: tree size the proof and root belong to.
        leaf_hash: 32-byte leaf hash (``leaf_hash(entry)``, not the entry).
        proof: audit path, 32-byte hashes.
        root: 32-byte root of the tree at ``size``.

    Returns:
        ``True`` iff the proof is well formed and recomputes ``root``; never raises.
    """
    if not (_is_count(index) and _is_count(size) and _is_hash(leaf_hash) and _is_hash(root)):
        return False
    path = _proof_hashes(proof)
    if path is None:
        return False
    # 1. leaf_index >= tree_size: fail.
    if index >= size:
        return False
    # 2-3.
    fn, sn = index, size - 1
    r = bytes(leaf_hash)
    # 4.
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    # 5.
    return sn == 0 and r == bytes(root)


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Verify a consistency proof with the algorithm of RFC 9162 §2.1.4.2.

    Cases outside the RFC algorithm's ``0 < old_size < new_size`` follow the
    transparency-dev/merkle verifier: ``old_size > new_size`` fails; equal sizes need an empty
    proof and equal roots; ``old_size == 0`` needs an empty proof (the empty tree is a prefix
    of every tree).

    Args:
        old_size, new_size: the two tree sizes.
        old_root, new_root: their 32-byte roots.
        proof: consistency proof, 32-byte hashes.

    Returns:
        ``True`` iff the proof shows the old tree is a prefix of the new one; never raises.
    """
    path = _proof_hashes(proof)
    if path is None or not (_is_count(old_size) and _is_count(new_size)):
        return False
    if old_size > new_size:
        return False
    if old_size == new_size:
        return not path and _is_bytes(old_root) and bytes(old_root) == _as_bytes(new_root)
    if old_size == 0:
        return not path
    if not (_is_hash(old_root) and _is_hash(new_root)):
        return False
    # 1. An empty path fails.
    if not path:
        return False
    # 2. If first is an exact power of 2, prepend first_hash.
    if old_size & (old_size - 1) == 0:
        path.insert(0, bytes(old_root))
    # 3.
    fn, sn = old_size - 1, new_size - 1
    # 4.
    while fn & 1:
        fn >>= 1
        sn >>= 1
    # 5.
    fr = sr = path[0]
    # 6.
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    # 7.
    return fr == bytes(old_root) and sr == bytes(new_root) and sn == 0
