"""A batch that holds another operator's receipt proves nothing about it: the contract looks a
receipt's batch up under the receipt's own operator (ChallengeManager._checkInclusion). The
tools that find a receipt's batch -- `verinfer challenge`, `verinfer reproduce`, the audit
escalation, all through ``verifier.challenger.locate`` -- must apply the same rule."""

from __future__ import annotations

import json
from pathlib import Path

from eth_account import Account

from verinfer.chain.bindings import BatchRegistryContract
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import BatchManifest, ManifestEntry, build_manifest, parse_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.chain_view import BatchRecord
from verinfer.verifier.challenger import locate

DOMAIN = Domain(31337, "0x" + "cd" * 20)
HONEST, SHADOW = Account.from_key(b"\x0c" * 32), Account.from_key(b"\x0d" * 32)


class _ChainOf:
    """The two ChainView calls ``locate`` and ``sample_receipts`` make, over batches committed
    in the given order."""

    def __init__(self, batches: list[BatchRecord]) -> None:
        self.domain, self._batches = DOMAIN, batches

    def batches(self, from_block: int | None = None) -> list[BatchRecord]:
        return [b for b in self._batches if from_block is None or b.block_number >= from_block]

    def manifest(self, da: LocalDAClient, pointer: str,
                 leaf_count: int | None = None) -> BatchManifest:
        return parse_manifest(da.get(Pointer.parse(pointer)), DOMAIN)


def _signed(op: Account, i: int, da: LocalDAClient) -> ManifestEntry:
    ptr = da.put(f"ciphertext {op.address} {i}".encode())
    r = Receipt(operator=op.address, chain_id=DOMAIN.chain_id, model_id=b"\x11" * 32,
                engine_fingerprint_hash=b"\x22" * 32, req_hash=i.to_bytes(32, "big"),
                out_hash=b"\x33" * 32, key_epoch=1, ciphertext_hash=ptr.blob_sha256,
                issued_at=1_700_000_000 + i)
    return ManifestEntry(SignedReceipt.sign(r, DOMAIN, ReceiptSigner(op.key)), ptr)


def _commit(op: Account, entries: list[ManifestEntry], da: LocalDAClient,
            block: int) -> BatchRecord:
    m = build_manifest(entries)
    return BatchRecord(BatchRegistryContract.batch_id(op.address, m.root), op.address, m.root,
                       m.leaf_count, str(da.put(m.to_bytes())), block)


def test_a_copy_in_another_operators_batch_does_not_shadow_the_receipts_own_batch(
        tmp_path: Path) -> None:
    """``locate`` returned the first committed batch whose manifest lists the receipt, of any
    operator. A second staked identity copies a receipt of the first (it asked for it as a
    client, or read it off DA) into a batch it commits first. Then `verinfer challenge` opened
    the challenge against the shadow batch's root, which the contract refuses (the batch is
    looked up under the receipt's operator): the cheat on that receipt could not be
    challenged through the tools, nor claimed unpublished. And `verinfer reproduce` reported
    "mismatch" (exit 1) for the honest twin case: "the batch is another operator's". Who
    gains: a cheating operator, for a second stake and one batch's gas. Now only a batch of
    the receipt's own operator counts; a foreign copy is skipped."""
    da = LocalDAClient(tmp_path / "da")
    mine = [_signed(HONEST, i, da) for i in range(3)]
    shadow = _commit(SHADOW, [mine[1], _signed(SHADOW, 9, da)], da, block=5)
    own = _commit(HONEST, mine, da, block=6)
    view = _ChainOf([shadow, own])
    target = mine[1].signed
    for ref in ("0x" + target.digest.hex(), str(mine[1].ciphertext)):
        loc = locate(view, da, ref)
        assert loc.batch is not None and loc.batch.batch_id == own.batch_id, ref
        assert loc.proof is not None and loc.proof.index == 1
        assert loc.signed.digest == target.digest
    # only the shadow's copy on chain: the receipt is in no batch of its own operator
    alone = locate(_ChainOf([shadow]), da, str(_file(tmp_path, target)))
    assert alone.batch is None and alone.signed.digest == target.digest


def _file(tmp_path: Path, signed: SignedReceipt) -> Path:
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(signed.to_json()))
    return path


def test_a_receipt_copied_into_another_operators_batch_is_not_sampled_for_audit(
        tmp_path: Path) -> None:
    """`verinfer audit` sampled every entry of every manifest, so a receipt copied into a
    shadow batch was audited with the *copier's* ciphertext pointer beside it -- content
    addressed, but free to name a backend where the blob is absent. The light audit then says
    "ciphertext unavailable", and `--escalate` opens a full challenge, with the escalating
    auditor's bond, against an honest receipt whose own batch serves the ciphertext: the
    committee dismisses it and the honest auditor pays. Who gains: whoever commits the shadow
    batch (a staked operator's gas) drains auditors' bonds. Now only the batch operator's own
    receipts are sampled."""
    import random

    from verinfer.verifier.audit_cli import sample_receipts

    da = LocalDAClient(tmp_path / "da")
    mine = [_signed(HONEST, i, da) for i in range(3)]
    theirs = _signed(SHADOW, 9, da)
    copied = ManifestEntry(mine[1].signed, Pointer("redis", mine[1].ciphertext.blob_sha256))
    shadow = _commit(SHADOW, [copied, theirs], da, block=5)
    own = _commit(HONEST, mine, da, block=6)
    sampled = sample_receipts(_ChainOf([shadow, own]), da, 1.0,
                              random.Random(0))
    assert [(s.digest, p) for s, p in sampled] == [
        (theirs.signed.digest, str(theirs.ciphertext)),
        *[(e.signed.digest, str(e.ciphertext)) for e in mine]]
