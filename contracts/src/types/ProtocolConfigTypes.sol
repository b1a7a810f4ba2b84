// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IProtocolConfigTypes
/// @notice The structs and enums of the ProtocolConfig ABI. Field order and widths are part of
///         the ABI (verinfer.chain.structs decodes them by position) and of the storage layout.
interface IProtocolConfigTypes {
    /// @notice Every protocol parameter. Times are seconds unless named blocks; shares are basis
    ///         points (1/10000). Amounts are wei.
    struct Params {
        // slot 0: read by every openChallenge
        uint64 challengeWindow; // Δ: a receipt can be challenged until batch commit + Δ
        uint64 publicationDeadline; // a receipt must be in a batch committed by issuedAt + this
        uint64 responsePeriod; // time the operator has to answer an unpublished claim
        uint16 drawDelayBlocks; // k: randomness is blockhash(openBlock + k)
        uint16 committeeSize;
        uint16 quorumBps; // τ
        uint16 challengerRewardBps; // α, share of the slashed stake
        // slot 1
        uint64 drawPeriod; // after opening, the committee must be drawn within this
        uint64 commitPeriod; // after the draw, members commit votes within this
        uint64 revealPeriod; // after the commit deadline, members reveal within this
        uint64 unbondingPeriod; // unbond request -> withdrawal
        // slot 2: read by every openChallenge
        uint128 challengeBond;
        uint128 slashAmount; // stake taken from an operator per proven fault
        // slots 3-4
        uint128 nonRevealPenalty; // taken from a member that does not reveal, or reveals against a decided quorum
        uint128 minOperatorStake;
        uint128 minVerifierStake;
        uint16 majorityRewardBps; // β, share of the slashed stake
        uint64 claimWindow; // an unpublished claim opens only until issuedAt + publicationDeadline + this
    }

    /// @notice The parameters openChallenge needs (two storage slots).
    struct OpenParams {
        uint64 challengeWindow;
        uint16 drawDelayBlocks;
        uint16 challengerRewardBps;
        uint128 challengeBond;
        uint128 slashAmount;
    }

    /// @notice An allowlist entry: approved for receipts issued in [since, until) (until 0 = open).
    struct Approval {
        uint64 since;
        uint64 until;
    }

    /// @notice One KMS key epoch: the HPKE public key, a hash of the Feldman commitments, t-of-n.
    struct KeyEpoch {
        bytes publicKey;
        bytes32 commitmentsHash;
        uint16 threshold;
        uint16 shardCount;
        uint64 registeredAt;
        uint64 retiredAt; // 0 while live
    }

    /// @notice Which allowlist an entry belongs to.
    enum Kind {
        Model,
        EngineFingerprint,
        EnclaveMeasurement
    }
}
