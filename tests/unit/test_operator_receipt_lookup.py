"""GET /v1/receipts/{id} answers every receipt of a batch from one parsed manifest.

Parsing a manifest checks every entry (a 1,024-entry manifest costs ~0.2 s of CPU): each lookup
parsed it again (twice on a stream-mode replica), so one paying client could make the operator
spend that per request. ``parsed_manifest`` keeps the last few, keyed by the bytes' sha256 and
the domain."""

from __future__ import annotations

from pathlib import Path

from eth_account import Account

from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.operator.receipts_api import MANIFEST_CACHE_ENTRIES, parsed_manifest
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt

DOMAIN = Domain(31337, "0x" + "cd" * 20)
OPERATOR = Account.from_key(b"\x02" * 32)


def _manifest(da: LocalDAClient, batch: int, n: int = 3) -> bytes:
    entries = []
    for i in range(n):
        ptr = da.put(f"ciphertext {batch}/{i}".encode())
        r = Receipt(operator=OPERATOR.address, chain_id=31337, model_id=b"\x11" * 32,
                    engine_fingerprint_hash=b"\x22" * 32,
                    req_hash=(batch * 1000 + i).to_bytes(32, "big"), out_hash=b"\x33" * 32,
                    key_epoch=1, ciphertext_hash=ptr.blob_sha256, issued_at=1_700_000_000 + i)
        entries.append(ManifestEntry(SignedReceipt.sign(r, DOMAIN, ReceiptSigner(OPERATOR.key)),
                                     ptr))
    return build_manifest(entries).to_bytes()


def test_a_batchs_receipts_are_answered_from_one_parse(tmp_path: Path) -> None:
    da = LocalDAClient(tmp_path / "da")
    raw = _manifest(da, 0)
    first = parsed_manifest(raw, DOMAIN)
    assert parsed_manifest(bytes(raw), DOMAIN) is first  # same bytes: no second parse
    assert first.leaf_count == 3
    for e in first.entries:  # each receipt's proof from the one parse
        assert first.proof(e.signed.digest).leaf_count == 3
    # MANIFEST_CACHE_ENTRIES other batches looked up after it
    others = [_manifest(da, b) for b in range(1, MANIFEST_CACHE_ENTRIES + 1)]
    for m in others:
        parsed_manifest(m, DOMAIN)
    # bounded: the oldest fell out, the newest stays
    assert parsed_manifest(raw, DOMAIN) is not first
    assert parsed_manifest(others[-1], DOMAIN) is parsed_manifest(others[-1], DOMAIN)
