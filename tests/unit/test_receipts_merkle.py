"""Merkle batches: the shared rule (leaf/node prefixes, odd promotion) and proof checking."""

from __future__ import annotations

import hashlib

import pytest
from eth_utils import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from verinfer.receipts.errors import MerkleError
from verinfer.receipts.merkle import MerkleProof, build_tree, compute_root, verify_proof


def digests(n: int) -> list[bytes]:
    return [hashlib.sha256(b"d%d" % i).digest() for i in range(n)]


def test_single_leaf_root_is_leaf_hash() -> None:
    d = digests(1)[0]
    tree = build_tree([d])
    assert tree.root == keccak(b"\x00" + d)
    assert tree.proof(0) == MerkleProof(0, (), 1)
    assert verify_proof(d, tree.proof(0), tree.root)


def test_three_leaves_promote_the_odd_node() -> None:
    a, b, c = digests(3)
    la, lb, lc = (keccak(b"\x00" + x) for x in (a, b, c))
    ab = keccak(b"\x01" + la + lb)
    assert build_tree([a, b, c]).root == keccak(b"\x01" + ab + lc)
    assert build_tree([a, b, c]).proof(2).siblings == (ab,)


def test_five_leaves_by_hand() -> None:
    d = digests(5)
    leaf = [keccak(b"\x00" + x) for x in d]
    n01, n23 = keccak(b"\x01" + leaf[0] + leaf[1]), keccak(b"\x01" + leaf[2] + leaf[3])
    n0123 = keccak(b"\x01" + n01 + n23)
    tree = build_tree(d)
    assert tree.root == keccak(b"\x01" + n0123 + leaf[4])
    assert tree.proof(4).siblings == (n0123,)
    assert tree.proof(2).siblings == (leaf[3], n01, leaf[4])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 70), st.data())
def test_every_proof_verifies_and_wrong_ones_do_not(n: int, data: st.DataObject) -> None:
    d = digests(n)
    tree = build_tree(d)
    i = data.draw(st.integers(0, n - 1))
    proof = tree.proof(i)
    assert verify_proof(d[i], proof, tree.root)
    assert compute_root(d[i], proof) == tree.root
    other = hashlib.sha256(b"other").digest()
    assert not verify_proof(other, proof, tree.root)
    if n > 1:
        j = (i + 1) % n
        assert not verify_proof(d[i], MerkleProof(j, proof.siblings, n), tree.root)
        assert not verify_proof(d[j], proof, tree.root)
    if proof.siblings:
        k = data.draw(st.integers(0, len(proof.siblings) - 1))
        bad = list(proof.siblings)
        bad[k] = bytes([bad[k][0] ^ 1]) + bad[k][1:]
        assert not verify_proof(d[i], MerkleProof(i, tuple(bad), n), tree.root)
        # a proof with a sibling dropped or added is malformed, not merely wrong
        assert not verify_proof(d[i], MerkleProof(i, proof.siblings[:-1], n), tree.root)
    assert not verify_proof(d[i], MerkleProof(i, (*proof.siblings, tree.root), n), tree.root)


def test_bad_inputs_raise_typed_errors() -> None:
    with pytest.raises(MerkleError):
        build_tree([])
    with pytest.raises(MerkleError, match="32 bytes"):
        build_tree([b"short"])
    tree = build_tree(digests(3))
    for bad in (-1, 3, True):
        with pytest.raises(MerkleError):
            tree.proof(bad)
    with pytest.raises(MerkleError, match="leaf_count"):
        compute_root(digests(1)[0], MerkleProof(0, (), 0))
    with pytest.raises(MerkleError, match="outside"):
        compute_root(digests(1)[0], MerkleProof(5, (), 3))
    with pytest.raises(MerkleError, match="32 bytes"):
        compute_root(digests(1)[0], MerkleProof(0, (b"x",), 2))
