// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IBatchRegistryTypes} from "../types/BatchRegistryTypes.sol";
import {IBatchRegistryErrors} from "../errors/BatchRegistryErrors.sol";
import {IStakeRegistry} from "./IStakeRegistry.sol";

/// @title IBatchRegistry
/// @notice Operators commit Merkle roots of receipt batches. The batch id is
///         keccak256(abi.encode(operator, root)); the DA pointer of the batch manifest lives only
///         in the event.
interface IBatchRegistry is IBatchRegistryTypes, IBatchRegistryErrors {
    /// @notice A batch was committed. `daPointer` is the `da://<backend>/0x<hex>` URI of the
    ///         batch manifest.
    ///         The batch id is keccak256(abi.encode(operator, root)); the commit time is the
    ///         block's timestamp.
    event BatchCommitted(address indexed operator, bytes32 indexed root, uint32 leafCount, string daPointer);

    /// @notice Source of operator status.
    function stakes() external view returns (IStakeRegistry);

    /// @notice The id of `operator`'s batch with `root`.
    function batchId(address operator, bytes32 root) external pure returns (bytes32);

    /// @notice Commits a batch root; the block timestamp opens its challenge window.
    /// @param root Merkle root of the batch's receipt digests (verinfer.receipts.merkle).
    /// @param leafCount Number of receipts (> 0).
    /// @param daPointer DA pointer of the batch manifest (event only).
    /// @return id The batch id.
    function commitBatch(bytes32 root, uint32 leafCount, string calldata daPointer) external returns (bytes32 id);

    /// @notice The stored record of a batch (committedAt 0 = unknown).
    function batch(bytes32 id) external view returns (Batch memory);

    /// @notice The stored record of `operator`'s batch with `root` (committedAt 0 = unknown).
    function batchOf(address operator, bytes32 root) external view returns (Batch memory);
}
