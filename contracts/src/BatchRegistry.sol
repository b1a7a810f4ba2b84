// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {StakeRegistry} from "./StakeRegistry.sol";

/// @title BatchRegistry
/// @notice Operators commit Merkle roots of receipt batches. One storage slot per batch keeps a
///         commit near 50k gas: the batch id is keccak256(abi.encode(operator, root)) so the root
///         need not be stored, and the DA pointer of the batch manifest lives only in the event.
contract BatchRegistry {
    /// @notice What is stored per batch (one slot). committedAt starts the challenge window.
    struct Batch {
        uint32 leafCount;
        uint64 committedAt;
        uint64 committedBlock;
    }

    StakeRegistry public immutable stakes;

    mapping(bytes32 => Batch) internal _batches;

    /// @notice A batch was committed. `daPointer` is the `da://<backend>/0x<hex>` URI of the
    ///         batch manifest.
    ///         The batch id is keccak256(abi.encode(operator, root)); the commit time is the
    ///         block's timestamp.
    event BatchCommitted(address indexed operator, bytes32 indexed root, uint32 leafCount, string daPointer);

    /// @notice Caller is not an operator with the minimum active stake.
    error NotActiveOperator(address caller);
    /// @notice Batches hold at least one receipt.
    error EmptyBatch(bytes32 root);
    /// @notice The zero root is reserved.
    error ZeroRoot();
    /// @notice This operator already committed this root.
    error BatchAlreadyCommitted(bytes32 batchId, address operator, bytes32 root);

    /// @param stakes_ Source of operator status.
    constructor(StakeRegistry stakes_) {
        stakes = stakes_;
    }

    /// @notice The id of `operator`'s batch with `root`.
    function batchId(address operator, bytes32 root) public pure returns (bytes32) {
        return keccak256(abi.encode(operator, root));
    }

    /// @notice Commits a batch root; the block timestamp opens its challenge window.
    /// @param root Merkle root of the batch's receipt digests (verinfer.receipts.merkle).
    /// @param leafCount Number of receipts (> 0).
    /// @param daPointer DA pointer of the batch manifest (event only).
    /// @return id The batch id.
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

    /// @notice The stored record of a batch (committedAt 0 = unknown).
    function batch(bytes32 id) external view returns (Batch memory) {
        return _batches[id];
    }

    /// @notice The stored record of `operator`'s batch with `root` (committedAt 0 = unknown).
    function batchOf(address operator, bytes32 root) external view returns (Batch memory) {
        return _batches[batchId(operator, root)];
    }
}
