// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IBatchRegistryTypes
/// @notice The structs of the BatchRegistry ABI.
interface IBatchRegistryTypes {
    /// @notice What is stored per batch (one slot). committedAt starts the challenge window.
    struct Batch {
        uint32 leafCount;
        uint64 committedAt;
        uint64 committedBlock;
    }
}
