"""What verifiers and watchers read from the chain: the receipt a challenge is about (from the
openChallenge calldata), batches and their manifests.

(The KMS shards read committees from the chain themselves: verinfer.kms.chain_oracle.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from web3 import Web3

from verinfer.chain.bindings import Contracts
from verinfer.chain.deploy import Deployment
from verinfer.chain.events import batches_committed
from verinfer.chain.rpc import LOG_CHUNK_BLOCKS, REORG_OVERLAP_BLOCKS
from verinfer.da_client.errors import (
    BackendMismatchError,
    BlobNotFoundError,
    CommitmentMismatchError,
    DAUnavailableError,
    MalformedPointerError,
    ManifestError,
)
from verinfer.da_client.manifest import (
    BatchManifest,
    ManifestEntry,
    max_manifest_bytes,
    parse_manifest,
)
from verinfer.da_client.pointer import Pointer, mismatch_counts_as_absent
from verinfer.errors import VerinferError
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.errors import LocalFault, OperatorFault, ReceiptRefError


def _ranges(from_block: int, to_block: int, chunk: int = LOG_CHUNK_BLOCKS
            ) -> list[tuple[int, int]]:
    """[from_block, to_block] cut into ``chunk``-block pieces."""
    return [(lo, min(lo + chunk - 1, to_block)) for lo in range(from_block, to_block + 1, chunk)]


def chunked_logs(event: Any, from_block: int, to_block: int,
                 chunk: int = LOG_CHUNK_BLOCKS) -> list[Any]:
    """``event.get_logs`` over [from_block, to_block] in ``chunk``-block pieces."""
    out: list[Any] = []
    for lo, hi in _ranges(from_block, to_block, chunk):
        out.extend(event.get_logs(from_block=lo, to_block=hi))
    return out


@dataclass(frozen=True)
class BatchRecord:
    batch_id: bytes
    operator: str
    root: bytes
    leaf_count: int
    manifest_pointer: str
    block_number: int


@dataclass(frozen=True)
class OpenedChallenge:
    challenge_id: int
    signed: SignedReceipt | None  # None: not decodable from the tx (opened via a contract)
    batch_id: bytes
    block_number: int
    digest: bytes  # the receipt id, from the event


RECEIPT_FIELDS = ("version", "operator", "chainId", "modelId", "engineFingerprintHash",
                  "reqHash", "outHash", "keyEpoch", "ciphertextHash", "issuedAt")


def receipt_from_tuple(t: Any) -> Receipt:
    """The Solidity Receipt struct as web3 decodes it (a tuple, or a dict by field name)."""
    if isinstance(t, dict) or hasattr(t, "keys"):
        t = [t[k] for k in RECEIPT_FIELDS]
    return Receipt(version=int(t[0]), operator=str(t[1]), chain_id=int(t[2]),
                   model_id=bytes(t[3]), engine_fingerprint_hash=bytes(t[4]),
                   req_hash=bytes(t[5]), out_hash=bytes(t[6]), key_epoch=int(t[7]),
                   ciphertext_hash=bytes(t[8]), issued_at=int(t[9]))


class ChainView:
    def __init__(self, w3: Web3, deployment: Deployment, contracts: Contracts, *,
                 log_chunk_blocks: int = LOG_CHUNK_BLOCKS) -> None:
        """``log_chunk_blocks``: the widest eth_getLogs range sent (at most the RPC's limit)."""
        if log_chunk_blocks < 1:
            raise ValueError(f"log_chunk_blocks must be >= 1, not {log_chunk_blocks}")
        self.w3, self.d, self.c = w3, deployment, contracts
        self.log_chunk_blocks = log_chunk_blocks
        self.domain = Domain(deployment.chain_id, deployment.challenge_manager)
        self._opened: dict[int, OpenedChallenge] = {}
        self._opened_from: int | None = None  # ChallengeOpened read below this block
        self._manifests: dict[str, BatchManifest] = {}
        #: lookups that failed for good: by pointer (bytes that are no manifest), or by
        #: (pointer, leafCount) (bytes too large for a batch of that many receipts)
        self._bad_manifests: dict[object, ManifestError] = {}

    def head(self) -> tuple[int, int]:
        """(block number, timestamp) of the latest block."""
        b = self.w3.eth.get_block("latest")
        return int(b["number"]), int(b["timestamp"])

    def batches(self, from_block: int | None = None) -> list[BatchRecord]:
        start = self.d.deployed_block if from_block is None else from_block
        head = int(self.w3.eth.block_number)
        out = []
        for b in (batches_committed(self.c.batches, lo, hi)
                  for lo, hi in _ranges(start, head, self.log_chunk_blocks)):
            out.extend(BatchRecord(e.batch_id, e.operator, e.root, e.leaf_count, e.da_pointer,
                                   e.block_number) for e in b)
        return out

    def opened(self, from_block: int | None = None) -> list[OpenedChallenge]:
        """Every ChallengeOpened since ``from_block`` (default: the deployment), with the
        receipt decoded from calldata. Incremental: the events are remembered, and each call
        reads only the blocks since the previous one (plus REORG_OVERLAP_BLOCKS), in
        LOG_CHUNK_BLOCKS ranges — the node calls this every step, and a scan of the whole
        history each time grew with the chain's age until the RPC refused it."""
        ev = self.c.challenges.contract.events.ChallengeOpened()
        head = int(self.w3.eth.block_number)
        start = self.d.deployed_block if self._opened_from is None else max(
            self.d.deployed_block, self._opened_from - REORG_OVERLAP_BLOCKS)
        for log in chunked_logs(ev, start, head, self.log_chunk_blocks):
            cid = int(log["args"]["id"])
            if cid not in self._opened:
                digest = bytes(log["args"]["receiptDigest"])
                self._opened[cid] = OpenedChallenge(cid, self._signed_from_tx(log, digest),
                                                    bytes(log["args"]["batchId"]),
                                                    int(log["blockNumber"]), digest)
        self._opened_from = head + 1
        lo = self.d.deployed_block if from_block is None else from_block
        return [oc for _, oc in sorted(self._opened.items()) if oc.block_number >= lo]

    def _signed_from_tx(self, log: Any, digest: bytes) -> SignedReceipt | None:
        """The receipt from the openChallenge calldata. Anyone can open a challenge through
        another contract, whose calldata this cannot decode: that must not stop the node (it
        walks every challenge each step), so it gives None and the receipt is then read from
        the batch manifest by its digest (the event's receiptDigest)."""
        try:
            tx = self.w3.eth.get_transaction(log["transactionHash"])
            _, args = self.c.challenges.contract.decode_function_input(tx["input"])
            signed = SignedReceipt(receipt_from_tuple(args["r"]), self.domain,
                                   bytes(args["signature"]))
        except (ValueError, KeyError, TypeError, VerinferError):
            return None
        return signed if signed.digest == digest else None

    def opened_by_id(self, cid: int) -> OpenedChallenge:
        if cid not in self._opened:
            self.opened()
        if cid not in self._opened:
            raise ReceiptRefError(f"no ChallengeOpened event for challenge {cid}",
                                  param="challenge_id")
        return self._opened[cid]

    def manifest(self, da: BlobSource, pointer: str,
                 leaf_count: int | None = None) -> BatchManifest:
        """The manifest at ``pointer``, read and parsed once per pointer — a manifest that is
        not one is remembered too (8 junk batches naming one hostile 32 MiB manifest cost one
        parse, not 8). ``leaf_count`` (the batch's on-chain leafCount): bytes past
        ``max_manifest_bytes(leaf_count)`` are refused unparsed, and the manifest must list
        that many receipts. Refusals raise ManifestError; DA trouble (not found, unavailable)
        is raised as it is and not remembered (a manifest may appear later)."""
        m = self._manifests.get(pointer)
        if m is None:
            bad = self._bad_manifests.get(pointer) or self._bad_manifests.get(
                (pointer, leaf_count))
            if bad is not None:
                raise bad
            blob = da.get(Pointer.parse(pointer))
            if leaf_count is not None and len(blob) > max_manifest_bytes(leaf_count):
                err = ManifestError(f"manifest {pointer[:90]}: {len(blob)} bytes, more than a "
                                    f"batch of {leaf_count} receipts has "
                                    f"({max_manifest_bytes(leaf_count)})")
                self._bad_manifests[(pointer, leaf_count)] = err
                raise err
            try:
                m = parse_manifest(blob, self.domain)
            except ManifestError as e:
                self._bad_manifests[pointer] = e
                raise
            self._manifests[pointer] = m
        if leaf_count is not None and m.leaf_count != leaf_count:
            raise ManifestError(f"manifest {pointer[:90]} lists {m.leaf_count} receipts, the "
                                f"batch {leaf_count}")
        return m

    def batch(self, batch_id: bytes) -> BatchRecord:
        """The BatchCommitted record of ``batch_id``. A challenge was opened against it, so the
        chain has it: missing means this verifier's RPC is behind or wrong (LocalFault).

        Read from the one block the BatchRegistry recorded for it (``committedBlock``), not by
        walking every BatchCommitted since the deployment: that walk grew with every batch any
        operator ever committed (the daPointer is an unbounded string in each event), so a
        cheating operator's junk batches — or a few weeks of honest ones — pushed the answer
        past the RPC's answer cap or range limit, and every honest member's judgement failed
        as a local fault until its commit window closed: no vote, the fraud Inconclusive and
        each honest member penalised."""
        info = self.c.batches.batch(batch_id)
        if info.exists:
            ev = self.c.batches.contract.events.BatchCommitted()
            for log in chunked_logs(ev, info.committed_block, info.committed_block):
                a = log["args"]
                rec = BatchRecord(self.c.batches.batch_id(str(a["operator"]), bytes(a["root"])),
                                  str(a["operator"]), bytes(a["root"]), int(a["leafCount"]),
                                  str(a["daPointer"]), int(log["blockNumber"]))
                if rec.batch_id == batch_id:
                    return rec
        raise LocalFault(f"no BatchCommitted event for batch 0x{batch_id.hex()} (RPC behind?)")

    def challenge_manifest(self, da: BlobSource, batch: BatchRecord, *,
                           absent_is_fault: bool) -> BatchManifest:
        """The manifest of a committed batch, checked as evidence. Operator faults (pointer
        malformed, manifest absent once ``absent_is_fault``, malformed, bad signatures, root
        not the on-chain root) raise OperatorFault; this verifier's DA trouble LocalFault."""
        try:
            pointer = Pointer.parse(batch.manifest_pointer)
        except MalformedPointerError as e:
            raise OperatorFault("manifest_invalid", f"manifest pointer: {e.message}") from e
        key = str(pointer)
        if key in self._manifests:
            m = self._manifests[key]
        else:
            try:
                try:
                    data = da.get(pointer)
                except CommitmentMismatchError as e:
                    if not mismatch_counts_as_absent(pointer):
                        raise
                    # the operator rewrote its own store: the manifest is as good as deleted
                    raise BlobNotFoundError(f"manifest {key}: {e.message}") from e
            except (BlobNotFoundError, BackendMismatchError) as e:
                # another backend than the network's counts as absent: the operator chose it
                if absent_is_fault:
                    raise OperatorFault("manifest_unavailable",
                                        f"manifest {key} is not on DA") from e
                raise LocalFault(f"manifest {key} not on DA yet (publication window open)") \
                    from e
            except (DAUnavailableError, CommitmentMismatchError) as e:
                raise LocalFault(f"DA: {e.message}") from e
            try:
                m = parse_manifest(data, self.domain)
                m.verify_signatures(self.domain)
            except ManifestError as e:
                raise OperatorFault("manifest_invalid", e.message[:300]) from e
            self._manifests[key] = m
        if m.root != batch.root:  # the manifest must describe the batch the chain committed
            raise OperatorFault("manifest_invalid",
                                f"manifest root 0x{m.root.hex()} is not the on-chain batch "
                                f"root 0x{batch.root.hex()}")
        return m

    def challenged_entry(self, da: BlobSource, oc: OpenedChallenge, *,
                         absent_is_fault: bool) -> ManifestEntry:
        """The manifest entry (signed receipt + ciphertext pointer) of a challenged receipt."""
        m = self.challenge_manifest(da, self.batch(oc.batch_id),
                                    absent_is_fault=absent_is_fault)
        for e in m.entries:
            if e.signed.digest == oc.digest:
                return e
        raise OperatorFault("receipt_not_in_manifest",
                            f"receipt 0x{oc.digest.hex()} is not listed by its batch manifest")

    def ciphertext_pointer(self, da: BlobSource, batch_id: bytes, digest: bytes) -> str | None:
        """The ciphertext pointer the batch's manifest lists for ``digest`` (None: the batch or
        its manifest names none)."""
        for b in self.batches():
            if b.batch_id == batch_id:
                m = self.manifest(da, b.manifest_pointer, b.leaf_count)
                for e in m.entries:
                    if e.signed.digest == digest:
                        return str(e.ciphertext)
        return None
