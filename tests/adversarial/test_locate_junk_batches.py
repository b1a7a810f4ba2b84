"""Issue 32.6: junk batches naming one hostile manifest do not make every challenge slow.

``locate`` (``verinfer challenge``, ``verinfer reproduce``, ``audit --escalate``) walks the
committed batches and reads each one's manifest. It cached only manifests that parsed, so 8
batches (one cheap transaction each) naming one 32 MiB manifest of repeated entries were read
and parsed 8 times per lookup: 0.06 s -> 104 s. Now a manifest is refused unparsed past what its
batch's on-chain leafCount allows (``max_manifest_bytes``), a failure is remembered per pointer,
and a receipt given as a file is looked for in its own operator's batches only."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import rfc8785
from eth_account import Account

from verinfer.chain.bindings import BatchRegistryContract
from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import (
    MANIFEST_FORMAT,
    MAX_ENTRY_BYTES,
    ManifestEntry,
    build_manifest,
    max_manifest_bytes,
)
from verinfer.da_client.pointer import MAX_COMMITMENT_BYTES, Pointer
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.chain_view import BatchRecord, ChainView
from verinfer.verifier.challenger import locate

DOMAIN = Domain(31337, "0x" + "cd" * 20)
HONEST, JUNK = Account.from_key(b"\x0e" * 32), Account.from_key(b"\x0f" * 32)
JUNK_BATCHES = 8


class _Chain(ChainView):
    """The real ChainView (its manifest reading and caching) over a given list of batches."""

    def __init__(self, batches: list[BatchRecord]) -> None:
        dep = SimpleNamespace(chain_id=DOMAIN.chain_id,
                              challenge_manager=DOMAIN.verifying_contract)
        super().__init__(None, dep, None)  # type: ignore[arg-type]
        self._list = batches

    def batches(self, from_block: int | None = None) -> list[BatchRecord]:
        return self._list


class _Counting:
    """A real DA client that counts the reads of each pointer."""

    def __init__(self, da: LocalDAClient) -> None:
        self.da, self.reads = da, dict[str, int]()

    def get(self, pointer: Pointer) -> bytes:
        self.reads[str(pointer)] = self.reads.get(str(pointer), 0) + 1
        return self.da.get(pointer)


def _entry(op: Account, i: int, da: LocalDAClient) -> ManifestEntry:
    ptr = da.put(f"ciphertext {op.address} {i}".encode())
    r = Receipt(operator=op.address, chain_id=DOMAIN.chain_id, model_id=b"\x11" * 32,
                engine_fingerprint_hash=b"\x22" * 32, req_hash=i.to_bytes(32, "big"),
                out_hash=b"\x33" * 32, key_epoch=1, ciphertext_hash=ptr.blob_sha256,
                issued_at=1_700_000_000 + i)
    return ManifestEntry(SignedReceipt.sign(r, DOMAIN, ReceiptSigner(op.key)), ptr)


def _hostile(da: LocalDAClient, size: int) -> tuple[str, int]:
    """A manifest of one valid entry repeated to ``size`` bytes: every entry parses (receipt,
    EIP-712 digest) before the repeat is found. (pointer, entries)."""
    one = _entry(JUNK, 0, da).to_json()
    item = rfc8785.dumps(one)
    n = (size - 1024) // (len(item) + 1)
    head = {"batchRoot": "0x" + "00" * 32, "domain": DOMAIN.to_json(), "entries": [],
            "format": MANIFEST_FORMAT, "leafCount": n}
    blob = rfc8785.dumps(head).replace(b'"entries":[]',
                                       b'"entries":[' + b",".join([item] * n) + b"]")
    return str(da.put(blob)), n


def _batch(op: Account, root: bytes, count: int, pointer: str, block: int) -> BatchRecord:
    return BatchRecord(BatchRegistryContract.batch_id(op.address, root), op.address, root,
                       count, pointer, block)


def test_junk_batches_naming_a_huge_manifest_do_not_slow_locate(tmp_path: Path) -> None:
    da = LocalDAClient(tmp_path / "da")
    mine = [_entry(HONEST, i, da) for i in range(3)]
    m = build_manifest(mine)
    own = _batch(HONEST, m.root, 3, str(da.put(m.to_bytes())), block=20)
    target = mine[1].signed
    receipt_file = tmp_path / "receipt.json"
    receipt_file.write_text(json.dumps(target.to_json()))
    # one hostile 32 MiB manifest, named by 8 one-receipt junk batches committed first
    hostile, _ = _hostile(da, DEFAULT_MAX_BLOB_BYTES - 4096)
    junk = [_batch(JUNK, bytes([i]) * 32, 1, hostile, block=i) for i in range(JUNK_BATCHES)]
    for ref in ("0x" + target.digest.hex(), str(mine[1].ciphertext), str(receipt_file)):
        counting = _Counting(da)
        t0 = time.monotonic()
        loc = locate(_Chain([*junk, own]), counting, ref)
        took = time.monotonic() - t0
        print(f"locate({ref[:20]}…) with {JUNK_BATCHES} junk batches: {took:.2f} s, "
              f"hostile manifest read {counting.reads.get(hostile, 0)}x")
        assert loc.batch == own and loc.proof is not None and loc.proof.index == 1
        # by id or ciphertext: read once, refused by size unparsed; by file: not read at all
        assert counting.reads.get(hostile, 0) == (0 if ref == str(receipt_file) else 1)
        assert took < 5.0


def test_a_manifest_that_fails_to_parse_is_read_once_per_lookup(tmp_path: Path) -> None:
    """Junk batches whose leafCount admits the manifest's size: parsed once, the failure
    remembered for the other batches naming the same pointer."""
    da = LocalDAClient(tmp_path / "da")
    mine = [_entry(HONEST, i, da) for i in range(2)]
    m = build_manifest(mine)
    own = _batch(HONEST, m.root, 2, str(da.put(m.to_bytes())), block=20)
    hostile, n = _hostile(da, 256 * 1024)
    junk = [_batch(JUNK, bytes([i]) * 32, n, hostile, block=i) for i in range(JUNK_BATCHES)]
    counting = _Counting(da)
    loc = locate(_Chain([*junk, own]), counting, "0x" + mine[0].signed.digest.hex())
    assert loc.batch == own
    assert counting.reads[hostile] == 1


def test_the_largest_entry_the_format_admits_fits_the_bound(tmp_path: Path) -> None:
    """max_manifest_bytes is an upper bound: an entry with an eigenda pointer of the largest
    commitment and the largest integers is within MAX_ENTRY_BYTES, so no honest batch's
    manifest is refused by it."""
    cert = b"\xff" * (MAX_COMMITMENT_BYTES - 32)
    blob_hash = b"\xee" * 32
    r = Receipt(operator=HONEST.address, chain_id=2**53 - 1, model_id=b"\xff" * 32,
                engine_fingerprint_hash=b"\xff" * 32, req_hash=b"\xff" * 32,
                out_hash=b"\xff" * 32, key_epoch=2**53 - 1, ciphertext_hash=blob_hash,
                issued_at=2**53 - 1)
    big = Domain(2**53 - 1, "0x" + "ff" * 20)
    entry = ManifestEntry(SignedReceipt.sign(r, big, ReceiptSigner(HONEST.key)),
                          Pointer("eigenda", blob_hash + cert))
    assert len(rfc8785.dumps(entry.to_json())) + 1 <= MAX_ENTRY_BYTES
    m = build_manifest([entry, entry.__class__(
        SignedReceipt.sign(Receipt(**{**r.__dict__, "req_hash": b"\xfe" * 32}), big,
                           ReceiptSigner(HONEST.key)), entry.ciphertext)])
    assert len(m.to_bytes()) <= max_manifest_bytes(2)
