// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title ProtocolConfig
/// @notice Governance-owned allowlists (models, engine fingerprints, enclave measurements, KMS key
///         epochs) and protocol parameters. Allowlist entries carry an approval interval so that a
///         later revocation does not retroactively turn honest, older receipts into faults.
contract ProtocolConfig is Ownable {
    /// @notice Every protocol parameter. Times are seconds unless named blocks; shares are basis
    ///         points (1/10000). Amounts are wei.
    struct Params {
        // slot 0: read by every openChallenge
        uint64 challengeWindow; // Δ: a receipt can be challenged until batch commit + Δ
        uint64 publicationDeadline; // a receipt must be in a batch committed by issuedAt + this
        uint64 responsePeriod; // time the operator has to answer a withholding claim
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
        uint128 nonRevealPenalty;
        uint128 minOperatorStake;
        uint128 minVerifierStake;
        uint16 majorityRewardBps; // β, share of the slashed stake
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

    uint16 public constant BPS = 10_000;

    Params internal _params;
    mapping(Kind => mapping(bytes32 => Approval)) internal _approvals;
    mapping(uint64 => KeyEpoch) internal _epochs;

    /// @notice Parameters changed.
    event ParamsSet(Params params);
    /// @notice An allowlist entry was approved (from `since`).
    event Approved(Kind indexed kind, bytes32 indexed id, uint64 since);
    /// @notice An allowlist entry was revoked (from `until`).
    event Revoked(Kind indexed kind, bytes32 indexed id, uint64 until);
    /// @notice A KMS key epoch was registered.
    event KeyEpochRegistered(
        uint64 indexed epoch, bytes publicKey, bytes32 commitmentsHash, uint16 threshold, uint16 shardCount
    );
    /// @notice A KMS key epoch was retired: shards refuse it from now on.
    event KeyEpochRetired(uint64 indexed epoch, uint64 time);

    /// @notice A parameter set breaks a protocol rule; `reason` names the rule.
    error InvalidParams(string reason);
    /// @notice The entry is already approved.
    error AlreadyApproved(Kind kind, bytes32 id);
    /// @notice The entry is not currently approved.
    error NotApproved(Kind kind, bytes32 id);
    /// @notice The epoch number is already taken.
    error KeyEpochExists(uint64 epoch);
    /// @notice The epoch was never registered.
    error UnknownKeyEpoch(uint64 epoch);
    /// @notice The epoch is already retired.
    error KeyEpochAlreadyRetired(uint64 epoch, uint64 retiredAt);
    /// @notice Threshold/shard count out of range (need 1 <= t <= n).
    error InvalidThreshold(uint16 threshold, uint16 shardCount);
    /// @notice The epoch public key is empty.
    error EmptyPublicKey(uint64 epoch);

    /// @param governance Owner of the allowlists and parameters.
    /// @param initial The starting parameters (checked like `setParams`).
    constructor(address governance, Params memory initial) Ownable(governance) {
        _checkParams(initial);
        _params = initial;
        emit ParamsSet(initial);
    }

    // ---- parameters ---------------------------------------------------------------------

    /// @notice Replaces all parameters. Running challenges keep the deadlines they were given.
    /// @param p The new parameters.
    function setParams(Params calldata p) external onlyOwner {
        _checkParams(p);
        _params = p;
        emit ParamsSet(p);
    }

    /// @notice The current parameters.
    function params() external view returns (Params memory) {
        return _params;
    }

    /// @notice The subset of parameters openChallenge reads (cheaper than `params()`).
    function openParams() external view returns (OpenParams memory) {
        Params storage p = _params;
        return OpenParams(p.challengeWindow, p.drawDelayBlocks, p.challengerRewardBps, p.challengeBond, p.slashAmount);
    }

    /// @notice The minimum active stake of an operator (one storage read, for hot paths).
    function minOperatorStake() external view returns (uint128) {
        return _params.minOperatorStake;
    }

    /// @notice Seconds from a batch commit until every dispute about it has settled at the latest.
    function maxDisputeSpan(Params memory p) public pure returns (uint256) {
        return uint256(p.challengeWindow) + p.publicationDeadline + p.responsePeriod + p.drawPeriod
            + p.commitPeriod + p.revealPeriod;
    }

    function _checkParams(Params memory p) internal pure {
        if (p.challengeWindow == 0) revert InvalidParams("challengeWindow == 0");
        if (p.commitPeriod == 0 || p.revealPeriod == 0 || p.drawPeriod == 0 || p.responsePeriod == 0) {
            revert InvalidParams("a phase period is 0");
        }
        if (p.drawDelayBlocks == 0 || p.drawDelayBlocks > 200) {
            revert InvalidParams("drawDelayBlocks not in [1, 200]");
        }
        if (p.committeeSize == 0 || p.committeeSize > 64) revert InvalidParams("committeeSize not in [1, 64]");
        // INVARIANT: τ > 1/2, so at most one value can reach quorum.
        if (p.quorumBps <= BPS / 2 || p.quorumBps > BPS) revert InvalidParams("quorumBps not in (5000, 10000]");
        if (uint256(p.challengerRewardBps) + p.majorityRewardBps > BPS) {
            revert InvalidParams("alpha + beta > 10000");
        }
        // INVARIANT: stake stays bonded longer than any dispute about the last batch can take.
        if (p.unbondingPeriod <= maxDisputeSpan(p)) {
            revert InvalidParams("unbondingPeriod <= window + adjudication");
        }
        if (p.challengeBond == 0) revert InvalidParams("challengeBond == 0");
        if (p.challengeBond > type(uint96).max) revert InvalidParams("challengeBond > uint96");
        // A challenge stores its liability in 96 bits.
        if (p.slashAmount > type(uint96).max) revert InvalidParams("slashAmount > uint96");
        if (p.minOperatorStake < p.slashAmount) revert InvalidParams("minOperatorStake < slashAmount");
        if (p.minVerifierStake < p.nonRevealPenalty) {
            revert InvalidParams("minVerifierStake < nonRevealPenalty");
        }
        if (p.minVerifierStake == 0 || p.minOperatorStake == 0) revert InvalidParams("a minimum stake is 0");
    }

    // ---- allowlists ---------------------------------------------------------------------

    /// @notice Approves a model id, engine fingerprint hash or enclave measurement from now on.
    /// @param kind Which allowlist.
    /// @param id The sha256 model id / fingerprint hash / measurement.
    function approve(Kind kind, bytes32 id) external onlyOwner {
        Approval storage a = _approvals[kind][id];
        if (a.since != 0 && a.until == 0) revert AlreadyApproved(kind, id);
        a.since = uint64(block.timestamp);
        a.until = 0;
        emit Approved(kind, id, uint64(block.timestamp));
    }

    /// @notice Revokes an entry from now on; receipts issued before stay valid.
    /// @param kind Which allowlist.
    /// @param id The entry.
    function revoke(Kind kind, bytes32 id) external onlyOwner {
        Approval storage a = _approvals[kind][id];
        if (a.since == 0 || a.until != 0) revert NotApproved(kind, id);
        a.until = uint64(block.timestamp);
        emit Revoked(kind, id, uint64(block.timestamp));
    }

    /// @notice The approval interval of an entry (zeros when never approved).
    function approval(Kind kind, bytes32 id) external view returns (Approval memory) {
        return _approvals[kind][id];
    }

    /// @notice True iff `id` was approved at time `time`.
    function isApprovedAt(Kind kind, bytes32 id, uint64 time) public view returns (bool) {
        Approval memory a = _approvals[kind][id];
        return a.since != 0 && a.since <= time && (a.until == 0 || time < a.until);
    }

    /// @notice True iff `id` is approved now.
    function isApproved(Kind kind, bytes32 id) external view returns (bool) {
        return isApprovedAt(kind, id, uint64(block.timestamp));
    }

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
    ) external onlyOwner {
        if (_epochs[epoch].registeredAt != 0) revert KeyEpochExists(epoch);
        if (publicKey.length == 0) revert EmptyPublicKey(epoch);
        if (threshold == 0 || threshold > shardCount) revert InvalidThreshold(threshold, shardCount);
        _epochs[epoch] = KeyEpoch({
            publicKey: publicKey,
            commitmentsHash: commitmentsHash,
            threshold: threshold,
            shardCount: shardCount,
            registeredAt: uint64(block.timestamp),
            retiredAt: 0
        });
        emit KeyEpochRegistered(epoch, publicKey, commitmentsHash, threshold, shardCount);
    }

    /// @notice Retires a key epoch; receipts issued after this are faults.
    /// @param epoch The epoch to retire.
    function retireKeyEpoch(uint64 epoch) external onlyOwner {
        KeyEpoch storage e = _epochs[epoch];
        if (e.registeredAt == 0) revert UnknownKeyEpoch(epoch);
        if (e.retiredAt != 0) revert KeyEpochAlreadyRetired(epoch, e.retiredAt);
        e.retiredAt = uint64(block.timestamp);
        emit KeyEpochRetired(epoch, uint64(block.timestamp));
    }

    /// @notice The full record of a key epoch (registeredAt 0 = unknown).
    function keyEpoch(uint64 epoch) external view returns (KeyEpoch memory) {
        return _epochs[epoch];
    }

    /// @notice True iff `epoch` was registered and not retired at time `time`.
    function isKeyEpochLiveAt(uint64 epoch, uint64 time) public view returns (bool) {
        KeyEpoch storage e = _epochs[epoch];
        return e.registeredAt != 0 && e.registeredAt <= time && (e.retiredAt == 0 || time < e.retiredAt);
    }

    /// @notice True iff a receipt issued at `issuedAt` uses an approved model, an approved engine
    ///         fingerprint and a live key epoch. A receipt failing this is itself a fault.
    function isReceiptConfigValid(bytes32 modelId, bytes32 fingerprintHash, uint64 epoch, uint64 issuedAt)
        external
        view
        returns (bool)
    {
        return isApprovedAt(Kind.Model, modelId, issuedAt)
            && isApprovedAt(Kind.EngineFingerprint, fingerprintHash, issuedAt)
            && isKeyEpochLiveAt(epoch, issuedAt);
    }
}
