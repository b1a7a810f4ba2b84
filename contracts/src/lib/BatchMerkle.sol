// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title BatchMerkle
/// @notice Merkle batches of receipt digests, exactly as `verinfer.receipts.merkle` builds them:
///         leaf = keccak256(0x00 || digest), node = keccak256(0x01 || left || right); a level with
///         an odd count promotes its last node unchanged. A proof is the sibling list bottom-up;
///         bit i of the leaf index says whether the node at level i is a right child. Because of
///         the promotion rule a level may have no sibling, so the verifier needs the leaf count.
library BatchMerkle {
    /// @notice The leaf hash of one receipt digest.
    function leafHash(bytes32 receiptDigest) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked(bytes1(0x00), receiptDigest));
    }

    /// @notice The inner node over two children.
    function nodeHash(bytes32 left, bytes32 right) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked(bytes1(0x01), left, right));
    }

    /// @notice Recomputes the root from a leaf digest and its proof.
    /// @return ok False when the proof shape does not fit `leafCount` (index out of range, too
    ///         few or too many siblings); `root` is meaningful only when ok.
    function computeRoot(
        bytes32 receiptDigest,
        uint256 index,
        uint256 leafCount,
        bytes32[] memory siblings
    ) internal pure returns (bool ok, bytes32 root) {
        if (leafCount == 0 || index >= leafCount) return (false, bytes32(0));
        bytes32 node = leafHash(receiptDigest);
        uint256 used = 0;
        uint256 n = leafCount;
        while (n > 1) {
            if (index & 1 == 1) {
                // A right child always has a left sibling.
                if (used == siblings.length) return (false, bytes32(0));
                node = nodeHash(siblings[used++], node);
            } else if (index + 1 < n) {
                if (used == siblings.length) return (false, bytes32(0));
                node = nodeHash(node, siblings[used++]);
            }
            // else: the last node of an odd level is promoted unchanged.
            index >>= 1;
            n = (n + 1) >> 1;
        }
        if (used != siblings.length) return (false, bytes32(0));
        return (true, node);
    }

    /// @notice True iff the proof places `receiptDigest` at `index` under `root`.
    function verify(
        bytes32 receiptDigest,
        uint256 index,
        uint256 leafCount,
        bytes32[] memory siblings,
        bytes32 root
    ) internal pure returns (bool) {
        (bool ok, bytes32 computed) = computeRoot(receiptDigest, index, leafCount, siblings);
        return ok && computed == root;
    }
}
