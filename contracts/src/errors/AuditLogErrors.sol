// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IAuditLogErrors
/// @notice The custom errors AuditLog reverts with.
interface IAuditLogErrors {
    /// @notice Only registered verifiers record audits.
    error NotVerifier(address caller);
}
