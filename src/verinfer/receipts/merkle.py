"""Merkle batches of receipt digests (the shared format; Solidity verifies the same rule).

leaf = keccak256(0x00 || receiptDigest); node = keccak256(0x01 || left || right). A level with
an odd count promotes its last node unchanged. The root of a one-leaf batch is its leaf hash.
A proof is the bottom-up list of siblings plus the leaf index; bit i of the index says whether
the current node is the right child at level i. Because of odd-promotion a level may have no
sibling for the node, so the proof also carries ``leaf_count``: with it both sides know which
levels are skipped, and a proof cannot be replayed for a different batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eth_utils import keccak

from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.errors import MerkleError

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"


def leaf_hash(digest: bytes) -> bytes:
    if not isinstance(digest, bytes) or len(digest) != 32:
        raise MerkleError(f"a receipt digest must be 32 bytes, got {digest!r}")
    return keccak(LEAF_PREFIX + digest)


def node_hash(left: bytes, right: bytes) -> bytes:
    return keccak(NODE_PREFIX + left + right)


@dataclass(frozen=True)
class MerkleProof:
    index: int
    siblings: tuple[bytes, ...]
    leaf_count: int

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "leafCount": self.leaf_count,
                "siblings": [to_hex(s) for s in self.siblings]}

    @property
    def size_bytes(self) -> int:
        """Wire size as Solidity takes it: 32 per sibling + index and leaf count (uint64 each)."""
        return 32 * len(self.siblings) + 16


def _levels_with_siblings(index: int, leaf_count: int) -> list[bool]:
    """For each level bottom-up: does the node on the path from ``index`` have a sibling?"""
    out: list[bool] = []
    n = leaf_count
    while n > 1:
        out.append(not (index == n - 1 and n % 2 == 1))  # odd last node is promoted
        index //= 2
        n = (n + 1) // 2
    return out


@dataclass(frozen=True)
class MerkleTree:
    leaves: tuple[bytes, ...]  # leaf hashes
    levels: tuple[tuple[bytes, ...], ...]  # levels[0] = leaves, levels[-1] = (root,)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> MerkleProof:
        n = len(self.leaves)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise MerkleError(f"leaf index {index!r} is outside the batch of {n}")
        siblings: list[bytes] = []
        i = index
        for level in self.levels[:-1]:
            sib = i ^ 1
            if sib < len(level):
                siblings.append(level[sib])
            i //= 2
        return MerkleProof(index, tuple(siblings), n)


def build_tree(digests: Sequence[bytes]) -> MerkleTree:
    if len(digests) == 0:
        raise MerkleError("an empty batch has no Merkle root")
    level = tuple(leaf_hash(d) for d in digests)
    levels = [level]
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = tuple(nxt)
        levels.append(level)
    return MerkleTree(levels[0], tuple(levels))


def compute_root(digest: bytes, proof: MerkleProof) -> bytes:
    """The root a proof leads to; raises :class:`MerkleError` if the proof is malformed."""
    if (isinstance(proof.leaf_count, bool) or not isinstance(proof.leaf_count, int)
            or proof.leaf_count < 1):
        raise MerkleError(f"leaf_count must be >= 1, got {proof.leaf_count!r}")
    if (isinstance(proof.index, bool) or not isinstance(proof.index, int)
            or not 0 <= proof.index < proof.leaf_count):
        raise MerkleError(f"index {proof.index!r} is outside the batch of {proof.leaf_count}")
    has_sibling = _levels_with_siblings(proof.index, proof.leaf_count)
    if len(proof.siblings) != sum(has_sibling):
        raise MerkleError(f"a proof for leaf {proof.index} of {proof.leaf_count} needs "
                          f"{sum(has_sibling)} siblings, got {len(proof.siblings)}")
    node = leaf_hash(digest)
    it = iter(proof.siblings)
    for level, present in enumerate(has_sibling):
        if not present:
            continue
        sib = next(it)
        if not isinstance(sib, bytes) or len(sib) != 32:
            raise MerkleError(f"sibling at level {level} must be 32 bytes, got {sib!r}")
        node = node_hash(sib, node) if (proof.index >> level) & 1 else node_hash(node, sib)
    return node


def verify_proof(digest: bytes, proof: MerkleProof, root: bytes) -> bool:
    """True iff ``proof`` places ``digest`` under ``root``. Malformed proofs return False."""
    try:
        return compute_root(digest, proof) == root
    except MerkleError:
        return False
