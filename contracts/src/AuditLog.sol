// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IAuditLog} from "./interfaces/IAuditLog.sol";
import {IStakeRegistry} from "./interfaces/IStakeRegistry.sol";

/// @title AuditLog
/// @notice The implementation of IAuditLog: an event per light audit, recorded only by
///         registered verifiers.
contract AuditLog is IAuditLog {
    /// @inheritdoc IAuditLog
    IStakeRegistry public immutable stakes;

    /// @param stakes_ Source of verifier status.
    constructor(IStakeRegistry stakes_) {
        stakes = stakes_;
    }

    /// @inheritdoc IAuditLog
    function recordAudit(bytes32 receiptDigest, bytes32 observedOutHash, bool matches, bytes32 reportHash) external {
        if (!stakes.isVerifier(msg.sender)) revert NotVerifier(msg.sender);
        emit AuditRecorded(receiptDigest, msg.sender, observedOutHash, matches, reportHash);
    }
}
