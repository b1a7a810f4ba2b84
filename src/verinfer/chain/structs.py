"""Typed mirrors of the contracts' structs and enums."""

from __future__ import annotations

import enum
from dataclasses import astuple, dataclass, fields
from typing import Any

from eth_utils import keccak

from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S

ETHER = 10**18

#: ChallengeManager.INVALID_EVIDENCE = keccak256("verinfer.vote.invalid-evidence"): the outHash a
#: committee member reveals when the operator-provided evidence cannot be obtained or does not
#: match the receipt. It counts as a reveal (no non-reveal penalty) and as a vote against the
#: receipt (docs/contracts.md, "Full challenge").
INVALID_EVIDENCE = bytes.fromhex("88125df9f43e00325e4590494da3734bbf8e7a71319ee1999de6d2699848b454")

def pool_key(fingerprint_hash: bytes, model_id: bytes) -> bytes:
    """PoolKey.key (contracts/src/lib/PoolKey.sol): keccak256(abi.encode(fingerprintHash,
    modelId)), the key of a verifier draw pool and of its coverage. Pools are per (engine
    fingerprint, model): the own engine's fingerprint is the same for every model, and a
    verifier judges only the models it holds."""
    fp, mid = bytes(fingerprint_hash), bytes(model_id)
    if len(fp) != 32 or len(mid) != 32:
        raise ValueError(f"a fingerprint hash and a model id are 32 bytes each, got "
                         f"{len(fp)} and {len(mid)}")
    return keccak(fp + mid)


#: StakeRegistry.coverageNotice of a production deployment (seconds): a receipt issued at t is
#: valid only if its engine fingerprint was covered (MIN_COVERAGE_BPS) at t - this (read the
#: value of a deployment with StakeRegistryContract.coverage_notice()).
COVERAGE_NOTICE = 600

#: ProtocolConfig.governanceNotice of a production deployment (seconds, immutable): a revocation
#: or a key epoch's retirement takes effect this long after it is sent, so receipts an operator
#: signs in between stay valid (read a deployment's value with
#: ProtocolConfigContract.governance_notice()).
GOVERNANCE_NOTICE = 600

#: StakeRegistry.minCoverageBps of a production deployment (immutable, a constructor argument):
#: a receipt is valid only if the verifiers declared for its engine fingerprint held at least
#: this share (basis points) of all verifier weight at issuedAt - coverageNotice. 10%: an
#: attacker needs 5% of all verifier stake to hold a majority of a pool a valid receipt relies
#: on (docs/contracts.md "Coverage in stake").
MIN_COVERAGE_BPS = 1000


def is_future_dated(issued_at: int, chain_time: int) -> bool:
    """True iff a receipt's issuedAt is beyond the chain's clock + MAX_CLOCK_SKEW
    (``MAX_ISSUED_AT_SKEW_S``): such a receipt
    is invalid on its face; `claimUnpublished` slashes it at once (no publication deadline to
    wait for), and in a batch it is slashed at open when later than the batch's commit + skew."""
    return issued_at > chain_time + MAX_ISSUED_AT_SKEW_S


def publication_deadline(issued_at: int, publication_deadline_s: int) -> int:
    """issuedAt + publicationDeadline in Python ints (the contract computes it in uint256)."""
    return issued_at + publication_deadline_s


class Role(enum.IntEnum):
    NONE = 0
    OPERATOR = 1
    VERIFIER = 2


class Kind(enum.IntEnum):
    """ProtocolConfig allowlists."""

    MODEL = 0
    ENGINE_FINGERPRINT = 1
    ENCLAVE_MEASUREMENT = 2


class Status(enum.IntEnum):
    """IChallengeManagerTypes.Status (contracts/src/types/ChallengeManagerTypes.sol)."""

    NONE = 0
    AWAITING_DRAW = 1
    VOTING = 2
    DISMISSED = 3
    SLASHED = 4
    INCONCLUSIVE = 5


#: The statuses a challenge ends in (resolve sets one; nothing moves it again).
FINAL = (Status.DISMISSED, Status.SLASHED, Status.INCONCLUSIVE)


class VoteState(enum.IntEnum):
    NONE = 0
    MEMBER = 1
    COMMITTED = 2
    REVEALED = 3


class ClaimStatus(enum.IntEnum):
    NONE = 0
    OPEN = 1
    ANSWERED = 2
    SLASHED = 3


@dataclass(frozen=True)
class Params:
    """IProtocolConfigTypes.Params, field for field (seconds, blocks, basis points, wei)."""

    challenge_window: int
    publication_deadline: int
    response_period: int
    draw_delay_blocks: int
    committee_size: int
    quorum_bps: int
    challenger_reward_bps: int
    draw_period: int
    commit_period: int
    reveal_period: int
    unbonding_period: int
    challenge_bond: int
    slash_amount: int
    non_reveal_penalty: int
    min_operator_stake: int
    min_verifier_stake: int
    majority_reward_bps: int
    #: an unpublished claim opens only until issuedAt + publication_deadline + this (<= the
    #: challenge window): an operator keeps inclusion proofs that long at most
    claim_window: int

    def as_tuple(self) -> tuple[int, ...]:
        return astuple(self)

    @classmethod
    def from_tuple(cls, t: Any) -> Params:
        return cls(*(int(x) for x in t))

    def max_dispute_span(self) -> int:
        return (self.challenge_window + self.publication_deadline + self.response_period
                + self.draw_period + self.commit_period + self.reveal_period)


def default_params() -> Params:
    """Devnet defaults: minutes-long phases, τ = 6666 bps (2 of 3 equal seats are a quorum: one
    colluding seat cannot block; ProtocolConfig refuses τ·n > (n - 1)·10000), α = 20 %,
    β = 30 %, claims until an hour after the publication deadline, slashAmount = 1/4 of the
    minimum operator stake (an operator at the minimum pays 4 proven frauds in full; the contract
    requires at least MIN_OPERATOR_STAKE_SLASHES = 2)."""
    return Params(
        challenge_window=3600, publication_deadline=600, response_period=600, draw_period=600,
        commit_period=600, reveal_period=600, unbonding_period=86400, draw_delay_blocks=2,
        committee_size=3, quorum_bps=6666, challenger_reward_bps=2000, majority_reward_bps=3000,
        challenge_bond=ETHER // 10, non_reveal_penalty=ETHER // 20, slash_amount=ETHER // 4,
        min_operator_stake=ETHER, min_verifier_stake=ETHER // 10, claim_window=3600)


@dataclass(frozen=True)
class StakeAccount:
    """IStakeRegistryTypes.Account. `locked` is the sum of live disputes' liabilities (it may exceed
    `stake`); `slot` is the verifier's draw-tree slot (0 = none: weight 0)."""

    stake: int
    unbonding: int
    role: Role
    locked: int
    unbond_ready_at: int
    slot: int = 0

    @classmethod
    def from_tuple(cls, t: Any) -> StakeAccount:
        return cls(int(t[0]), int(t[1]), Role(t[2]), int(t[3]), int(t[4]),
                   int(t[5]) if len(t) > 5 else 0)


@dataclass(frozen=True)
class BatchInfo:
    leaf_count: int
    committed_at: int
    committed_block: int

    @property
    def exists(self) -> bool:
        return self.committed_at != 0


@dataclass(frozen=True)
class ChallengeInfo:
    receipt_digest: bytes
    receipt_out_hash: bytes
    majority_out_hash: bytes
    operator: str
    opened_at: int
    status: Status
    target_block: int
    challenger: str
    bond: int
    commit_deadline: int
    reveal_deadline: int
    members: int
    commits: int
    reveals: int
    locked_stake: int
    total_weight: int
    snapshot_block: int  # the open block: the draw uses verifier weights as of its end
    member_penalty: int
    # the terms the dispute is decided by, fixed at the draw (0 before it)
    quorum_bps: int
    challenger_reward_bps: int
    majority_reward_bps: int
    pool: bytes = b""  # pool_key(the receipt's engine fingerprint, its model): the committee's pool

    @classmethod
    def from_tuple(cls, t: Any) -> ChallengeInfo:
        return cls(*_enum_at(t, 5, Status))


@dataclass(frozen=True)
class ReceiptState:
    """IChallengeManagerTypes.ReceiptState: live challenge / claim ids (independent of each
    other) and whether stake was taken for the receipt's content (`slashed`) or because it was
    unpublished (`unpublished_slashed`)."""

    live_challenge: int
    live_claim: int
    slashed: bool
    unpublished_slashed: bool

    @classmethod
    def from_tuple(cls, t: Any) -> ReceiptState:
        return cls(int(t[0]), int(t[1]), bool(t[2]), bool(t[3]))


@dataclass(frozen=True)
class Member:
    account: str
    weight: int


@dataclass(frozen=True)
class Vote:
    value: bytes
    state: VoteState


@dataclass(frozen=True)
class ClaimInfo:
    receipt_digest: bytes
    operator: str
    response_deadline: int
    status: ClaimStatus
    claimant: str
    bond: int
    publish_by: int
    locked_stake: int
    challenger_reward_bps: int  # α when the claim opened: what an upheld claim pays

    @classmethod
    def from_tuple(cls, t: Any) -> ClaimInfo:
        return cls(*_enum_at(t, 3, ClaimStatus))


def _enum_at(t: Any, index: int, kind: type[enum.IntEnum]) -> list[Any]:
    """A contract struct's tuple as a list, its ``index``-th word read as the enum ``kind``."""
    vals = list(t)
    vals[index] = kind(vals[index])
    return vals


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
