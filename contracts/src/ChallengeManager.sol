// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {IChallengeManager} from "./interfaces/IChallengeManager.sol";
import {IProtocolConfig} from "./interfaces/IProtocolConfig.sol";
import {IStakeRegistry} from "./interfaces/IStakeRegistry.sol";
import {IBatchRegistry} from "./interfaces/IBatchRegistry.sol";
import {IProtocolConfigTypes} from "./types/ProtocolConfigTypes.sol";
import {IBatchRegistryTypes} from "./types/BatchRegistryTypes.sol";
import {ReceiptLib} from "./lib/ReceiptLib.sol";
import {BatchMerkle} from "./lib/BatchMerkle.sol";
import {PoolKey} from "./lib/PoolKey.sol";

/// @title ChallengeManager
/// @notice The implementation of IChallengeManager (the dispute rules are stated there, function
///         by function). Invariants the code keeps are marked `INVARIANT:` where they are kept.
contract ChallengeManager is EIP712, ReentrancyGuard, IChallengeManager {
    using SafeCast for uint256;

    uint256 internal constant BPS = 10_000;

    /// @inheritdoc IChallengeManager
    bytes32 public constant INVALID_EVIDENCE = keccak256("verinfer.vote.invalid-evidence");

    /// @inheritdoc IChallengeManager
    uint64 public constant MAX_CLOCK_SKEW = 5 minutes;

    /// @inheritdoc IChallengeManager
    IProtocolConfig public immutable config;
    /// @inheritdoc IChallengeManager
    IStakeRegistry public immutable stakes;
    /// @inheritdoc IChallengeManager
    IBatchRegistry public immutable batches;

    /// @inheritdoc IChallengeManager
    uint256 public challengeCount;
    /// @inheritdoc IChallengeManager
    uint256 public claimCount;
    /// @inheritdoc IChallengeManager
    mapping(address => uint256) public credits;
    /// @inheritdoc IChallengeManager
    uint256 public totalCredits;
    /// @inheritdoc IChallengeManager
    uint256 public totalBurnt;

    mapping(uint256 => Challenge) internal _challenges;

    mapping(uint256 => Member[]) internal _members;
    mapping(uint256 => mapping(address => Vote)) internal _votes;
    mapping(uint256 => Claim) internal _claims;
    mapping(bytes32 => ReceiptState) internal _receipts;

    /// @param config_ Parameters and allowlists.
    /// @param stakes_ The stake registry (this contract must be its challengeManager).
    /// @param batches_ The batch registry.
    constructor(IProtocolConfig config_, IStakeRegistry stakes_, IBatchRegistry batches_) EIP712("verinfer", "1") {
        config = config_;
        stakes = stakes_;
        batches = batches_;
    }

    /// @notice Receives slashed stake from the StakeRegistry only.
    receive() external payable {
        if (msg.sender != address(stakes)) revert UnexpectedEther(msg.sender);
    }

    // ---- receipts -----------------------------------------------------------------------

    /// @inheritdoc IChallengeManager
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /// @inheritdoc IChallengeManager
    function receiptDigest(ReceiptLib.Receipt calldata r) public view returns (bytes32) {
        return _hashTypedDataV4(ReceiptLib.structHash(r));
    }

    /// @inheritdoc IChallengeManager
    function receiptState(bytes32 digest) external view returns (ReceiptState memory) {
        return _receipts[digest];
    }

    /// @dev Checks version, chain and signer; returns the digest.
    function _verifyReceipt(ReceiptLib.Receipt calldata r, bytes calldata signature, bool checkOperator)
        internal
        view
        returns (bytes32 digest)
    {
        if (r.version != ReceiptLib.VERSION) revert UnsupportedReceiptVersion(r.version);
        // INVARIANT: a receipt is only valid on the chain it names (replay protection).
        if (r.chainId != block.chainid) revert WrongChainId(r.chainId, block.chainid);
        digest = receiptDigest(r);
        (address recovered, ECDSA.RecoverError err,) = ECDSA.tryRecoverCalldata(digest, signature);
        if (err != ECDSA.RecoverError.NoError) revert InvalidSignature(digest);
        // INVARIANT: only the operator's own signature binds the operator.
        if (recovered != r.operator) revert SignerMismatch(r.operator, recovered);
        if (checkOperator && !stakes.isOperator(r.operator)) revert NotOperator(r.operator);
    }

    /// @dev At most one live challenge per receipt, and none once stake was taken for its
    ///      content. A live unpublished claim does not hold a challenge off.
    function _checkChallengeable(bytes32 digest) internal view returns (ReceiptState storage rs) {
        rs = _receipts[digest];
        // INVARIANT: no receipt is slashed twice for its content.
        if (rs.slashed) revert ReceiptAlreadySlashed(digest);
        if (rs.liveChallenge != 0) revert DisputeAlreadyLive(digest, rs.liveChallenge, rs.liveClaim);
    }

    // ---- full challenges ----------------------------------------------------------------

    /// @inheritdoc IChallengeManager
    function openChallenge(
        ReceiptLib.Receipt calldata r,
        bytes calldata signature,
        bytes32 batchRoot,
        uint256 leafIndex,
        bytes32[] calldata siblings
    ) external payable returns (uint256 id) {
        // No operator-status check here: the batch lookup below is keyed by the operator, and
        // committing a batch required an active operator.
        bytes32 digest = _verifyReceipt(r, signature, false);
        ReceiptState storage rs = _checkChallengeable(digest);
        IProtocolConfigTypes.OpenParams memory p = config.openParams();
        if (msg.value != p.challengeBond) revert WrongBond(msg.value, p.challengeBond);
        (bytes32 bid, uint64 committedAt) =
            _checkInclusion(r.operator, digest, batchRoot, leafIndex, siblings, p.challengeWindow);
        id = _storeChallenge(r, digest, bid, p);
        // Invalid on its face: unapproved model / fingerprint / key epoch at issuedAt; dated
        // after its own batch was committed (beyond the clock skew), which would also put its
        // publication deadline out of reach; or claiming the reserved INVALID_EVIDENCE output.
        if (
            !_configValid(r) || uint256(r.issuedAt) > uint256(committedAt) + MAX_CLOCK_SKEW
                || r.outHash == INVALID_EVIDENCE
        ) {
            _slashInvalidReceipt(id, rs, p.challengerRewardBps);
        } else {
            _challenges[id].status = Status.AwaitingDraw;
            rs.liveChallenge = id.toUint64();
        }
    }

    /// @dev Model, engine fingerprint and key epoch approved when the receipt was issued, and
    ///      the fingerprint covered by declared verifiers then.
    function _configValid(ReceiptLib.Receipt calldata r) internal view returns (bool) {
        // INVARIANT: a receipt whose fingerprint no declared verifier covered at issuedAt is the
        // operator's fault (it could see the coverage when it signed): slashed at open. A
        // receipt covered at issuedAt keeps at least one drawable verifier through every
        // challenge inside its window (StakeRegistry: undeclaring takes maxDisputeSpan, and a
        // declared verifier cannot unbond below the minimum), so its committee is never empty
        // for lack of declared verifiers.
        return config.isReceiptConfigValid(r.modelId, r.engineFingerprintHash, r.keyEpoch, r.issuedAt)
            && stakes.isCoveredAt(PoolKey.key(r.engineFingerprintHash, r.modelId), r.issuedAt);
    }

    function _storeChallenge(
        ReceiptLib.Receipt calldata r,
        bytes32 digest,
        bytes32 bid,
        IProtocolConfigTypes.OpenParams memory p
    ) internal returns (uint256 id) {
        id = ++challengeCount;
        Challenge storage c = _challenges[id];
        c.receiptDigest = digest;
        c.receiptOutHash = r.outHash;
        c.operator = r.operator;
        c.openedAt = uint40(block.timestamp);
        c.challenger = msg.sender;
        c.bond = msg.value.toUint96();
        c.targetBlock = uint40(block.number) + p.drawDelayBlocks;
        c.snapshotBlock = uint48(block.number);
        c.lockedStake = uint256(p.slashAmount).toUint96();
        c.pool = PoolKey.key(r.engineFingerprintHash, r.modelId);
        // The full liability, whatever other disputes hold (never blocked, never shared).
        stakes.lock(r.operator, p.slashAmount);
        emit ChallengeOpened(id, digest, r.operator, msg.sender, bid, msg.value, c.targetBlock);
    }

    /// @dev The signed receipt alone proves the fault: slash at once, no committee.
    function _slashInvalidReceipt(uint256 id, ReceiptState storage rs, uint16 alphaBps) internal {
        Challenge storage c = _challenges[id];
        c.status = Status.Slashed;
        uint256 slashed = _slashOperator(c.operator, c.lockedStake, c.receiptDigest, Fault.InvalidReceipt, id);
        // INVARIANT: a receipt is marked slashed only when stake was taken.
        if (slashed != 0) rs.slashed = true;
        uint256 reward = _payChallenger(c.challenger, c.bond, slashed, alphaBps);
        _burn(slashed - reward);
        emit ChallengeResolved(id, Status.Slashed, bytes32(0), slashed);
    }

    /// @dev Merkle inclusion into a committed batch of the same operator, inside the window.
    function _checkInclusion(
        address operator,
        bytes32 digest,
        bytes32 root,
        uint256 leafIndex,
        bytes32[] calldata siblings,
        uint64 window
    ) internal view returns (bytes32 bid, uint64 committedAt) {
        bid = keccak256(abi.encode(operator, root)); // == BatchRegistry.batchId
        IBatchRegistryTypes.Batch memory b = batches.batch(bid);
        committedAt = b.committedAt;
        if (b.committedAt == 0) revert BatchNotFound(operator, root);
        // INVARIANT: a challenge opens only inside the batch's window.
        uint256 deadline = uint256(b.committedAt) + window;
        if (block.timestamp > deadline) revert ChallengeWindowClosed(bid, deadline, block.timestamp);
        if (!BatchMerkle.verify(digest, leafIndex, b.leafCount, siblings, root)) {
            revert InvalidMerkleProof(bid, digest, leafIndex);
        }
    }

    /// @inheritdoc IChallengeManager
    function drawCommittee(uint256 id) external {
        Challenge storage c = _challenge(id);
        if (c.status != Status.AwaitingDraw) revert WrongStatus(id, c.status, Status.AwaitingDraw);
        IProtocolConfigTypes.Params memory p = config.params();
        uint256 drawDeadline = uint256(c.openedAt) + p.drawPeriod;
        if (block.timestamp > drawDeadline) revert DrawPeriodOver(id, drawDeadline, block.timestamp);
        // INVARIANT: randomness comes from a block mined after the challenge was opened.
        if (block.number <= c.targetBlock) revert DrawTooEarly(id, c.targetBlock, block.number);
        bytes32 bh = blockhash(c.targetBlock);
        if (bh == bytes32(0)) {
            uint40 newTarget = uint40(block.number) + p.drawDelayBlocks;
            emit DrawRearmed(id, c.targetBlock, newTarget);
            c.targetBlock = newTarget;
            return;
        }
        // INVARIANT: membership depends only on the seed and the weights, at snapshotBlock, of
        // the verifiers declared for the receipt's fingerprint (the only ones able to judge it).
        bytes32 seed = keccak256(abi.encode(bh, id));
        // The challenger is drawable like any declared verifier. Excluding it was no defence (a
        // verifier can always challenge from another address) and it handed the committee to
        // whoever else was in the pool: with an honest H (3 ETH) that challenges from its key
        // and a sybil X (1 ETH), the committee was {X} and X dismissed the fraud.
        // INVARIANT: the committee is empty only if the pool had no weight at the snapshot.
        (address[] memory chosen, uint256[] memory weights, uint256 total) =
            stakes.drawCommittee(c.pool, seed, c.snapshotBlock, p.committeeSize, address(0));
        if (chosen.length == 0) {
            _finishWithoutCommittee(id, c);
            return;
        }
        c.status = Status.Voting;
        c.members = uint16(chosen.length);
        c.totalWeight = total.toUint112();
        c.memberPenalty = p.nonRevealPenalty;
        c.quorumBps = p.quorumBps;
        c.challengerRewardBps = p.challengerRewardBps;
        c.majorityRewardBps = p.majorityRewardBps;
        c.commitDeadline = uint64(block.timestamp) + p.commitPeriod;
        c.revealDeadline = c.commitDeadline + p.revealPeriod;
        for (uint256 i = 0; i < chosen.length; i++) {
            _members[id].push(Member(chosen[i], weights[i].toUint96()));
            _votes[id][chosen[i]].state = VoteState.Member;
            // A liability like the operator's: a non-revealer loses min(penalty, its stake).
            stakes.lock(chosen[i], p.nonRevealPenalty);
        }
        emit CommitteeDrawn(id, chosen, weights, c.commitDeadline, c.revealDeadline);
    }

    /// @inheritdoc IChallengeManager
    function commitVote(uint256 id, bytes32 commitment) external {
        Challenge storage c = _challenge(id);
        if (c.status != Status.Voting) revert WrongStatus(id, c.status, Status.Voting);
        if (block.timestamp > c.commitDeadline) revert CommitPhaseOver(id, c.commitDeadline, block.timestamp);
        if (commitment == bytes32(0)) revert ZeroCommitment();
        Vote storage v = _votes[id][msg.sender];
        // INVARIANT: only drawn members vote, once.
        if (v.state == VoteState.None) revert NotCommitteeMember(id, msg.sender);
        if (v.state != VoteState.Member) revert AlreadyCommitted(id, msg.sender);
        v.value = commitment;
        v.state = VoteState.Committed;
        c.commits += 1;
        emit VoteCommitted(id, msg.sender, commitment);
    }

    /// @inheritdoc IChallengeManager
    function revealVote(uint256 id, bytes32 outHash, bytes32 salt) external {
        Challenge storage c = _challenge(id);
        if (c.status != Status.Voting) revert WrongStatus(id, c.status, Status.Voting);
        if (block.timestamp <= c.commitDeadline && c.commits < c.members) {
            revert RevealPhaseNotOpen(id, c.commitDeadline, block.timestamp);
        }
        if (block.timestamp > c.revealDeadline) revert RevealPhaseOver(id, c.revealDeadline, block.timestamp);
        Vote storage v = _votes[id][msg.sender];
        if (v.state == VoteState.None) revert NotCommitteeMember(id, msg.sender);
        if (v.state == VoteState.Member) revert NotCommitted(id, msg.sender);
        if (v.state == VoteState.Revealed) revert AlreadyRevealed(id, msg.sender);
        bytes32 computed = voteCommitment(id, msg.sender, outHash, salt);
        // INVARIANT: a reveal must open the member's own commitment.
        if (computed != v.value) revert RevealMismatch(id, msg.sender, v.value, computed);
        v.value = outHash;
        v.state = VoteState.Revealed;
        c.reveals += 1;
        emit VoteRevealed(id, msg.sender, outHash);
    }

    /// @inheritdoc IChallengeManager
    function voteCommitment(uint256 id, address voter, bytes32 outHash, bytes32 salt) public pure returns (bytes32) {
        return keccak256(abi.encode(id, voter, outHash, salt));
    }

    /// @inheritdoc IChallengeManager
    function resolve(uint256 id) external nonReentrant {
        Challenge storage c = _challenge(id);
        if (c.status == Status.AwaitingDraw) {
            uint256 drawDeadline = uint256(c.openedAt) + config.params().drawPeriod;
            if (block.timestamp <= drawDeadline) revert TooEarlyToResolve(id, drawDeadline, block.timestamp);
            _finishWithoutCommittee(id, c);
            return;
        }
        if (c.status != Status.Voting) revert WrongStatus(id, c.status, Status.Voting);
        if (block.timestamp <= c.revealDeadline && c.reveals < c.members) {
            revert TooEarlyToResolve(id, c.revealDeadline, block.timestamp);
        }
        (uint256 receiptWeight, bytes32 alt, uint256 altWeight, uint256 invalidWeight) = _tally(id, c.receiptOutHash);

        ReceiptState storage rs = _receipts[c.receiptDigest];
        rs.liveChallenge = 0;
        if (_decided(c, receiptWeight)) {
            c.status = Status.Dismissed;
            c.majorityOutHash = c.receiptOutHash;
            _settleMembers(id, c.memberPenalty, Status.Dismissed, c.receiptOutHash);
            stakes.unlock(c.operator, c.lockedStake);
            _payMajority(id, c.receiptOutHash, bytes32(0), receiptWeight, c.bond);
            emit ChallengeResolved(id, Status.Dismissed, c.receiptOutHash, 0);
        } else if (_decided(c, altWeight + invalidWeight)) {
            // Against the receipt: the best other output plus "evidence unavailable/invalid"
            // (the operator answers for its evidence). The recorded value is the larger part.
            bytes32 verdict = altWeight >= invalidWeight ? alt : INVALID_EVIDENCE;
            c.status = Status.Slashed;
            c.majorityOutHash = verdict;
            _settleMembers(id, c.memberPenalty, Status.Slashed, c.receiptOutHash);
            uint256 slashed = _slashOperator(c.operator, c.lockedStake, c.receiptDigest, Fault.Reexecution, id);
            // INVARIANT: a receipt is marked slashed only when stake was taken.
            if (slashed != 0) rs.slashed = true;
            uint256 toChallenger = _payChallenger(c.challenger, c.bond, slashed, c.challengerRewardBps);
            uint256 pool = (slashed * c.majorityRewardBps) / BPS;
            _payMajority(id, alt, INVALID_EVIDENCE, altWeight + invalidWeight, pool);
            _burn(slashed - toChallenger - pool);
            emit ChallengeResolved(id, Status.Slashed, verdict, slashed);
        } else {
            c.status = Status.Inconclusive;
            _settleMembers(id, c.memberPenalty, Status.Inconclusive, c.receiptOutHash);
            stakes.unlock(c.operator, c.lockedStake);
            _credit(c.challenger, c.bond);
            emit ChallengeResolved(id, Status.Inconclusive, bytes32(0), 0);
        }
    }

    /// @dev Whether `weight` of the committee's total decides the challenge: weight·BPS >= τ·W
    ///      with the τ fixed at the draw (exact integers, no rounding either way), or, in a
    ///      committee of m >= 3 seats, weight·m >= (m - 1)·W. ProtocolConfig bounds τ by
    ///      (n - 1)/n for a full committee of n = committeeSize seats; a pool with fewer declared
    ///      verifiers gives m < n seats, and there n - 1 of n is more than m - 1 of m: under
    ///      (6 seats, τ 8333) a committee of 4 needed all 4, so one colluding seat blocked every
    ///      verdict. The bound holds for the committee actually drawn. (m - 1)/m > 1/2 for
    ///      m >= 3, so at most one side is ever decided.
    function _decided(Challenge storage c, uint256 weight) internal view returns (bool) {
        uint256 total = c.totalWeight;
        if (weight * BPS >= uint256(c.quorumBps) * total) return true;
        uint256 m = c.members;
        return m >= 3 && weight * m >= (m - 1) * total;
    }

    /// @dev Stake on the receipt's outHash, the best-supported other output, and stake on
    ///      INVALID_EVIDENCE.
    function _tally(uint256 id, bytes32 receiptOut)
        internal
        view
        returns (uint256 receiptWeight, bytes32 alt, uint256 altWeight, uint256 invalidWeight)
    {
        Member[] storage ms = _members[id];
        uint256 n = ms.length;
        bytes32[] memory values = new bytes32[](n);
        uint256[] memory w = new uint256[](n);
        for (uint256 i = 0; i < n; i++) {
            Vote storage v = _votes[id][ms[i].account];
            if (v.state != VoteState.Revealed) continue;
            values[i] = v.value;
            w[i] = ms[i].weight;
            if (v.value == receiptOut) receiptWeight += w[i];
            else if (v.value == INVALID_EVIDENCE) invalidWeight += w[i];
        }
        for (uint256 i = 0; i < n; i++) {
            if (w[i] == 0 || values[i] == receiptOut || values[i] == INVALID_EVIDENCE) continue;
            uint256 sum = 0;
            for (uint256 j = 0; j < n; j++) {
                if (w[j] != 0 && values[j] == values[i]) sum += w[j];
            }
            if (sum > altWeight) {
                altWeight = sum;
                alt = values[i];
            }
        }
    }

    /// @dev Settles every member's penalty liability: released for a revealer on the winning
    ///      side (or any revealer when the outcome is Inconclusive); taken (and burnt) from a
    ///      non-revealer and from a revealer outvoted by a decided quorum: a receipt-outHash vote
    ///      when Slashed, a vote for another output when Dismissed. INVALID_EVIDENCE outvoted by
    ///      a dismissal is not penalized: an honest member reveals it when the operator's
    ///      evidence did not reach it, which the operator controls.
    function _settleMembers(uint256 id, uint256 penalty, Status outcome, bytes32 receiptOut) internal {
        Member[] storage ms = _members[id];
        for (uint256 i = 0; i < ms.length; i++) {
            address m = ms[i].account;
            Vote storage v = _votes[id][m];
            bool pays = v.state != VoteState.Revealed;
            if (!pays && outcome == Status.Slashed) pays = v.value == receiptOut;
            if (!pays && outcome == Status.Dismissed) pays = v.value != receiptOut && v.value != INVALID_EVIDENCE;
            // INVARIANT: a member that revealed the decided side never pays; one that lost to a
            // decided quorum pays like a non-revealer, so blocking a quorum is not free.
            if (!pays) {
                stakes.unlock(m, penalty);
            } else if (penalty != 0) {
                uint256 taken = stakes.slashLocked(m, penalty);
                _burn(taken);
                emit MemberPenalized(id, m, taken);
            }
        }
    }

    /// @dev Splits `amount` among members who revealed `value` or `value2` (0 = none), pro rata
    ///      to weight (`weight` = their total); dust burnt.
    function _payMajority(uint256 id, bytes32 value, bytes32 value2, uint256 weight, uint256 amount) internal {
        if (amount == 0) return;
        Member[] storage ms = _members[id];
        uint256 paid = 0;
        for (uint256 i = 0; i < ms.length; i++) {
            Vote storage v = _votes[id][ms[i].account];
            if (v.state != VoteState.Revealed) continue;
            if (v.value != value && (value2 == bytes32(0) || v.value != value2)) continue;
            uint256 share = (amount * ms[i].weight) / weight;
            paid += share;
            _credit(ms[i].account, share);
        }
        _burn(amount - paid);
    }

    /// @dev No committee (draw timed out or nobody eligible): bond back, operator unlocked.
    function _finishWithoutCommittee(uint256 id, Challenge storage c) internal {
        c.status = Status.Inconclusive;
        _receipts[c.receiptDigest].liveChallenge = 0;
        stakes.unlock(c.operator, c.lockedStake);
        _credit(c.challenger, c.bond);
        emit ChallengeResolved(id, Status.Inconclusive, bytes32(0), 0);
    }

    // ---- unpublished claims -------------------------------------------------------------

    /// @inheritdoc IChallengeManager
    function claimUnpublished(ReceiptLib.Receipt calldata r, bytes calldata signature)
        external
        payable
        nonReentrant
        returns (uint256 id)
    {
        bytes32 digest = _verifyReceipt(r, signature, true);
        ReceiptState storage rs = _receipts[digest];
        IProtocolConfigTypes.Params memory p = config.params();
        if (msg.value != p.challengeBond) revert WrongBond(msg.value, p.challengeBond);
        // All in uint256: issuedAt = 2^64 - 1 cannot overflow anything.
        bool futureDated = uint256(r.issuedAt) > block.timestamp + MAX_CLOCK_SKEW;
        if (futureDated) {
            if (rs.slashed) revert ReceiptAlreadySlashed(digest);
        } else {
            if (rs.unpublishedSlashed) revert ReceiptAlreadySlashed(digest);
            if (rs.liveClaim != 0) revert DisputeAlreadyLive(digest, rs.liveChallenge, rs.liveClaim);
        }
        uint256 publishBy = futureDated ? block.timestamp : uint256(r.issuedAt) + p.publicationDeadline;
        if (!futureDated && block.timestamp <= publishBy) {
            revert PublicationDeadlineNotPassed(digest, publishBy, block.timestamp);
        }
        // INVARIANT: a claim opens only within claimWindow after the publication deadline, so
        // an operator keeps inclusion proofs for a bounded time (and its stake, bonded past
        // maxDisputeSpan, still holds every claim that can open).
        uint256 claimBy = publishBy + p.claimWindow;
        if (!futureDated && block.timestamp > claimBy) revert ClaimWindowClosed(digest, claimBy, block.timestamp);
        id = ++claimCount;
        Claim storage cl = _claims[id];
        cl.receiptDigest = digest;
        cl.operator = r.operator;
        cl.responseDeadline = uint64(block.timestamp) + p.responsePeriod;
        cl.status = ClaimStatus.Open;
        cl.claimant = msg.sender;
        cl.bond = msg.value.toUint96();
        cl.publishBy = publishBy.toUint64();
        cl.lockedStake = p.slashAmount;
        cl.challengerRewardBps = p.challengerRewardBps;
        stakes.lock(r.operator, p.slashAmount);
        emit ClaimOpened(id, digest, r.operator, msg.sender, cl.publishBy, cl.responseDeadline);
        if (futureDated) {
            cl.status = ClaimStatus.Slashed;
            uint256 slashed = _slashOperator(r.operator, p.slashAmount, digest, Fault.InvalidReceipt, id);
            if (slashed != 0) rs.slashed = true;
            uint256 toClaimant = _payChallenger(msg.sender, msg.value, slashed, p.challengerRewardBps);
            _burn(slashed - toClaimant);
            emit ClaimUpheld(id, slashed);
        } else {
            rs.liveClaim = id.toUint64();
        }
    }

    /// @inheritdoc IChallengeManager
    function answerUnpublished(uint256 id, bytes32 batchRoot, uint256 leafIndex, bytes32[] calldata siblings) external {
        Claim storage cl = _claims[id];
        if (cl.status != ClaimStatus.Open) revert ClaimNotOpen(id, cl.status);
        if (block.timestamp > cl.responseDeadline) {
            revert ResponsePeriodOver(id, cl.responseDeadline, block.timestamp);
        }
        bytes32 bid = batches.batchId(cl.operator, batchRoot);
        IBatchRegistryTypes.Batch memory b = batches.batch(bid);
        if (b.committedAt == 0) revert BatchNotFound(cl.operator, batchRoot);
        // INVARIANT: only publication by the deadline answers the claim.
        if (b.committedAt > cl.publishBy) revert BatchCommittedLate(bid, b.committedAt, cl.publishBy);
        if (!BatchMerkle.verify(cl.receiptDigest, leafIndex, b.leafCount, siblings, batchRoot)) {
            revert InvalidMerkleProof(bid, cl.receiptDigest, leafIndex);
        }
        cl.status = ClaimStatus.Answered;
        _receipts[cl.receiptDigest].liveClaim = 0;
        stakes.unlock(cl.operator, cl.lockedStake);
        _credit(cl.operator, cl.bond);
        // The proof goes into the log: a root whose manifest was never published still yields
        // the receipt's position and path to anyone reading the chain.
        emit ClaimAnswered(id, bid, batchRoot, leafIndex, siblings);
    }

    /// @inheritdoc IChallengeManager
    function resolveUnpublished(uint256 id) external nonReentrant {
        Claim storage cl = _claims[id];
        if (cl.status != ClaimStatus.Open) revert ClaimNotOpen(id, cl.status);
        if (block.timestamp <= cl.responseDeadline) {
            revert ResponsePeriodNotOver(id, cl.responseDeadline, block.timestamp);
        }
        cl.status = ClaimStatus.Slashed;
        ReceiptState storage rs = _receipts[cl.receiptDigest];
        rs.liveClaim = 0;
        uint256 slashed = _slashOperator(cl.operator, cl.lockedStake, cl.receiptDigest, Fault.Unpublished, id);
        // INVARIANT: a receipt is marked slashed only when stake was taken.
        if (slashed != 0) rs.unpublishedSlashed = true;
        uint256 toClaimant = _payChallenger(cl.claimant, cl.bond, slashed, cl.challengerRewardBps);
        _burn(slashed - toClaimant);
        emit ClaimUpheld(id, slashed);
    }

    // ---- payouts ------------------------------------------------------------------------

    /// @dev Settles the dispute's liability as a slash; returns what was actually taken
    ///      (`amount` unless the operator's whole stake is already gone).
    function _slashOperator(address operator, uint256 amount, bytes32 digest, Fault fault, uint256 disputeId)
        internal
        returns (uint256 taken)
    {
        taken = stakes.slashLocked(operator, amount);
        emit OperatorSlashed(operator, digest, fault, taken, disputeId);
    }

    /// @dev Bond back plus α of the slashed amount; returns the α part.
    function _payChallenger(address challenger, uint256 bond, uint256 slashed, uint16 alphaBps)
        internal
        returns (uint256 reward)
    {
        reward = (slashed * alphaBps) / BPS;
        _credit(challenger, bond + reward);
    }

    function _credit(address account, uint256 amount) internal {
        if (amount == 0) return;
        credits[account] += amount;
        totalCredits += amount;
        emit Credited(account, amount);
    }

    function _burn(uint256 amount) internal {
        if (amount == 0) return;
        totalBurnt += amount;
        emit Burnt(amount);
    }

    /// @inheritdoc IChallengeManager
    function withdrawCredits() external nonReentrant returns (uint256 amount) {
        amount = credits[msg.sender];
        if (amount == 0) revert NoCredits(msg.sender);
        credits[msg.sender] = 0;
        totalCredits -= amount;
        emit CreditWithdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    // ---- views --------------------------------------------------------------------------

    /// @inheritdoc IChallengeManager
    function bondsHeld() external view returns (uint256) {
        return address(this).balance - totalCredits - totalBurnt;
    }

    function _challenge(uint256 id) internal view returns (Challenge storage c) {
        c = _challenges[id];
        if (c.status == Status.None) revert UnknownChallenge(id);
    }

    /// @inheritdoc IChallengeManager
    function challenge(uint256 id) external view returns (Challenge memory) {
        return _challenges[id];
    }

    /// @inheritdoc IChallengeManager
    function committee(uint256 id) external view returns (Member[] memory) {
        return _members[id];
    }

    /// @inheritdoc IChallengeManager
    function vote(uint256 id, address voter) external view returns (Vote memory) {
        return _votes[id][voter];
    }

    /// @inheritdoc IChallengeManager
    function claim(uint256 id) external view returns (Claim memory) {
        return _claims[id];
    }
}
