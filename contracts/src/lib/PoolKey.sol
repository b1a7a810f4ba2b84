// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title PoolKey
/// @notice The key of a verifier draw pool and of its coverage: one per (engine fingerprint,
///         model) pair. The own-engine fingerprint is the same for every model, so a pool keyed
///         by fingerprint alone would draw verifiers holding model A to judge a receipt of
///         model B (they abstain: Inconclusive, honest members penalised, fraud never slashed).
///         Mirrored in Python by verinfer.chain.structs.pool_key.
library PoolKey {
    /// @notice keccak256(abi.encode(fingerprintHash, modelId)).
    function key(bytes32 fingerprintHash, bytes32 modelId) internal pure returns (bytes32) {
        return keccak256(abi.encode(fingerprintHash, modelId));
    }
}
