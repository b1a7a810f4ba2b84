// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IBatchRegistryErrors
/// @notice The custom errors BatchRegistry reverts with.
interface IBatchRegistryErrors {
    /// @notice Caller is not an operator with the minimum active stake.
    error NotActiveOperator(address caller);
    /// @notice Batches hold at least one receipt.
    error EmptyBatch(bytes32 root);
    /// @notice The zero root is reserved.
    error ZeroRoot();
    /// @notice This operator already committed this root.
    error BatchAlreadyCommitted(bytes32 batchId, address operator, bytes32 root);
}
