// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {IProtocolConfig} from "./interfaces/IProtocolConfig.sol";

/// @title ProtocolConfig
/// @notice The implementation of IProtocolConfig (see there): parameters checked against the
///         protocol's rules on every change, allowlists as approval intervals, KMS key epochs.
contract ProtocolConfig is Ownable, IProtocolConfig {
    uint16 public constant BPS = 10_000;
    /// @inheritdoc IProtocolConfig
    /// @dev INVARIANT: committeeSize <= MAX_COMMITTEE_SIZE bounds `resolve`: each member that
    ///      pays a penalty rewrites its draw weight in up to 1 + StakeRegistry.MAX_DECLARATIONS
    ///      pools (~2.2M gas worst case, fresh checkpoints on every Fenwick node), so the worst
    ///      resolve (every member penalized, each declared on the most fingerprints) stays under
    ///      15M gas (bench/gas.py `resolve_gas_worst`, ChallengeManager.t.sol).
    uint16 public constant MAX_COMMITTEE_SIZE = 6;
    /// @inheritdoc IProtocolConfig
    /// @dev INVARIANT: minOperatorStake >= MIN_OPERATOR_STAKE_SLASHES · slashAmount. An
    ///      operator's proven frauds cost min(N·S, stake): beyond stake / S they are free. At
    ///      the minimum stake the first MIN_OPERATOR_STAKE_SLASHES frauds are paid in full, and
    ///      one slash leaves the operator below the minimum (no new batch until it re-bonds).
    uint16 public constant MIN_OPERATOR_STAKE_SLASHES = 2;

    /// @inheritdoc IProtocolConfig
    uint64 public constant DRAW_BLOCK_TIME = 12;
    /// @notice drawPeriod must fit this many times the wait for a challenge's seed block: room for
    ///         missed slots and for the draw transaction to be included after the seed exists.
    uint64 public constant DRAW_PERIOD_MARGIN = 2;

    /// @inheritdoc IProtocolConfig
    /// @dev INVARIANT: immutable. A notice governance could set to 0 would let it revoke in the
    ///      second an operator signs again.
    uint64 public immutable governanceNotice;

    Params internal _params;
    /// @dev The newest approval interval of each entry (one slot: the read of every challenge
    ///      open, whose receipt is almost always inside it).
    mapping(Kind => mapping(bytes32 => Approval)) internal _approvals;
    /// @dev The intervals the newest one replaced, oldest first (ended, disjoint, increasing).
    mapping(Kind => mapping(bytes32 => Approval[])) internal _olderApprovals;
    mapping(uint64 => KeyEpoch) internal _epochs;

    /// @param governance Owner of the allowlists and parameters.
    /// @param initial The starting parameters (checked like `setParams`).
    /// @param governanceNotice_ Seconds between a revocation or a key epoch's retirement and the
    ///        time it takes effect (10 minutes in production, like StakeRegistry.coverageNotice):
    ///        receipts issued in between stay valid, and operators see the end coming.
    constructor(address governance, Params memory initial, uint64 governanceNotice_) Ownable(governance) {
        governanceNotice = governanceNotice_;
        _checkParams(initial);
        _params = initial;
        emit ParamsSet(initial);
    }

    // ---- parameters ---------------------------------------------------------------------

    /// @inheritdoc IProtocolConfig
    function setParams(Params calldata p) external onlyOwner {
        _checkParams(p);
        _checkNotShortened(_params, p);
        _params = p;
        emit ParamsSet(p);
    }

    /// @inheritdoc IProtocolConfig
    function params() external view returns (Params memory) {
        return _params;
    }

    /// @inheritdoc IProtocolConfig
    function openParams() external view returns (OpenParams memory) {
        Params storage p = _params;
        return OpenParams(p.challengeWindow, p.drawDelayBlocks, p.challengerRewardBps, p.challengeBond, p.slashAmount);
    }

    /// @inheritdoc IProtocolConfig
    function minOperatorStake() external view returns (uint128) {
        return _params.minOperatorStake;
    }

    /// @inheritdoc IProtocolConfig
    function maxDisputeSpan(Params memory p) public pure returns (uint256) {
        return uint256(p.challengeWindow) + p.publicationDeadline + p.responsePeriod + p.drawPeriod
            + p.commitPeriod + p.revealPeriod;
    }

    /// @inheritdoc IProtocolConfig
    function minDrawPeriod(uint16 drawDelayBlocks) public pure returns (uint256) {
        return uint256(DRAW_PERIOD_MARGIN) * (uint256(drawDelayBlocks) + 1) * DRAW_BLOCK_TIME;
    }

    /// @dev INVARIANT: publicationDeadline, drawPeriod and challengeWindow never shrink. They
    ///      are read when a claim opens (publishBy = issuedAt + publicationDeadline), when a
    ///      challenge is drawn or resolved undrawn (openedAt + drawPeriod) and when a challenge
    ///      opens (committedAt + challengeWindow), not stored when the receipt was signed or the
    ///      dispute began; shrinking one reached back in time: an honest operator that published
    ///      inside the deadline it signed under was slashed as unpublished, a running challenge of
    ///      a fraud could be resolved Inconclusive before its draw, a committed fraud's window
    ///      closed early (RetroactiveParams.t.sol). Growing them only gives honest parties more
    ///      time (unbondingPeriod > maxDisputeSpan is still checked on the new set). A shorter
    ///      value needs a new deployment.
    function _checkNotShortened(Params storage cur, Params calldata p) internal view {
        if (p.publicationDeadline < cur.publicationDeadline) {
            revert ParamShortened("publicationDeadline", cur.publicationDeadline, p.publicationDeadline);
        }
        if (p.drawPeriod < cur.drawPeriod) revert ParamShortened("drawPeriod", cur.drawPeriod, p.drawPeriod);
        if (p.challengeWindow < cur.challengeWindow) {
            revert ParamShortened("challengeWindow", cur.challengeWindow, p.challengeWindow);
        }
    }

    function _checkParams(Params memory p) internal pure {
        if (p.challengeWindow == 0) revert InvalidParams("challengeWindow == 0");
        if (p.commitPeriod == 0 || p.revealPeriod == 0 || p.drawPeriod == 0 || p.responsePeriod == 0) {
            revert InvalidParams("a phase period is 0");
        }
        if (p.drawDelayBlocks == 0 || p.drawDelayBlocks > 200) {
            revert InvalidParams("drawDelayBlocks not in [1, 200]");
        }
        // INVARIANT: a challenge can be drawn inside its draw period. drawCommittee needs a block
        // after openBlock + drawDelayBlocks and reverts after openedAt + drawPeriod; if the seed
        // block comes later than that (k = 200 at 12 s a block is 40 minutes, a 10-minute
        // drawPeriod ends first), no challenge is ever drawn: each ends undrawn, every fraud
        // escapes (AttackDrawDelay.t.sol).
        uint256 minDraw = minDrawPeriod(p.drawDelayBlocks);
        if (p.drawPeriod < minDraw) {
            revert DrawPeriodTooShort(p.drawDelayBlocks, DRAW_BLOCK_TIME, minDraw, p.drawPeriod);
        }
        if (p.committeeSize == 0 || p.committeeSize > MAX_COMMITTEE_SIZE) {
            revert InvalidParams("committeeSize not in [1, MAX_COMMITTEE_SIZE]");
        }
        // INVARIANT: τ > 1/2, so at most one value can reach quorum.
        if (p.quorumBps <= BPS / 2 || p.quorumBps > BPS) revert InvalidParams("quorumBps not in (5000, 10000]");
        // INVARIANT: in a committee of n >= 3 equal seats, n - 1 agreeing seats are a quorum
        // (τ·n <= (n - 1)·BPS, compared exactly in integers): one colluding seat cannot turn a
        // decided committee Inconclusive. τ = 6667 with n = 3 failed this (2/3 = 6666.67 bps).
        if (p.committeeSize >= 3 && uint256(p.quorumBps) * p.committeeSize > uint256(p.committeeSize - 1) * BPS) {
            revert InvalidParams("quorumBps > (committeeSize - 1) / committeeSize");
        }
        if (uint256(p.challengerRewardBps) + p.majorityRewardBps > BPS) {
            revert InvalidParams("alpha + beta > 10000");
        }
        // INVARIANT: stake stays bonded longer than any dispute about the last batch can take.
        if (p.unbondingPeriod <= maxDisputeSpan(p)) {
            revert InvalidParams("unbondingPeriod <= window + adjudication");
        }
        // INVARIANT: a claim opens by issuedAt + publicationDeadline + claimWindow and settles
        // within responsePeriod after, inside maxDisputeSpan (so inside unbondingPeriod).
        if (p.claimWindow == 0 || p.claimWindow > p.challengeWindow) {
            revert InvalidParams("claimWindow not in [1, challengeWindow]");
        }
        if (p.challengeBond == 0) revert InvalidParams("challengeBond == 0");
        if (p.challengeBond > type(uint96).max) revert InvalidParams("challengeBond > uint96");
        // A challenge stores its liability in 96 bits.
        if (p.slashAmount > type(uint96).max) revert InvalidParams("slashAmount > uint96");
        if (p.minOperatorStake < uint256(MIN_OPERATOR_STAKE_SLASHES) * p.slashAmount) {
            revert InvalidParams("minOperatorStake < MIN_OPERATOR_STAKE_SLASHES * slashAmount");
        }
        if (p.minVerifierStake < p.nonRevealPenalty) {
            revert InvalidParams("minVerifierStake < nonRevealPenalty");
        }
        if (p.minVerifierStake == 0 || p.minOperatorStake == 0) revert InvalidParams("a minimum stake is 0");
    }

    // ---- allowlists ---------------------------------------------------------------------

    /// @inheritdoc IProtocolConfig
    function approve(Kind kind, bytes32 id) external onlyOwner {
        Approval storage a = _approvals[kind][id];
        if (a.since != 0 && a.until == 0) revert AlreadyApproved(kind, id);
        if (a.until > block.timestamp) {
            // A revocation still in its notice: cancelled, the interval goes on unbroken.
            a.until = 0;
            emit Approved(kind, id, a.since);
            return;
        }
        // INVARIANT: an approval never rewrites a past interval: receipts issued inside an
        // earlier [since, until) stay approved (before, re-approving overwrote `since`).
        if (a.since != 0) _olderApprovals[kind][id].push(a);
        a.since = uint64(block.timestamp);
        a.until = 0;
        emit Approved(kind, id, uint64(block.timestamp));
    }

    /// @inheritdoc IProtocolConfig
    function revoke(Kind kind, bytes32 id) external onlyOwner {
        Approval storage a = _approvals[kind][id];
        if (a.since == 0 || a.until != 0) revert NotApproved(kind, id);
        // INVARIANT: a revocation takes effect governanceNotice after it is sent: a receipt an
        // operator signs in the meantime is valid.
        uint64 until = uint64(block.timestamp) + governanceNotice;
        a.until = until;
        emit Revoked(kind, id, until);
    }

    /// @inheritdoc IProtocolConfig
    function approval(Kind kind, bytes32 id) external view returns (Approval memory) {
        return _approvals[kind][id];
    }

    /// @inheritdoc IProtocolConfig
    function isApprovedAt(Kind kind, bytes32 id, uint64 time) public view returns (bool) {
        Approval memory a = _approvals[kind][id];
        if (a.since != 0 && a.since <= time) return a.until == 0 || time < a.until; // the common case
        Approval[] storage older = _olderApprovals[kind][id];
        for (uint256 i = older.length; i != 0; i--) {
            Approval memory o = older[i - 1];
            if (o.since <= time) return time < o.until;
        }
        return false;
    }

    /// @inheritdoc IProtocolConfig
    function approvalHistory(Kind kind, bytes32 id) external view returns (Approval[] memory intervals) {
        Approval[] storage older = _olderApprovals[kind][id];
        Approval memory a = _approvals[kind][id];
        intervals = new Approval[](older.length + (a.since != 0 ? 1 : 0));
        for (uint256 i = 0; i < older.length; i++) {
            intervals[i] = older[i];
        }
        if (a.since != 0) intervals[older.length] = a;
    }

    /// @inheritdoc IProtocolConfig
    function isApproved(Kind kind, bytes32 id) external view returns (bool) {
        return isApprovedAt(kind, id, uint64(block.timestamp));
    }

    // ---- KMS key epochs -----------------------------------------------------------------

    /// @inheritdoc IProtocolConfig
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

    /// @inheritdoc IProtocolConfig
    function retireKeyEpoch(uint64 epoch) external onlyOwner {
        KeyEpoch storage e = _epochs[epoch];
        if (e.registeredAt == 0) revert UnknownKeyEpoch(epoch);
        if (e.retiredAt != 0) revert KeyEpochAlreadyRetired(epoch, e.retiredAt);
        // INVARIANT: like a revocation, a retirement takes effect governanceNotice later.
        uint64 retiredAt = uint64(block.timestamp) + governanceNotice;
        e.retiredAt = retiredAt;
        emit KeyEpochRetired(epoch, retiredAt);
    }

    /// @inheritdoc IProtocolConfig
    function keyEpoch(uint64 epoch) external view returns (KeyEpoch memory) {
        return _epochs[epoch];
    }

    /// @inheritdoc IProtocolConfig
    function isKeyEpochLiveAt(uint64 epoch, uint64 time) public view returns (bool) {
        KeyEpoch storage e = _epochs[epoch];
        return e.registeredAt != 0 && e.registeredAt <= time && (e.retiredAt == 0 || time < e.retiredAt);
    }

    /// @inheritdoc IProtocolConfig
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
