// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title ReceiptLib
/// @notice The operator's signed receipt (EIP-712 primary type) and its struct hash. The field
///         order and types are fixed by the shared format in docs/contracts.md; any change breaks
///         every signature already issued.
library ReceiptLib {
    /// @dev Field for field the shared `Receipt` EIP-712 type.
    struct Receipt {
        uint16 version;
        address operator;
        uint256 chainId;
        bytes32 modelId;
        bytes32 engineFingerprintHash;
        bytes32 reqHash;
        bytes32 outHash;
        uint64 keyEpoch;
        bytes32 ciphertextHash;
        uint64 issuedAt;
    }

    /// @dev The only receipt version this deployment understands.
    uint16 internal constant VERSION = 1;

    bytes32 internal constant TYPEHASH = keccak256(
        "Receipt(uint16 version,address operator,uint256 chainId,bytes32 modelId,"
        "bytes32 engineFingerprintHash,bytes32 reqHash,bytes32 outHash,uint64 keyEpoch,"
        "bytes32 ciphertextHash,uint64 issuedAt)"
    );

    /// @notice EIP-712 struct hash: keccak256(TYPEHASH || each field ABI-encoded as one word).
    function structHash(Receipt calldata r) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                TYPEHASH,
                r.version,
                r.operator,
                r.chainId,
                r.modelId,
                r.engineFingerprintHash,
                r.reqHash,
                r.outHash,
                r.keyEpoch,
                r.ciphertextHash,
                r.issuedAt
            )
        );
    }

    /// @notice Same as `structHash` for a receipt held in memory (tests, off-chain tooling).
    function structHashMemory(Receipt memory r) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                TYPEHASH,
                r.version,
                r.operator,
                r.chainId,
                r.modelId,
                r.engineFingerprintHash,
                r.reqHash,
                r.outHash,
                r.keyEpoch,
                r.ciphertextHash,
                r.issuedAt
            )
        );
    }

    /// @notice The EIP-712 signing digest ("receipt id") under a given domain separator.
    function digest(bytes32 domainSeparator, bytes32 structHash_) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked(hex"1901", domainSeparator, structHash_));
    }
}
