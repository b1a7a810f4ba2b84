// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IBatchRegistry} from "./interfaces/IBatchRegistry.sol";
import {IStakeRegistry} from "./interfaces/IStakeRegistry.sol";

/// @title BatchRegistry
/// @notice The implementation of IBatchRegistry. One storage slot per batch keeps a commit near
///         50k gas: the batch id is keccak256(abi.encode(operator, root)) so the root need not be
///         stored, and the DA pointer of the batch manifest lives only in the event.
contract BatchRegistry is IBatchRegistry {
    /// @inheritdoc IBatchRegistry
    IStakeRegistry public immutable stakes;

    mapping(bytes32 => Batch) internal _batches;

    /// @param stakes_ Source of operator status.
    constructor(IStakeRegistry stakes_) {
        stakes = stakes_;
    }

    /// @inheritdoc IBatchRegistry
    function batchId(address operator, bytes32 root) public pure returns (bytes32) {
        return keccak256(abi.encode(operator, root));
    }

    /// @inheritdoc IBatchRegistry
    function commitBatch(bytes32 root, uint32 leafCount, string calldata daPointer) external returns (bytes32 id) {
        if (root == bytes32(0)) revert ZeroRoot();
        if (leafCount == 0) revert EmptyBatch(root);
        id = batchId(msg.sender, root);
        Batch storage b = _batches[id];
        // INVARIANT: a committed batch is never rewritten, so its window cannot be restarted.
        if (b.committedAt != 0) revert BatchAlreadyCommitted(id, msg.sender, root);
        if (!stakes.isActiveOperator(msg.sender)) revert NotActiveOperator(msg.sender);
        _batches[id] = Batch(leafCount, uint64(block.timestamp), uint64(block.number));
        emit BatchCommitted(msg.sender, root, leafCount, daPointer);
    }

    /// @inheritdoc IBatchRegistry
    function batch(bytes32 id) external view returns (Batch memory) {
        return _batches[id];
    }

    /// @inheritdoc IBatchRegistry
    function batchOf(address operator, bytes32 root) external view returns (Batch memory) {
        return _batches[batchId(operator, root)];
    }
}
