"""GET /v1/receipts/{id}: a receipt again, later, with where its evidence stands.

The answer names the publication state (queued → published → batched → committed), the DA
pointer of the ciphertext, and once batched the batch root, the manifest pointer and the
receipt's Merkle inclusion proof — everything a watcher needs to open a challenge.
"""

from __future__ import annotations

from typing import Any

from verinfer.da_client.manifest import inclusion_proof
from verinfer.da_client.outbox import Outbox
from verinfer.errors import InvalidRequestError, ModelNotFoundError
from verinfer.protocol.hexutil import HexFormatError, parse_hex, to_hex
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.signed import SignedReceipt


class ReceiptNotFoundError(ModelNotFoundError):
    code = "receipt_not_found"


def parse_receipt_id(value: str) -> bytes:
    try:
        return parse_hex(value, 32, "receipt_id")
    except HexFormatError:  # the id comes from the URL: say what one looks like, echo little
        raise InvalidRequestError(f"a receipt id is 0x + 64 hex digits, got {value[:80]!r}",
                                  param="receipt_id") from None


def receipt_status(outbox: Outbox, domain: Domain, receipt_id: str, *,
                   owner: bytes | None = None) -> dict[str, Any]:
    """``owner``: sha256 of the caller's API key when the server requires keys — then only
    the key that paid for the receipt sees it (others, and entries with no recorded owner,
    get the same 404 as an unknown id, so existence does not leak either)."""
    digest = parse_receipt_id(receipt_id)
    raw = outbox.receipt(digest)
    state = outbox.entry_state(digest)
    if owner is not None and outbox.receipt_owner(digest) != owner:
        raw = None
    if raw is None or state is None:
        raise ReceiptNotFoundError(f"no receipt {receipt_id} was issued by this operator",
                                   param="receipt_id")
    signed = SignedReceipt.from_bytes(raw)
    entry_state, pointer, batch_id = state
    out: dict[str, Any] = {
        "receipt_id": to_hex(digest),
        "receipt": signed.receipt.as_typed_data(signed.domain),
        "signature": to_hex(signed.signature),
        "state": entry_state,
        "da_pointer": pointer,
        "batch": None,
    }
    batch = outbox.batch(batch_id) if batch_id is not None else None
    if batch is not None:
        proof = inclusion_proof(batch.manifest, digest, domain)
        out["batch"] = {
            "root": to_hex(batch.root), "leaf_count": batch.leaf_count,
            "manifest_pointer": batch.manifest_pointer, "state": batch.state,
            "proof": {"index": proof.index, "leaf_count": proof.leaf_count,
                      "siblings": [to_hex(s) for s in proof.siblings]},
        }
    return out
