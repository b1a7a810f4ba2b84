"""Receipts: canonical encodings, EIP-712 receipts, Merkle batches and the HPKE envelope.

Modules: ``canonical`` (ExecRequest/ExecResult, deterministic CBOR), ``eip712`` (Receipt,
Domain, signing), ``signed`` (SignedReceipt), ``merkle`` (batches and proofs), ``epoch_keys``
and ``envelope`` (HPKE), ``streaming`` (StreamHasher), ``vectors`` (shared test vectors).
The spec is docs/receipts.md.
"""

from verinfer.receipts.canonical import ExecRequest, ExecResult
from verinfer.receipts.eip712 import (
    Domain,
    Receipt,
    ReceiptSigner,
    recover_signer,
    sign_receipt,
    verify_receipt,
)
from verinfer.receipts.envelope import (
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    open_envelope,
    seal,
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
from verinfer.receipts.signed import SignedReceipt
from verinfer.receipts.streaming import StreamHasher

__all__ = [
    "Domain",
    "EnvelopeBinding",
    "EnvelopeContents",
    "EnvelopeSuite",
    "EpochPrivateKey",
    "EpochPublicKey",
    "ExecRequest",
    "ExecResult",
    "MerkleProof",
    "MerkleTree",
    "Receipt",
    "ReceiptSigner",
    "SignedReceipt",
    "StreamHasher",
    "build_tree",
    "ciphertext_hash",
    "derive_epoch_keypair",
    "load_public_key",
    "open_envelope",
    "public_key_bytes",
    "recover_signer",
    "seal",
    "sign_receipt",
    "verify_proof",
    "verify_receipt",
]
