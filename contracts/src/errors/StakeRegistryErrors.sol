// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IStakeRegistryTypes} from "../types/StakeRegistryTypes.sol";

/// @title IStakeRegistryErrors
/// @notice The custom errors StakeRegistry reverts with.
interface IStakeRegistryErrors {
    /// @notice An amount does not fit the 112-bit stake fields.
    error AmountTooLarge(uint256 amount);
    /// @notice The address is already registered.
    error AlreadyRegistered(address account, IStakeRegistryTypes.Role role);
    /// @notice Role None cannot be registered.
    error InvalidRole(IStakeRegistryTypes.Role role);
    /// @notice The bond is below the role's minimum.
    error StakeBelowMinimum(IStakeRegistryTypes.Role role, uint256 amount, uint256 minimum);
    /// @notice The address is not registered.
    error NotRegistered(address account);
    /// @notice Zero amount.
    error ZeroAmount();
    /// @notice More than the bonded, not yet unbonding stake was asked for.
    error UnbondExceedsStake(address account, uint256 requested, uint256 available);
    /// @notice Unbonding has not matured.
    error UnbondingNotReady(address account, uint64 readyAt, uint256 nowTs);
    /// @notice Nothing can be withdrawn (nothing unbonding, or all of it held by liabilities).
    error NothingToWithdraw(address account, uint256 unbonding, uint256 locked);
    /// @notice Caller is not the ChallengeManager.
    error NotChallengeManager(address caller);
    /// @notice The ChallengeManager is already set.
    error ChallengeManagerAlreadySet(address current);
    /// @notice Unlock or slash of more than is locked.
    error ExceedsLocked(address account, uint256 amount, uint256 locked);
    /// @notice Every draw-tree slot is held by a verifier with weight > 0.
    error TooManyVerifiers(uint256 max);
    /// @notice A draw may only read a block that is already final (before the current one).
    error SnapshotNotFinal(uint256 snapshotBlock, uint256 blockNumber);
    /// @notice Only a registered verifier may declare fingerprints.
    error NotVerifier(address account);
    /// @notice The fingerprint hash is not an approved engine fingerprint now.
    error FingerprintNotApproved(bytes32 fingerprint);
    /// @notice The model of a declaration is not an approved model.
    error ModelNotApproved(bytes32 modelId);
    /// @notice The verifier already declared this fingerprint (and is not leaving it).
    error AlreadyDeclared(address account, bytes32 fingerprint);
    /// @notice The verifier has not declared this fingerprint.
    error NotDeclared(address account, bytes32 fingerprint);
    /// @notice The verifier already declared MAX_DECLARATIONS fingerprints.
    error TooManyDeclarations(address account, uint256 max);
    /// @notice The undeclaration was already requested; it takes effect at `leaveAt`.
    error AlreadyLeaving(address account, bytes32 fingerprint, uint64 leaveAt);
    /// @notice The undeclaration is not due (leaveAt 0: never requested).
    error UndeclareNotReady(address account, bytes32 fingerprint, uint64 leaveAt, uint256 nowTs);
    /// @notice A verifier with declarations would go below the verifier minimum.
    error DeclaredVerifierBelowMinimum(address account, uint256 declarations, uint256 activeAfter, uint256 minimum);
    /// @notice The constructor's minimum coverage share exceeds 100% (`max` basis points).
    error MinCoverageBpsTooLarge(uint256 bps, uint256 max);
    /// @notice An ETH transfer failed.
    error TransferFailed(address to, uint256 amount);
}
