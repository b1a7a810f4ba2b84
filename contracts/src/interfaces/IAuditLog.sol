// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IAuditLogErrors} from "../errors/AuditLogErrors.sol";
import {IStakeRegistry} from "./IStakeRegistry.sol";

/// @title IAuditLog
/// @notice Light audits: a registered verifier records the result of an off-chain re-execution.
///         Event only, no slashing; the transaction signature is the auditor's signature.
interface IAuditLog is IAuditLogErrors {
    /// @notice An audit result. `reportHash` commits to the auditor's full report (off chain).
    event AuditRecorded(
        bytes32 indexed receiptDigest, address indexed auditor, bytes32 observedOutHash, bool matches, bytes32 reportHash
    );

    /// @notice Source of verifier status.
    function stakes() external view returns (IStakeRegistry);

    /// @notice Records a light-audit result for a receipt. Only a verifier with active stake
    ///         (StakeRegistry.isVerifier: stake - unbonding >= minVerifierStake) may record.
    /// @param receiptDigest The audited receipt's EIP-712 digest.
    /// @param observedOutHash The outHash the auditor obtained by re-execution.
    /// @param matches Whether it equals the receipt's outHash.
    /// @param reportHash Hash of the auditor's report (e.g. sha256 of its JSON).
    function recordAudit(bytes32 receiptDigest, bytes32 observedOutHash, bool matches, bytes32 reportHash) external;
}
