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
from verinfer.da_client.manifest import BatchManifest, parse_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.errors import ReceiptRefError


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
    signed: SignedReceipt
    batch_id: bytes
    block_number: int


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
                tx = self.w3.eth.get_transaction(log["transactionHash"])
                _, args = self.c.challenges.contract.decode_function_input(tx["input"])
                signed = SignedReceipt(receipt_from_tuple(args["r"]), self.domain,
                                       bytes(args["signature"]))
                self._opened[cid] = OpenedChallenge(cid, signed, bytes(log["args"]["batchId"]),
                                                    int(log["blockNumber"]))
            out.append(self._opened[cid])
        return out

    def opened_by_id(self, cid: int) -> OpenedChallenge:
        if cid not in self._opened:
            self.opened()
        if cid not in self._opened:
            raise ReceiptRefError(f"no ChallengeOpened event for challenge {cid}",
                                  param="challenge_id")
        return self._opened[cid]

    def manifest(self, da: BlobSource, pointer: str) -> BatchManifest:
        if pointer not in self._manifests:
            self._manifests[pointer] = parse_manifest(da.get(Pointer.parse(pointer)),
                                                      self.domain)
        return self._manifests[pointer]

    def ciphertext_pointer(self, da: BlobSource, batch_id: bytes, digest: bytes) -> str | None:
        """The ciphertext pointer the batch's manifest lists for ``digest`` (None: the batch or
        its manifest names none)."""
        for b in self.batches():
            if b.batch_id == batch_id:
                m = self.manifest(da, b.manifest_pointer)
                for e in m.entries:
                    if e.signed.digest == digest:
                        return str(e.ciphertext)
        return None
