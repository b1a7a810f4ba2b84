"""GET /v1/receipts/{id}: a receipt again, later, with where its evidence stands.

The answer names the publication state (queued → published → batched → committed), the DA
pointer of the ciphertext, and once batched the batch root, the manifest pointer and the
receipt's Merkle inclusion proof — everything a watcher needs to open a challenge.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from verinfer.da_client.manifest import BatchManifest, parse_manifest
from verinfer.da_client.outbox import BatchRow, Outbox
from verinfer.errors import InvalidRequestError, ModelNotFoundError
from verinfer.operator.committer import StreamBatchIndex
from verinfer.protocol.hexutil import HexFormatError, parse_hex, to_hex
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.signed import SignedReceipt


class ReceiptNotFoundError(ModelNotFoundError):
    code = "receipt_not_found"


#: Parsed manifests kept for repeated lookups: parsing checks every entry (a 1,024-entry
#: manifest costs ~0.2 s of CPU), and every receipt of a batch is answered from the same one.
MANIFEST_CACHE_ENTRIES = 8
_manifests: OrderedDict[tuple[bytes, Domain], BatchManifest] = OrderedDict()
_manifests_lock = threading.Lock()


def parsed_manifest(manifest: bytes, domain: Domain) -> BatchManifest:
    """``parse_manifest(manifest, domain)``, once per distinct manifest among the last
    MANIFEST_CACHE_ENTRIES (keyed by the bytes' sha256 and the domain)."""
    key = (hashlib.sha256(manifest).digest(), domain)
    with _manifests_lock:
        hit = _manifests.get(key)
        if hit is not None:
            _manifests.move_to_end(key)
            return hit
    parsed = parse_manifest(manifest, domain)  # outside the lock: CPU, not shared state
    with _manifests_lock:
        _manifests[key] = parsed
        while len(_manifests) > MANIFEST_CACHE_ENTRIES:
            _manifests.popitem(last=False)
    return parsed


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
    entry_state, pointer, batch_id = state
    batch = outbox.batch(batch_id) if batch_id is not None else None
    return _answer(digest, SignedReceipt.from_bytes(raw), entry_state, pointer, batch, domain)


def stream_receipt_status(index: StreamBatchIndex, outbox: Outbox, domain: Domain,
                          receipt_id: str, *, owner: bytes | None = None) -> dict[str, Any]:
    """The same answer on a serving replica in stream mode (docs/deploy.md §6), whichever
    replica signed the receipt: once the committer has batched it, from its records (the batch
    root in Redis, the manifest with the receipt, signature and ciphertext pointer on DA);
    before that, from this replica's local copy if it keeps one (state ``queued``: in the
    stream, waiting for the committer). ``owner`` as in :func:`receipt_status`, read from the
    stream's record of the paying key."""
    digest = parse_receipt_id(receipt_id)
    if owner is not None and index.owner(digest) != owner:
        raise ReceiptNotFoundError(f"no receipt {receipt_id} was issued by this operator",
                                   param="receipt_id")
    state, _, batch_id = index.entry_state(digest)
    batch = None if batch_id is None else index.batch(batch_id)
    if batch is None:  # not batched yet: only a local copy knows it
        return receipt_status(outbox, domain, receipt_id)
    manifest = parsed_manifest(batch.manifest, domain)
    found = manifest.entries[manifest.index_of(digest)]
    if batch.state != "committed":  # "open": decided, its manifest on DA, the commit to come
        batch = replace(batch, state="published")
    return _answer(digest, found.signed, "committed" if batch.state == "committed" else state,
                   str(found.ciphertext), batch, domain)


def _answer(digest: bytes, signed: SignedReceipt, state: str, pointer: str | None,
            batch: BatchRow | None, domain: Domain) -> dict[str, Any]:
    out: dict[str, Any] = {
        "receipt_id": to_hex(digest),
        "receipt": signed.receipt.as_typed_data(signed.domain),
        "signature": to_hex(signed.signature),
        "state": state,
        "da_pointer": pointer,
        "batch": None,
    }
    if batch is not None:
        proof = parsed_manifest(batch.manifest, domain).proof(digest)
        out["batch"] = {
            "root": to_hex(batch.root), "leaf_count": batch.leaf_count,
            "manifest_pointer": batch.manifest_pointer, "state": batch.state,
            "proof": {"index": proof.index, "leaf_count": proof.leaf_count,
                      "siblings": [to_hex(s) for s in proof.siblings]},
        }
    return out
