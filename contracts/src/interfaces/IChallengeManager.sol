// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IChallengeManagerTypes} from "../types/ChallengeManagerTypes.sol";
import {IChallengeManagerErrors} from "../errors/ChallengeManagerErrors.sol";
import {IProtocolConfig} from "./IProtocolConfig.sol";
import {IStakeRegistry} from "./IStakeRegistry.sol";
import {IBatchRegistry} from "./IBatchRegistry.sol";
import {ReceiptLib} from "../lib/ReceiptLib.sol";

/// @title IChallengeManager
/// @notice Disputes about operator receipts and their settlement:
///         - full challenges: receipt + signature + Merkle proof into a committed batch + bond,
///           a stake-weighted committee drawn from a later block hash, commit-reveal votes,
///           resolution by stake quorum τ (dismiss / slash / inconclusive);
///         - invalid receipts (model, engine fingerprint or key epoch not approved when issued):
///           slashed at once when challenged, no committee needed;
///         - unpublished claims (`claimUnpublished`): a signed receipt not shown to be in a batch
///           committed by its publication deadline; the operator must answer with an inclusion
///           proof in time or is slashed (Fault.Unpublished).
///         It is the EIP-712 verifying contract of receipts (domain "verinfer", version "1").
///         Payouts are credits withdrawn by their owners (pull payments). Burnt ETH stays in the
///         contract forever, counted in `totalBurnt`; no function can move it.
interface IChallengeManager is IChallengeManagerTypes, IChallengeManagerErrors {
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
    /// @notice A committee member did not reveal, or revealed against a decided quorum, and was
    ///         penalized.
    event MemberPenalized(uint256 indexed id, address indexed member, uint256 amount);
    /// @notice An unpublished claim was opened.
    event ClaimOpened(
        uint256 indexed id,
        bytes32 indexed receiptDigest,
        address indexed operator,
        address claimant,
        uint64 publishBy,
        uint64 responseDeadline
    );
    /// @notice The operator proved timely inclusion; the claim is dismissed. The proof is logged
    ///         in full (root, position, siblings bottom-up), so a batch whose manifest was never
    ///         published still shows where the receipt is.
    event ClaimAnswered(uint256 indexed id, bytes32 batchId, bytes32 batchRoot, uint256 leafIndex, bytes32[] siblings);
    /// @notice Nobody proved timely inclusion; the operator was slashed.
    event ClaimUpheld(uint256 indexed id, uint256 slashed);
    /// @notice A payout was credited.
    event Credited(address indexed account, uint256 amount);
    /// @notice Credits were withdrawn.
    event CreditWithdrawn(address indexed account, uint256 amount);
    /// @notice ETH was burnt (kept here forever).
    event Burnt(uint256 amount);

    // ---- wiring and accounting ----------------------------------------------------------

    /// @notice The vote a committee member reveals when the operator-provided evidence (DA
    ///         payload, decryption, request) cannot be obtained or does not match the receipt:
    ///         the operator is responsible for evidence availability, so this counts as a
    ///         revealed vote against the receipt (it adds to the best other outHash for the
    ///         slashing quorum) and is never a non-reveal. A receipt whose own outHash equals it
    ///         is invalid (slashed at open).
    function INVALID_EVIDENCE() external view returns (bytes32);

    /// @notice How far in the future (beyond the chain's clock) a receipt's issuedAt may be.
    ///         A receipt dated later than its batch's commit time + this, or later than now +
    ///         this when claimed, is itself invalid and is slashed at once.
    function MAX_CLOCK_SKEW() external view returns (uint64);

    /// @notice Parameters and allowlists.
    function config() external view returns (IProtocolConfig);

    /// @notice The stake registry (this contract is its challengeManager).
    function stakes() external view returns (IStakeRegistry);

    /// @notice The batch registry.
    function batches() external view returns (IBatchRegistry);

    /// @notice Number of challenges opened (ids are 1..challengeCount).
    function challengeCount() external view returns (uint256);

    /// @notice Number of unpublished claims opened (ids are 1..claimCount).
    function claimCount() external view returns (uint256);

    /// @notice Unclaimed payouts of `account`.
    function credits(address account) external view returns (uint256);

    /// @notice Sum of `credits`.
    function totalCredits() external view returns (uint256);

    /// @notice Slashed ETH not paid out to anyone; held here forever.
    function totalBurnt() external view returns (uint256);

    // ---- receipts -----------------------------------------------------------------------

    /// @notice The EIP-712 domain separator of receipts (this contract is verifyingContract).
    function domainSeparator() external view returns (bytes32);

    /// @notice The receipt id: the EIP-712 signing digest of `r`.
    function receiptDigest(ReceiptLib.Receipt calldata r) external view returns (bytes32);

    /// @notice The dispute state of a receipt.
    function receiptState(bytes32 digest) external view returns (ReceiptState memory);

    // ---- full challenges ----------------------------------------------------------------

    /// @notice Opens a full challenge against a receipt in a committed batch. msg.value must be
    ///         the challenge bond. A receipt whose model, engine fingerprint or key epoch was not
    ///         approved when issued, or whose engine fingerprint no declared verifier covered
    ///         then (StakeRegistry.isCoveredAt), is slashed at once (Fault.InvalidReceipt).
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
    ) external payable returns (uint256 id);

    /// @notice Draws the committee from blockhash(targetBlock), weighted by the verifiers' draw
    ///         weights as of the end of the challenge's open block (fixed before the randomness
    ///         existed: stake changes after the open cannot move the committee). Callable by
    ///         anyone once targetBlock is mined. If that hash is out of reach (older than 256
    ///         blocks) the target moves to a new future block instead. The challenger is
    ///         drawable like any verifier of the pool (excluding it could leave the committee
    ///         to a sybil in a small pool).
    /// @param id The challenge.
    function drawCommittee(uint256 id) external;

    /// @notice Commits a vote: keccak256(abi.encode(id, voter, outHash, salt)). Binding the voter
    ///         and the challenge id keeps anyone from copying another member's commitment.
    /// @param id The challenge.
    /// @param commitment The vote commitment.
    function commitVote(uint256 id, bytes32 commitment) external;

    /// @notice Reveals a committed vote. Opens after the commit deadline, or as soon as every
    ///         member has committed.
    /// @param id The challenge.
    /// @param outHash The outHash the member computed by re-execution.
    /// @param salt The salt used in the commitment.
    function revealVote(uint256 id, bytes32 outHash, bytes32 salt) external;

    /// @notice The commitment a member submits for `outHash` with `salt`.
    function voteCommitment(uint256 id, address voter, bytes32 outHash, bytes32 salt)
        external
        pure
        returns (bytes32);

    /// @notice Settles a challenge: after the reveal deadline (or once all members revealed);
    ///         or, if no committee was drawn within the draw period, as inconclusive.
    ///         Stake >= τ on the receipt's outHash dismisses (bond to that majority); stake >= τ on
    ///         another value slashes (α to the challenger with the bond back, β to that majority,
    ///         the rest burnt); otherwise inconclusive (bond back). Quorum is exact: weight·10000
    ///         >= τ·W in integers, or, in a committee of m >= 3 seats, weight·m >= (m - 1)·W (a
    ///         pool smaller than committeeSize must not let one seat block). τ, α and β are the
    ///         ones in force at the draw (a later setParams does not reach a drawn dispute; a
    ///         claim pays the α in force when it opened). Non-revealers lose the penalty in every outcome; so does a
    ///         revealer outvoted by a decided quorum (the receipt's outHash when Slashed; another
    ///         output, not INVALID_EVIDENCE, when Dismissed).
    /// @param id The challenge.
    function resolve(uint256 id) external;

    // ---- unpublished claims -------------------------------------------------------------

    /// @notice Claims that a signed receipt is unpublished: in no batch committed by its
    ///         publication deadline. Opens after issuedAt + publicationDeadline and until that
    ///         + claimWindow (then ClaimWindowClosed); msg.value must be
    ///         the challenge bond. The operator then has responsePeriod to prove inclusion in a
    ///         batch committed by that deadline. A live challenge on the same receipt does not
    ///         hold a claim off (nor the reverse). A receipt dated more than MAX_CLOCK_SKEW after
    ///         now is invalid on its face (its deadline would be out of reach): it is slashed at
    ///         once (Fault.InvalidReceipt).
    /// @param r The receipt as signed.
    /// @param signature The operator's signature.
    /// @return id The claim id.
    function claimUnpublished(ReceiptLib.Receipt calldata r, bytes calldata signature)
        external
        payable
        returns (uint256 id);

    /// @notice Answers an unpublished claim with an inclusion proof into a batch of the operator
    ///         committed no later than the publication deadline. The bond goes to the operator.
    /// @param id The claim.
    /// @param batchRoot Root of the batch holding the receipt.
    /// @param leafIndex Position of the receipt.
    /// @param siblings Merkle siblings bottom-up.
    function answerUnpublished(uint256 id, bytes32 batchRoot, uint256 leafIndex, bytes32[] calldata siblings)
        external;

    /// @notice Upholds an unanswered unpublished claim after the response period: the operator
    ///         is slashed (Fault.Unpublished; α to the claimant with the bond back, the rest
    ///         burnt).
    /// @param id The claim.
    function resolveUnpublished(uint256 id) external;

    // ---- payouts and views --------------------------------------------------------------

    /// @notice Sends the caller all its credits.
    /// @return amount Wei sent.
    function withdrawCredits() external returns (uint256 amount);

    /// @notice Bonds of live challenges and claims: balance - credits - burnt.
    function bondsHeld() external view returns (uint256);

    /// @notice The full challenge record.
    function challenge(uint256 id) external view returns (Challenge memory);

    /// @notice The committee of a challenge.
    function committee(uint256 id) external view returns (Member[] memory);

    /// @notice A member's vote record (value = commitment until revealed, then the outHash).
    function vote(uint256 id, address voter) external view returns (Vote memory);

    /// @notice The full unpublished-claim record.
    function claim(uint256 id) external view returns (Claim memory);
}
