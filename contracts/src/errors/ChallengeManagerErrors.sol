// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IChallengeManagerTypes} from "../types/ChallengeManagerTypes.sol";

/// @title IChallengeManagerErrors
/// @notice The custom errors ChallengeManager reverts with (verinfer.chain.artifacts decodes
///         them from the ABI by selector).
interface IChallengeManagerErrors {
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
    error WrongStatus(uint256 id, IChallengeManagerTypes.Status status, IChallengeManagerTypes.Status expected);
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
    /// @notice The claim window (publication deadline + claimWindow) of the receipt has passed.
    error ClaimWindowClosed(bytes32 receiptDigest, uint256 deadline, uint256 nowTs);
    /// @notice No such claim, or not open.
    error ClaimNotOpen(uint256 id, IChallengeManagerTypes.ClaimStatus status);
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
}
