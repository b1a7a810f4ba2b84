// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IChallengeManagerTypes
/// @notice The structs and enums of the ChallengeManager ABI. Field order and widths are part of
///         the ABI (verinfer.chain.structs decodes them by position) and of the storage layout.
interface IChallengeManagerTypes {
    /// @notice Life cycle of a full challenge.
    enum Status {
        None,
        AwaitingDraw,
        Voting,
        Dismissed,
        Slashed,
        Inconclusive
    }

    /// @notice A committee member's progress in one challenge.
    enum VoteState {
        None,
        Member,
        Committed,
        Revealed
    }

    /// @notice Why an operator was slashed: its output was not reproduced (re-execution), the
    ///         receipt was invalid on its face, or the receipt was unpublished (in no batch
    ///         committed by its publication deadline).
    enum Fault {
        Reexecution,
        InvalidReceipt,
        Unpublished
    }

    /// @notice Life cycle of an unpublished claim.
    enum ClaimStatus {
        None,
        Open,
        Answered,
        Slashed
    }

    /// @notice One full challenge. Deadlines are unix seconds; targetBlock is the block whose
    ///         hash seeds the committee draw.
    struct Challenge {
        bytes32 receiptDigest;
        bytes32 receiptOutHash;
        bytes32 majorityOutHash; // set when resolved by quorum
        address operator;
        uint40 openedAt;
        Status status;
        uint40 targetBlock;
        address challenger;
        uint96 bond;
        uint64 commitDeadline;
        uint64 revealDeadline;
        uint16 members;
        uint16 commits;
        uint16 reveals;
        uint96 lockedStake; // the operator's liability for this challenge (slashAmount at open)
        uint112 totalWeight; // committee stake weight
        uint48 snapshotBlock; // the open block: the draw uses verifier weights as of its end
        uint128 memberPenalty; // non-reveal penalty locked on each member at the draw
        // The terms this dispute is decided by, fixed at the draw (packed with memberPenalty, no
        // extra storage slot): a later setParams does not reach into a drawn dispute.
        uint16 quorumBps; // τ at the draw
        uint16 challengerRewardBps; // α at the draw
        uint16 majorityRewardBps; // β at the draw
        bytes32 pool; // PoolKey.key(the receipt's engine fingerprint, its modelId): the committee's pool
    }

    /// @notice A committee seat: the verifier and its stake weight at the draw.
    struct Member {
        address account;
        uint96 weight;
    }

    /// @notice A member's vote: the commitment, replaced by the revealed outHash on reveal.
    struct Vote {
        bytes32 value;
        VoteState state;
    }

    /// @notice One unpublished claim (`claimUnpublished`).
    struct Claim {
        bytes32 receiptDigest;
        address operator;
        uint64 responseDeadline;
        ClaimStatus status;
        address claimant;
        uint96 bond;
        uint64 publishBy; // issuedAt + publicationDeadline
        uint128 lockedStake;
        uint16 challengerRewardBps; // α when the claim opened (what an upheld claim pays)
    }

    /// @notice Per receipt: the live challenge and the live claim (0 = none; they are
    ///         independent, so neither can hold off the other), whether stake was ever taken for
    ///         its content (re-execution fault or invalid receipt: `slashed`) and whether stake
    ///         was ever taken because it was unpublished (`unpublishedSlashed`). A flag is set
    ///         only when stake was actually taken.
    struct ReceiptState {
        uint64 liveChallenge;
        uint64 liveClaim;
        bool slashed;
        bool unpublishedSlashed;
    }
}
