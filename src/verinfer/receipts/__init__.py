"""Receipts: canonical encodings, EIP-712 receipts, Merkle batches and the HPKE envelope.

Modules: ``canonical`` (ExecRequest/ExecResult, deterministic CBOR), ``eip712`` (Receipt,
Domain, signing), ``signed`` (SignedReceipt), ``merkle`` (batches and proofs), ``epoch_keys``
and ``envelope`` (HPKE), ``streaming`` (StreamHasher), ``vectors`` (shared test vectors).
The spec is docs/receipts.md.
"""
