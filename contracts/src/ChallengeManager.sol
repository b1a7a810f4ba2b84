// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ProtocolConfig} from "./ProtocolConfig.sol";
import {StakeRegistry} from "./StakeRegistry.sol";
import {BatchRegistry} from "./BatchRegistry.sol";
import {ReceiptLib} from "./lib/ReceiptLib.sol";
import {BatchMerkle} from "./lib/BatchMerkle.sol";

/// @title ChallengeManager
/// @notice Disputes about operator receipts and their settlement:
///         - full challenges: receipt + signature + Merkle proof into a committed batch + bond,
///           a stake-weighted committee drawn from a later block hash, commit-reveal votes,
///           resolution by stake quorum τ (dismiss / slash / inconclusive);
///         - invalid receipts (model, engine fingerprint or key epoch not approved when issued):
///           slashed at once when challenged, no committee needed;
///         - withholding claims: a signed receipt not shown to be in a batch committed by its
///           publication deadline; the operator must answer with an inclusion proof in time.
///         It is the EIP-712 verifying contract of receipts (domain "verinfer", version "1").
///         Payouts are credits withdrawn by their owners (pull payments). Burnt ETH stays in this
///         contract forever, counted in `totalBurnt`; no function can move it.
contract ChallengeManager is EIP712, ReentrancyGuard {
    using SafeCast for uint256;

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

    /// @notice Why an operator was slashed.
    enum Fault {
        Reexecution,
        InvalidReceipt,
        Withholding
    }

    /// @notice Life cycle of a withholding claim.
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

    /// @notice One withholding claim.
    struct Claim {
        bytes32 receiptDigest;
        address operator;
        uint64 responseDeadline;
        ClaimStatus status;
        address claimant;
        uint96 bond;
        uint64 publishBy; // issuedAt + publicationDeadline
        uint128 lockedStake;
    }

    /// @notice Per receipt: the live challenge and the live claim (0 = none; they are
    ///         independent, so neither can hold off the other), whether stake was ever taken for
    ///         its content (re-execution fault or invalid receipt: `slashed`) and whether stake
    ///         was ever taken for withholding it (`withholdingSlashed`). A flag is set only when
    ///         stake was actually taken.
    struct ReceiptState {
        uint64 liveChallenge;
        uint64 liveClaim;
        bool slashed;
        bool withholdingSlashed;
    }

    uint256 internal constant BPS = 10_000;

    /// @notice The vote a committee member reveals when the operator-provided evidence (DA
    ///         payload, decryption, request) cannot be obtained or does not match the receipt:
    ///         the operator is responsible for evidence availability, so this counts as a
    ///         revealed vote against the receipt (it adds to the best other outHash for the
    ///         slashing quorum) and is never a non-reveal. A receipt whose own outHash equals it
    ///         is invalid (slashed at open).
    bytes32 public constant INVALID_EVIDENCE = keccak256("verinfer.vote.invalid-evidence");

    /// @notice How far in the future (beyond the chain's clock) a receipt's issuedAt may be.
    ///         A receipt dated later than its batch's commit time + this, or later than now +
    ///         this when claimed, is itself invalid and is slashed at once.
    uint64 public constant MAX_CLOCK_SKEW = 5 minutes;

    ProtocolConfig public immutable config;
    StakeRegistry public immutable stakes;
    BatchRegistry public immutable batches;

    /// @notice Number of challenges opened (ids are 1..challengeCount).
    uint256 public challengeCount;
    /// @notice Number of withholding claims opened (ids are 1..claimCount).
    uint256 public claimCount;
    /// @notice Unclaimed payouts per account.
    mapping(address => uint256) public credits;
    /// @notice Sum of `credits`.
    uint256 public totalCredits;
    /// @notice Slashed ETH not paid out to anyone; held here forever.
    uint256 public totalBurnt;

    mapping(uint256 => Challenge) internal _challenges;

    mapping(uint256 => Member[]) internal _members;
    mapping(uint256 => mapping(address => Vote)) internal _votes;
    mapping(uint256 => Claim) internal _claims;
    mapping(bytes32 => ReceiptState) internal _receipts;

    // ---- events -------------------------------------------------------------------------

    /// @notice A full challenge was opened; the committee is drawn from blockhash(targetBlock).
    event ChallengeOpened(
        uint256 indexed id,
        bytes32 indexed receiptDigest,
        address indexed operator,
        address challenger,
        bytes32 batchId,
        uint256 bond,
        uint40 targetBlock
    );
    /// @notice The target block hash was out of reach (>256 blocks); a new target was set.
    event DrawRearmed(uint256 indexed id, uint40 oldTargetBlock, uint40 newTargetBlock);
    /// @notice The committee was drawn.
    event CommitteeDrawn(
        uint256 indexed id, address[] members, uint256[] weights, uint64 commitDeadline, uint64 revealDeadline
    );
    /// @notice A member committed to a vote.
    event VoteCommitted(uint256 indexed id, address indexed voter, bytes32 commitment);
    /// @notice A member revealed its vote (its own outHash).
    event VoteRevealed(uint256 indexed id, address indexed voter, bytes32 outHash);
    /// @notice A challenge ended.
    event ChallengeResolved(uint256 indexed id, Status status, bytes32 majorityOutHash, uint256 slashed);
    /// @notice An operator was slashed for a receipt.
    event OperatorSlashed(
        address indexed operator, bytes32 indexed receiptDigest, Fault fault, uint256 amount, uint256 disputeId
    );
    /// @notice A committee member did not reveal and was penalized.
    event MemberPenalized(uint256 indexed id, address indexed member, uint256 amount);
    /// @notice A withholding claim was opened.
    event ClaimOpened(
        uint256 indexed id,
        bytes32 indexed receiptDigest,
        address indexed operator,
        address claimant,
        uint64 publishBy,
        uint64 responseDeadline
    );
    /// @notice The operator proved timely inclusion; the claim is dismissed.
    event ClaimAnswered(uint256 indexed id, bytes32 batchId);
    /// @notice Nobody proved timely inclusion; the operator was slashed.
    event ClaimUpheld(uint256 indexed id, uint256 slashed);
    /// @notice A payout was credited.
    event Credited(address indexed account, uint256 amount);
    /// @notice Credits were withdrawn.
    event CreditWithdrawn(address indexed account, uint256 amount);
    /// @notice ETH was burnt (kept here forever).
    event Burnt(uint256 amount);

    // ---- errors -------------------------------------------------------------------------

    /// @notice Receipt version is not 1.
    error UnsupportedReceiptVersion(uint16 version);
    /// @notice The receipt names another chain.
    error WrongChainId(uint256 receiptChainId, uint256 chainId);
    /// @notice The signature does not parse or has a high s.
    error InvalidSignature(bytes32 receiptDigest);
    /// @notice The signature is valid but not by the receipt's operator.
    error SignerMismatch(address operator, address recovered);
    /// @notice The receipt's operator is not registered as an operator.
    error NotOperator(address account);
    /// @notice msg.value differs from the challenge bond.
    error WrongBond(uint256 sent, uint256 required);
    /// @notice No batch of this operator has this root.
    error BatchNotFound(address operator, bytes32 root);
    /// @notice The Merkle proof does not place the receipt in the batch.
    error InvalidMerkleProof(bytes32 batchId, bytes32 receiptDigest, uint256 leafIndex);
    /// @notice The batch's challenge window has passed.
    error ChallengeWindowClosed(bytes32 batchId, uint256 deadline, uint256 nowTs);
    /// @notice Stake was already taken once for this receipt (for this kind of fault).
    error ReceiptAlreadySlashed(bytes32 receiptDigest);
    /// @notice A challenge (for openChallenge) or a claim (for claimUnpublished) about this
    ///         receipt is still live.
    error DisputeAlreadyLive(bytes32 receiptDigest, uint64 challengeId, uint64 claimId);
    /// @notice No such challenge.
    error UnknownChallenge(uint256 id);
    /// @notice The challenge is not in the status this call needs.
    error WrongStatus(uint256 id, Status status, Status expected);
    /// @notice The randomness block has not been mined yet.
    error DrawTooEarly(uint256 id, uint40 targetBlock, uint256 blockNumber);
    /// @notice The draw period ended; resolve the challenge as inconclusive.
    error DrawPeriodOver(uint256 id, uint256 deadline, uint256 nowTs);
    /// @notice The caller is not on the committee.
    error NotCommitteeMember(uint256 id, address caller);
    /// @notice The member already committed.
    error AlreadyCommitted(uint256 id, address voter);
    /// @notice Commitments cannot be zero.
    error ZeroCommitment();
    /// @notice Commit phase is over.
    error CommitPhaseOver(uint256 id, uint64 deadline, uint256 nowTs);
    /// @notice Reveals open after the commit deadline or once every member committed.
    error RevealPhaseNotOpen(uint256 id, uint64 commitDeadline, uint256 nowTs);
    /// @notice Reveal phase is over.
    error RevealPhaseOver(uint256 id, uint64 deadline, uint256 nowTs);
    /// @notice The member never committed.
    error NotCommitted(uint256 id, address voter);
    /// @notice The member already revealed.
    error AlreadyRevealed(uint256 id, address voter);
    /// @notice keccak256(abi.encode(id, voter, outHash, salt)) differs from the commitment.
    error RevealMismatch(uint256 id, address voter, bytes32 commitment, bytes32 computed);
    /// @notice The challenge cannot be resolved yet.
    error TooEarlyToResolve(uint256 id, uint256 deadline, uint256 nowTs);
    /// @notice The receipt's publication deadline has not passed yet.
    error PublicationDeadlineNotPassed(bytes32 receiptDigest, uint256 publishBy, uint256 nowTs);
    /// @notice No such claim, or not open.
    error ClaimNotOpen(uint256 id, ClaimStatus status);
    /// @notice The operator's response period is over.
    error ResponsePeriodOver(uint256 id, uint64 deadline, uint256 nowTs);
    /// @notice The operator's response period is still running.
    error ResponsePeriodNotOver(uint256 id, uint64 deadline, uint256 nowTs);
    /// @notice The batch was committed after the receipt's publication deadline.
    error BatchCommittedLate(bytes32 batchId, uint64 committedAt, uint64 publishBy);
    /// @notice ETH arrived from somewhere other than the StakeRegistry.
    error UnexpectedEther(address from);
    /// @notice No credits to withdraw.
    error NoCredits(address account);
    /// @notice An ETH transfer failed.
    error TransferFailed(address to, uint256 amount);

    /// @param config_ Parameters and allowlists.
    /// @param stakes_ The stake registry (this contract must be its challengeManager).
    /// @param batches_ The batch registry.
    constructor(ProtocolConfig config_, StakeRegistry stakes_, BatchRegistry batches_) EIP712("verinfer", "1") {
        config = config_;
        stakes = stakes_;
        batches = batches_;
    }

    /// @notice Receives slashed stake from the StakeRegistry only.
    receive() external payable {
        if (msg.sender != address(stakes)) revert UnexpectedEther(msg.sender);
    }

    // ---- receipts -----------------------------------------------------------------------

    /// @notice The EIP-712 domain separator of receipts (this contract is verifyingContract).
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /// @notice The receipt id: the EIP-712 signing digest of `r`.
    function receiptDigest(ReceiptLib.Receipt calldata r) public view returns (bytes32) {
        return _hashTypedDataV4(ReceiptLib.structHash(r));
    }

    /// @notice The dispute state of a receipt.
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
    ///      content. A live withholding claim does not hold a challenge off.
    function _checkChallengeable(bytes32 digest) internal view returns (ReceiptState storage rs) {
        rs = _receipts[digest];
        // INVARIANT: no receipt is slashed twice for its content.
        if (rs.slashed) revert ReceiptAlreadySlashed(digest);
        if (rs.liveChallenge != 0) revert DisputeAlreadyLive(digest, rs.liveChallenge, rs.liveClaim);
    }

    // ---- full challenges ----------------------------------------------------------------

    /// @notice Opens a full challenge against a receipt in a committed batch. msg.value must be
    ///         the challenge bond. A receipt whose model, engine fingerprint or key epoch was not
    ///         approved when issued is slashed at once (Fault.InvalidReceipt).
    /// @param r The receipt as signed.
    /// @param signature 65-byte r||s||v operator signature over the EIP-712 digest.
    /// @param batchRoot Root of the operator's batch holding the receipt.
    /// @param leafIndex Position of the receipt in the batch.
    /// @param siblings Merkle siblings bottom-up.
    /// @return id The challenge id.
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
        ProtocolConfig.OpenParams memory p = config.openParams();
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

    /// @dev Model, engine fingerprint and key epoch approved when the receipt was issued.
    function _configValid(ReceiptLib.Receipt calldata r) internal view returns (bool) {
        return config.isReceiptConfigValid(r.modelId, r.engineFingerprintHash, r.keyEpoch, r.issuedAt);
    }

    function _storeChallenge(
        ReceiptLib.Receipt calldata r,
        bytes32 digest,
        bytes32 bid,
        ProtocolConfig.OpenParams memory p
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
        BatchRegistry.Batch memory b = batches.batch(bid);
        committedAt = b.committedAt;
        if (b.committedAt == 0) revert BatchNotFound(operator, root);
        // INVARIANT: a challenge opens only inside the batch's window.
        uint256 deadline = uint256(b.committedAt) + window;
        if (block.timestamp > deadline) revert ChallengeWindowClosed(bid, deadline, block.timestamp);
        if (!BatchMerkle.verify(digest, leafIndex, b.leafCount, siblings, root)) {
            revert InvalidMerkleProof(bid, digest, leafIndex);
        }
    }

    /// @notice Draws the committee from blockhash(targetBlock), weighted by the verifiers' draw
    ///         weights as of the end of the challenge's open block (fixed before the randomness
    ///         existed: stake changes after the open cannot move the committee). Callable by
    ///         anyone once targetBlock is mined. If that hash is out of reach (older than 256
    ///         blocks) the target moves to a new future block instead.
    /// @param id The challenge.
    function drawCommittee(uint256 id) external {
        Challenge storage c = _challenge(id);
        if (c.status != Status.AwaitingDraw) revert WrongStatus(id, c.status, Status.AwaitingDraw);
        ProtocolConfig.Params memory p = config.params();
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
        // INVARIANT: membership depends only on the seed and the weights at snapshotBlock.
        (address[] memory chosen, uint256[] memory weights, uint256 total) =
            stakes.drawCommittee(keccak256(abi.encode(bh, id)), c.snapshotBlock, p.committeeSize, c.challenger);
        if (chosen.length == 0) {
            _finishWithoutCommittee(id, c);
            return;
        }
        c.status = Status.Voting;
        c.members = uint16(chosen.length);
        c.totalWeight = total.toUint112();
        c.memberPenalty = p.nonRevealPenalty;
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

    /// @notice Commits a vote: keccak256(abi.encode(id, voter, outHash, salt)). Binding the voter
    ///         and the challenge id keeps anyone from copying another member's commitment.
    /// @param id The challenge.
    /// @param commitment The vote commitment.
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

    /// @notice Reveals a committed vote. Opens after the commit deadline, or as soon as every
    ///         member has committed.
    /// @param id The challenge.
    /// @param outHash The outHash the member computed by re-execution.
    /// @param salt The salt used in the commitment.
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

    /// @notice The commitment a member submits for `outHash` with `salt`.
    function voteCommitment(uint256 id, address voter, bytes32 outHash, bytes32 salt)
        public
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(id, voter, outHash, salt));
    }

    /// @notice Settles a challenge: after the reveal deadline (or once all members revealed);
    ///         or, if no committee was drawn within the draw period, as inconclusive.
    ///         Stake >= τ on the receipt's outHash dismisses (bond to that majority); stake >= τ on
    ///         another value slashes (α to the challenger with the bond back, β to that majority,
    ///         the rest burnt); otherwise inconclusive (bond back). Non-revealers lose the penalty.
    /// @param id The challenge.
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
        ProtocolConfig.Params memory p = config.params();
        (uint256 receiptWeight, bytes32 alt, uint256 altWeight, uint256 invalidWeight) = _tally(id, c.receiptOutHash);
        _settleMembers(id, c.memberPenalty);

        uint256 quorum = uint256(p.quorumBps) * c.totalWeight;
        ReceiptState storage rs = _receipts[c.receiptDigest];
        rs.liveChallenge = 0;
        if (receiptWeight * BPS >= quorum) {
            c.status = Status.Dismissed;
            c.majorityOutHash = c.receiptOutHash;
            stakes.unlock(c.operator, c.lockedStake);
            _payMajority(id, c.receiptOutHash, bytes32(0), receiptWeight, c.bond);
            emit ChallengeResolved(id, Status.Dismissed, c.receiptOutHash, 0);
        } else if ((altWeight + invalidWeight) * BPS >= quorum) {
            // Against the receipt: the best other output plus "evidence unavailable/invalid"
            // (the operator answers for its evidence). The recorded value is the larger part.
            bytes32 verdict = altWeight >= invalidWeight ? alt : INVALID_EVIDENCE;
            c.status = Status.Slashed;
            c.majorityOutHash = verdict;
            uint256 slashed = _slashOperator(c.operator, c.lockedStake, c.receiptDigest, Fault.Reexecution, id);
            // INVARIANT: a receipt is marked slashed only when stake was taken.
            if (slashed != 0) rs.slashed = true;
            uint256 toChallenger = _payChallenger(c.challenger, c.bond, slashed, p.challengerRewardBps);
            uint256 pool = (slashed * p.majorityRewardBps) / BPS;
            _payMajority(id, alt, INVALID_EVIDENCE, altWeight + invalidWeight, pool);
            _burn(slashed - toChallenger - pool);
            emit ChallengeResolved(id, Status.Slashed, verdict, slashed);
        } else {
            c.status = Status.Inconclusive;
            stakes.unlock(c.operator, c.lockedStake);
            _credit(c.challenger, c.bond);
            emit ChallengeResolved(id, Status.Inconclusive, bytes32(0), 0);
        }
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

    /// @dev Releases revealers' penalty locks and slashes non-revealers (penalty burnt).
    function _settleMembers(uint256 id, uint256 penalty) internal {
        Member[] storage ms = _members[id];
        for (uint256 i = 0; i < ms.length; i++) {
            address m = ms[i].account;
            if (_votes[id][m].state == VoteState.Revealed) {
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

    // ---- withholding claims -------------------------------------------------------------

    /// @notice Claims that a signed receipt was not published in time. Opens after
    ///         issuedAt + publicationDeadline; msg.value must be the challenge bond. The operator
    ///         then has responsePeriod to prove inclusion in a batch committed by that deadline.
    ///         A live challenge on the same receipt does not hold a claim off (nor the reverse).
    ///         A receipt dated more than MAX_CLOCK_SKEW after now is invalid on its face (its
    ///         deadline would be out of reach): it is slashed at once (Fault.InvalidReceipt).
    /// @param r The receipt as signed.
    /// @param signature The operator's signature.
    /// @return id The claim id.
    function claimUnpublished(ReceiptLib.Receipt calldata r, bytes calldata signature)
        external
        payable
        nonReentrant
        returns (uint256 id)
    {
        bytes32 digest = _verifyReceipt(r, signature, true);
        ReceiptState storage rs = _receipts[digest];
        ProtocolConfig.Params memory p = config.params();
        if (msg.value != p.challengeBond) revert WrongBond(msg.value, p.challengeBond);
        // All in uint256: issuedAt = 2^64 - 1 cannot overflow anything.
        bool futureDated = uint256(r.issuedAt) > block.timestamp + MAX_CLOCK_SKEW;
        if (futureDated) {
            if (rs.slashed) revert ReceiptAlreadySlashed(digest);
        } else {
            if (rs.withholdingSlashed) revert ReceiptAlreadySlashed(digest);
            if (rs.liveClaim != 0) revert DisputeAlreadyLive(digest, rs.liveChallenge, rs.liveClaim);
        }
        uint256 publishBy = futureDated ? block.timestamp : uint256(r.issuedAt) + p.publicationDeadline;
        if (!futureDated && block.timestamp <= publishBy) {
            revert PublicationDeadlineNotPassed(digest, publishBy, block.timestamp);
        }
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

    /// @notice Answers a withholding claim with an inclusion proof into a batch of the operator
    ///         committed no later than the publication deadline. The bond goes to the operator.
    /// @param id The claim.
    /// @param batchRoot Root of the batch holding the receipt.
    /// @param leafIndex Position of the receipt.
    /// @param siblings Merkle siblings bottom-up.
    function answerUnpublished(uint256 id, bytes32 batchRoot, uint256 leafIndex, bytes32[] calldata siblings)
        external
    {
        Claim storage cl = _claims[id];
        if (cl.status != ClaimStatus.Open) revert ClaimNotOpen(id, cl.status);
        if (block.timestamp > cl.responseDeadline) {
            revert ResponsePeriodOver(id, cl.responseDeadline, block.timestamp);
        }
        bytes32 bid = batches.batchId(cl.operator, batchRoot);
        BatchRegistry.Batch memory b = batches.batch(bid);
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
        emit ClaimAnswered(id, bid);
    }

    /// @notice Upholds an unanswered withholding claim after the response period: the operator
    ///         is slashed (α to the claimant with the bond back, the rest burnt).
    /// @param id The claim.
    function resolveUnpublished(uint256 id) external nonReentrant {
        Claim storage cl = _claims[id];
        if (cl.status != ClaimStatus.Open) revert ClaimNotOpen(id, cl.status);
        if (block.timestamp <= cl.responseDeadline) {
            revert ResponsePeriodNotOver(id, cl.responseDeadline, block.timestamp);
        }
        cl.status = ClaimStatus.Slashed;
        ReceiptState storage rs = _receipts[cl.receiptDigest];
        rs.liveClaim = 0;
        uint256 slashed = _slashOperator(cl.operator, cl.lockedStake, cl.receiptDigest, Fault.Withholding, id);
        // INVARIANT: a receipt is marked slashed only when stake was taken.
        if (slashed != 0) rs.withholdingSlashed = true;
        uint256 toClaimant = _payChallenger(cl.claimant, cl.bond, slashed, config.params().challengerRewardBps);
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

    /// @notice Sends the caller all its credits.
    /// @return amount Wei sent.
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

    /// @notice Bonds of live challenges and claims: balance - credits - burnt.
    function bondsHeld() external view returns (uint256) {
        return address(this).balance - totalCredits - totalBurnt;
    }

    function _challenge(uint256 id) internal view returns (Challenge storage c) {
        c = _challenges[id];
        if (c.status == Status.None) revert UnknownChallenge(id);
    }

    /// @notice The full challenge record.
    function challenge(uint256 id) external view returns (Challenge memory) {
        return _challenges[id];
    }

    /// @notice The committee of a challenge.
    function committee(uint256 id) external view returns (Member[] memory) {
        return _members[id];
    }

    /// @notice A member's vote record (value = commitment until revealed, then the outHash).
    function vote(uint256 id, address voter) external view returns (Vote memory) {
        return _votes[id][voter];
    }

    /// @notice The full withholding-claim record.
    function claim(uint256 id) external view returns (Claim memory) {
        return _claims[id];
    }
}
