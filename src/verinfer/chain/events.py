"""Typed readers for the contracts' events (eth_getLogs over a block range)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verinfer.chain.bindings import BatchRegistryContract, ChallengeManagerContract
from verinfer.chain.structs import Status


@dataclass(frozen=True)
class BatchCommitted:
    batch_id: bytes
    operator: str
    root: bytes
    leaf_count: int
    da_pointer: str
    block_number: int


@dataclass(frozen=True)
class ChallengeOpened:
    challenge_id: int
    receipt_digest: bytes
    operator: str
    challenger: str
    batch_id: bytes
    bond: int
    target_block: int
    block_number: int


@dataclass(frozen=True)
class ChallengeResolved:
    challenge_id: int
    status: Status
    majority_out_hash: bytes
    slashed: int
    block_number: int


@dataclass(frozen=True)
class CommitteeDrawn:
    challenge_id: int
    members: tuple[str, ...]
    weights: tuple[int, ...]
    commit_deadline: int
    reveal_deadline: int
    block_number: int


def _logs(event: Any, from_block: int, to_block: int | str) -> list[Any]:
    return list(event.get_logs(from_block=from_block, to_block=to_block))


def batches_committed(reg: BatchRegistryContract, from_block: int = 0,
                      to_block: int | str = "latest") -> list[BatchCommitted]:
    return [BatchCommitted(BatchRegistryContract.batch_id(str(a["operator"]), bytes(a["root"])),
                           str(a["operator"]), bytes(a["root"]), int(a["leafCount"]),
                           str(a["daPointer"]), int(log["blockNumber"]))
            for log in _logs(reg.contract.events.BatchCommitted(), from_block, to_block)
            for a in [log["args"]]]


def challenges_opened(cm: ChallengeManagerContract, from_block: int = 0,
                      to_block: int | str = "latest") -> list[ChallengeOpened]:
    return [ChallengeOpened(int(a["id"]), bytes(a["receiptDigest"]), str(a["operator"]),
                            str(a["challenger"]), bytes(a["batchId"]), int(a["bond"]),
                            int(a["targetBlock"]), int(log["blockNumber"]))
            for log in _logs(cm.contract.events.ChallengeOpened(), from_block, to_block)
            for a in [log["args"]]]


def committees_drawn(cm: ChallengeManagerContract, from_block: int = 0,
                     to_block: int | str = "latest") -> list[CommitteeDrawn]:
    return [CommitteeDrawn(int(a["id"]), tuple(str(m) for m in a["members"]),
                           tuple(int(w) for w in a["weights"]), int(a["commitDeadline"]),
                           int(a["revealDeadline"]), int(log["blockNumber"]))
            for log in _logs(cm.contract.events.CommitteeDrawn(), from_block, to_block)
            for a in [log["args"]]]


def challenges_resolved(cm: ChallengeManagerContract, from_block: int = 0,
                        to_block: int | str = "latest") -> list[ChallengeResolved]:
    return [ChallengeResolved(int(a["id"]), Status(a["status"]), bytes(a["majorityOutHash"]),
                              int(a["slashed"]), int(log["blockNumber"]))
            for log in _logs(cm.contract.events.ChallengeResolved(), from_block, to_block)
            for a in [log["args"]]]
