"""Receipts: canonical encodings, EIP-712 receipts, Merkle batches and the HPKE envelope."""

from verinfer.receipts.eip712 import (
    Domain,
    Receipt,
    recover_signer,
    sign_receipt,
    verify_receipt,
)
from verinfer.receipts.epoch_keys import (
    EnvelopeSuite,
    EpochPrivateKey,
    EpochPublicKey,
    derive_epoch_keypair,
    load_public_key,
    public_key_bytes,
)
from verinfer.receipts.merkle import MerkleProof, MerkleTree, build_tree, verify_proof

__all__ = [
    "Domain",
    "EnvelopeSuite",
    "EpochPrivateKey",
    "EpochPublicKey",
    "MerkleProof",
    "MerkleTree",
    "Receipt",
    "build_tree",
    "derive_epoch_keypair",
    "load_public_key",
    "public_key_bytes",
    "recover_signer",
    "sign_receipt",
    "verify_proof",
    "verify_receipt",
]
