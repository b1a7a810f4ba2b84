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
    def __init__(self, w3: Web3, deployment: Deployment, contracts: Contracts) -> None:
        self.w3, self.d, self.c = w3, deployment, contracts
        self.domain = Domain(deployment.chain_id, deployment.challenge_manager)
        self._opened: dict[int, OpenedChallenge] = {}
        self._manifests: dict[str, BatchManifest] = {}
        #: lookups that failed for good: by pointer (bytes that are no manifest), or by
        #: (pointer, leafCount) (bytes too large for a batch of that many receipts)
        self._bad_manifests: dict[object, ManifestError] = {}

    def head(self) -> tuple[int, int]:
        """(block number, timestamp) of the latest block."""
        b = self.w3.eth.get_block("latest")
        return int(b["number"]), int(b["timestamp"])

    def batches(self, from_block: int | None = None) -> list[BatchRecord]:
        evs = batches_committed(self.c.batches, self.d.deployed_block if from_block is None
                                else from_block)
        return [BatchRecord(b.batch_id, b.operator, b.root, b.leaf_count, b.da_pointer,
                            b.block_number) for b in evs]

    def opened(self, from_block: int | None = None) -> list[OpenedChallenge]:
        """Every ChallengeOpened since ``from_block``, with the receipt decoded from calldata."""
        ev = self.c.challenges.contract.events.ChallengeOpened()
        out = []
        for log in ev.get_logs(from_block=self.d.deployed_block if from_block is None
                               else from_block, to_block="latest"):
            cid = int(log["args"]["id"])
            if cid not in self._opened:
                digest = bytes(log["args"]["receiptDigest"])
                self._opened[cid] = OpenedChallenge(cid, self._signed_from_tx(log, digest),
                                                    bytes(log["args"]["batchId"]),
                                                    int(log["blockNumber"]), digest)
            out.append(self._opened[cid])
        return out

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
        chain has it: missing means this verifier's RPC is behind or wrong (LocalFault)."""
        for b in self.batches():
            if b.batch_id == batch_id:
                return b
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
