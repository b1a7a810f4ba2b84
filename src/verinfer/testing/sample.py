"""Well-formed, really signed sample entries for tests, benchmarks and smoke runs.

The key is a public test key (never use it for anything of value). Each payload gets its own
receipt whose ciphertextHash is the payload's sha256, signed under a devnet-style domain.
"""

from __future__ import annotations

from functools import cache

from verinfer.da_client.pointer import sha256
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt

UNSAFE_SAMPLE_KEY = bytes.fromhex(
    "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")  # anvil account 0
SAMPLE_DOMAIN = Domain(31337, "0x" + "5f" * 20)


@cache
def _signer(key: bytes) -> ReceiptSigner:
    return ReceiptSigner(key)


def sample_signed_receipt(payload: bytes, *, issued_at: int = 1_700_000_000,
                          key: bytes = UNSAFE_SAMPLE_KEY,
                          domain: Domain = SAMPLE_DOMAIN) -> SignedReceipt:
    signer = _signer(key)
    receipt = Receipt(operator=signer.address, chain_id=domain.chain_id,
                      model_id=sha256(b"sample model"),
                      engine_fingerprint_hash=sha256(b"sample engine fingerprint"),
                      req_hash=sha256(b"req" + payload), out_hash=sha256(b"out" + payload),
                      key_epoch=1, ciphertext_hash=sha256(payload), issued_at=issued_at)
    return SignedReceipt.sign(receipt, domain, signer)


def sample_entry(payload: bytes, **kw: object) -> tuple[bytes, bytes, bytes]:
    """(receipt digest, signed receipt bytes, payload): the arguments of Outbox.enqueue."""
    signed = sample_signed_receipt(payload, **kw)  # type: ignore[arg-type]
    return signed.digest, signed.to_bytes(), payload
