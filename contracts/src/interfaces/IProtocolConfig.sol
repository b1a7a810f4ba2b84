// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IProtocolConfigTypes} from "../types/ProtocolConfigTypes.sol";
import {IProtocolConfigErrors} from "../errors/ProtocolConfigErrors.sol";

/// @title IProtocolConfig
/// @notice Governance-owned allowlists (models, engine fingerprints, enclave measurements, KMS key
///         epochs) and protocol parameters. Allowlist entries carry an approval interval so that a
///         later revocation does not retroactively turn honest, older receipts into faults.
interface IProtocolConfig is IProtocolConfigTypes, IProtocolConfigErrors {
    /// @notice Parameters changed.
    event ParamsSet(Params params);
    /// @notice An allowlist entry was approved (from `since`).
    event Approved(Kind indexed kind, bytes32 indexed id, uint64 since);
    /// @notice An allowlist entry was revoked (from `until` = now + governanceNotice); also
    ///         emitted with the original `since` when an approval cancels a pending revocation.
    event Revoked(Kind indexed kind, bytes32 indexed id, uint64 until);
    /// @notice A KMS key epoch was registered.
    event KeyEpochRegistered(
        uint64 indexed epoch, bytes publicKey, bytes32 commitmentsHash, uint16 threshold, uint16 shardCount
    );
    /// @notice A KMS key epoch was retired: receipts issued from `time` (now +
    ///         governanceNotice) on are invalid under it.
    event KeyEpochRetired(uint64 indexed epoch, uint64 time);

    // ---- parameters ---------------------------------------------------------------------

    /// @notice The largest committeeSize setParams accepts (bounds the gas of `resolve`).
    function MAX_COMMITTEE_SIZE() external view returns (uint16);

    /// @notice setParams requires minOperatorStake >= this · slashAmount: the stake at the
    ///         minimum pays this many proven frauds in full (N frauds cost min(N·S, stake)).
    function MIN_OPERATOR_STAKE_SLASHES() external view returns (uint16);

    /// @notice The longest block interval (seconds) setParams sizes drawPeriod for: Ethereum's
    ///         12 s slot, the slowest chain these contracts target (L2s make blocks faster).
    function DRAW_BLOCK_TIME() external view returns (uint64);

    /// @notice setParams requires drawPeriod >= minDrawPeriod(drawDelayBlocks): a challenge's
    ///         seed block (drawDelayBlocks after its open block) exists, with room to spare,
    ///         before its draw deadline.
    /// @param drawDelayBlocks k, the blocks between a challenge's open block and its seed block.
    /// @return DRAW_PERIOD_MARGIN · (k + 1) · DRAW_BLOCK_TIME seconds.
    function minDrawPeriod(uint16 drawDelayBlocks) external pure returns (uint256);

    /// @notice Replaces all parameters. Running challenges keep the deadlines they were given;
    ///         publicationDeadline, drawPeriod and challengeWindow may grow but never shrink
    ///         (ParamShortened): existing receipts, claims and challenges read them.
    /// @param p The new parameters.
    function setParams(Params calldata p) external;

    /// @notice The current parameters.
    function params() external view returns (Params memory);

    /// @notice The subset of parameters openChallenge reads (cheaper than `params()`).
    function openParams() external view returns (OpenParams memory);

    /// @notice The minimum active stake of an operator (one storage read, for hot paths).
    function minOperatorStake() external view returns (uint128);

    /// @notice Seconds from a batch commit until every dispute about it has settled at the latest.
    /// @param p A parameter set.
    function maxDisputeSpan(Params memory p) external pure returns (uint256);

    // ---- allowlists ---------------------------------------------------------------------

    /// @notice Approves a model id, engine fingerprint hash or enclave measurement from now on
    ///         (a new interval; earlier intervals are kept), or cancels a pending revocation.
    /// @param kind Which allowlist.
    /// @param id The sha256 model id / fingerprint hash / measurement.
    function approve(Kind kind, bytes32 id) external;

    /// @notice Seconds between a revocation / key retirement and its effect (immutable).
    function governanceNotice() external view returns (uint64);

    /// @notice Revokes an entry from now + governanceNotice on; receipts issued before stay
    ///         valid. Approving the entry again before then cancels the revocation.
    /// @param kind Which allowlist.
    /// @param id The entry.
    function revoke(Kind kind, bytes32 id) external;

    /// @notice The newest approval interval of an entry (zeros when never approved).
    function approval(Kind kind, bytes32 id) external view returns (Approval memory);

    /// @notice Every approval interval of an entry, oldest first.
    function approvalHistory(Kind kind, bytes32 id) external view returns (Approval[] memory);

    /// @notice True iff `time` falls in one of `id`'s approval intervals [since, until).
    function isApprovedAt(Kind kind, bytes32 id, uint64 time) external view returns (bool);

    /// @notice True iff `id` is approved now.
    function isApproved(Kind kind, bytes32 id) external view returns (bool);

    // ---- KMS key epochs -----------------------------------------------------------------

    /// @notice Registers a live KMS key epoch.
    /// @param epoch Epoch number (any unused value).
    /// @param publicKey The HPKE public key receipts' envelopes are encrypted to.
    /// @param commitmentsHash keccak256 of the Feldman commitments of the sharing.
    /// @param threshold t: shares needed to reconstruct.
    /// @param shardCount n: shares dealt.
    function registerKeyEpoch(
        uint64 epoch,
        bytes calldata publicKey,
        bytes32 commitmentsHash,
        uint16 threshold,
        uint16 shardCount
    ) external;

    /// @notice Retires a key epoch from now + governanceNotice on; receipts issued from then on
    ///         are faults.
    /// @param epoch The epoch to retire.
    function retireKeyEpoch(uint64 epoch) external;

    /// @notice The full record of a key epoch (registeredAt 0 = unknown).
    function keyEpoch(uint64 epoch) external view returns (KeyEpoch memory);

    /// @notice True iff `epoch` was registered and not retired at time `time`.
    function isKeyEpochLiveAt(uint64 epoch, uint64 time) external view returns (bool);

    /// @notice True iff a receipt issued at `issuedAt` uses an approved model, an approved engine
    ///         fingerprint and a live key epoch. A receipt failing this is itself a fault.
    function isReceiptConfigValid(bytes32 modelId, bytes32 fingerprintHash, uint64 epoch, uint64 issuedAt)
        external
        view
        returns (bool);
}
