// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Test} from "./utils/Test.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {BatchMerkle} from "../src/lib/BatchMerkle.sol";
import {ChallengeManager} from "../src/ChallengeManager.sol";
import {ProtocolConfig} from "../src/ProtocolConfig.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {BatchRegistry} from "../src/BatchRegistry.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";

/// @dev Exposes the calldata struct hash so the vectors exercise the exact on-chain code path.
contract ReceiptHasher {
    function structHash(ReceiptLib.Receipt calldata r) external pure returns (bytes32) {
        return ReceiptLib.structHash(r);
    }
}

/// @dev The shared vectors (tests/vectors/*.json, written by verinfer.receipts.vectors) must give
///      the same EIP-712 hashes, signers and Merkle roots in Solidity as in Python.
contract SharedVectorsTest is Test {
    string internal receiptsJson;
    string internal merkleJson;
    ReceiptHasher internal hasher;

    function setUp() public {
        receiptsJson = vm.readFile("../tests/vectors/receipts.json");
        merkleJson = vm.readFile("../tests/vectors/merkle.json");
        hasher = new ReceiptHasher();
    }

    function _key(uint256 i, string memory field) internal pure returns (string memory) {
        return string.concat(".cases[", _u(i), "].", field);
    }

    function _u(uint256 x) internal pure returns (string memory) {
        if (x == 0) return "0";
        bytes memory b;
        while (x != 0) {
            b = abi.encodePacked(bytes1(uint8(48 + (x % 10))), b);
            x /= 10;
        }
        return string(b);
    }

    function _load(uint256 i) internal view returns (ReceiptLib.Receipt memory r) {
        string memory j = receiptsJson;
        r.version = uint16(vm.parseJsonUint(j, _key(i, "version")));
        r.operator = vm.parseJsonAddress(j, _key(i, "operator"));
        r.chainId = vm.parseJsonUint(j, _key(i, "chainId"));
        r.modelId = vm.parseJsonBytes32(j, _key(i, "modelId"));
        r.engineFingerprintHash = vm.parseJsonBytes32(j, _key(i, "engineFingerprintHash"));
        r.reqHash = vm.parseJsonBytes32(j, _key(i, "reqHash"));
        r.outHash = vm.parseJsonBytes32(j, _key(i, "outHash"));
        r.keyEpoch = uint64(vm.parseJsonUint(j, _key(i, "keyEpoch")));
        r.ciphertextHash = vm.parseJsonBytes32(j, _key(i, "ciphertextHash"));
        r.issuedAt = uint64(vm.parseJsonUint(j, _key(i, "issuedAt")));
    }

    function _domainSeparator(uint256 chainId, address verifyingContract) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("verinfer"),
                keccak256("1"),
                chainId,
                verifyingContract
            )
        );
    }

    function test_receiptTypeHash_matchesVectors_succeeds() public view {
        vm.assertEq(ReceiptLib.TYPEHASH, vm.parseJsonBytes32(receiptsJson, ".receiptTypeHash"));
        vm.assertEq(
            keccak256(bytes(vm.parseJsonString(receiptsJson, ".receiptType"))), ReceiptLib.TYPEHASH, "type string"
        );
    }

    function test_receiptDigest_matchesVectors_succeeds() public view {
        uint256 n = vm.parseJsonUint(receiptsJson, ".count");
        vm.assertGe(n, 1, "at least one case");
        for (uint256 i = 0; i < n; i++) {
            ReceiptLib.Receipt memory r = _load(i);
            bytes32 sh = hasher.structHash(r);
            vm.assertEq(sh, vm.parseJsonBytes32(receiptsJson, _key(i, "structHash")), "structHash");
            bytes32 ds = _domainSeparator(r.chainId, vm.parseJsonAddress(receiptsJson, _key(i, "verifyingContract")));
            vm.assertEq(ds, vm.parseJsonBytes32(receiptsJson, _key(i, "domainSeparator")), "domainSeparator");
            bytes32 d = ReceiptLib.digest(ds, sh);
            vm.assertEq(d, vm.parseJsonBytes32(receiptsJson, _key(i, "digest")), "digest");
            bytes memory sig = vm.parseJsonBytes(receiptsJson, _key(i, "signature"));
            vm.assertEq(sig.length, 65, "65-byte signature");
            address signer = ECDSA.recover(d, sig);
            vm.assertEq(signer, vm.parseJsonAddress(receiptsJson, _key(i, "signer")), "signer");
            vm.assertEq(signer, r.operator, "signer is the operator");
            vm.assertEq(vm.addr(vm.parseJsonUint(receiptsJson, _key(i, "privateKey"))), signer, "key");
        }
    }

    /// @dev The deployed ChallengeManager computes the same digest when it sits at the vector's
    ///      verifyingContract on the vector's chain.
    function test_challengeManagerDigest_matchesVectors_succeeds() public {
        uint256 n = vm.parseJsonUint(receiptsJson, ".count");
        IProtocolConfigTypes.Params memory p; // unused by receiptDigest; constructor needs valid params
        p.challengeWindow = 1;
        p.publicationDeadline = 1;
        p.responsePeriod = 1;
        p.drawPeriod = 48; // ProtocolConfig.minDrawPeriod(1)
        p.commitPeriod = 1;
        p.revealPeriod = 1;
        p.unbondingPeriod = 100;
        p.drawDelayBlocks = 1;
        p.committeeSize = 1;
        p.quorumBps = 6667;
        p.challengeBond = 1;
        p.minOperatorStake = 1;
        p.minVerifierStake = 1;
        p.claimWindow = 1;
        ProtocolConfig config = new ProtocolConfig(address(this), p, 0);
        StakeRegistry stakes = new StakeRegistry(address(this), config, 10 minutes, 1000);
        BatchRegistry batches = new BatchRegistry(stakes);
        for (uint256 i = 0; i < n; i++) {
            ReceiptLib.Receipt memory r = _load(i);
            vm.chainId(r.chainId);
            ChallengeManager deployed = new ChallengeManager(config, stakes, batches);
            address target = vm.parseJsonAddress(receiptsJson, _key(i, "verifyingContract"));
            _etchAt(address(deployed), target);
            vm.assertEq(
                ChallengeManager(payable(target)).receiptDigest(r), vm.parseJsonBytes32(receiptsJson, _key(i, "digest"))
            );
        }
    }

    function _etchAt(address from, address to) internal {
        // OpenZeppelin's EIP712 caches the separator for its own address and rebuilds it
        // elsewhere, so copying the code is enough.
        vm.etch(to, from.code);
    }

    function test_merkleRoots_matchVectors_succeeds() public view {
        uint256 trees = vm.parseJsonUint(merkleJson, ".count");
        vm.assertGe(trees, 1, "at least one tree");
        for (uint256 t = 0; t < trees; t++) {
            string memory base = string.concat(".trees[", _u(t), "]");
            uint256 leafCount = vm.parseJsonUint(merkleJson, string.concat(base, ".leafCount"));
            bytes32 root = vm.parseJsonBytes32(merkleJson, string.concat(base, ".root"));
            bytes32[] memory digests = vm.parseJsonBytes32Array(merkleJson, string.concat(base, ".digests"));
            bytes32[] memory leaves = vm.parseJsonBytes32Array(merkleJson, string.concat(base, ".leaves"));
            vm.assertEq(digests.length, leafCount, "digest count");
            for (uint256 i = 0; i < leafCount; i++) {
                vm.assertEq(BatchMerkle.leafHash(digests[i]), leaves[i], "leaf hash");
                string memory pk = string.concat(base, ".proofs[", _u(i), "]");
                uint256 index = vm.parseJsonUint(merkleJson, string.concat(pk, ".index"));
                vm.assertEq(vm.parseJsonUint(merkleJson, string.concat(pk, ".leafCount")), leafCount, "proof leafCount");
                bytes32[] memory sib = vm.parseJsonBytes32Array(merkleJson, string.concat(pk, ".siblings"));
                (bool ok, bytes32 computed) = BatchMerkle.computeRoot(digests[index], index, leafCount, sib);
                vm.assertTrue(ok, "proof shape");
                vm.assertEq(computed, root, "root from proof");
                vm.assertTrue(BatchMerkle.verify(digests[index], index, leafCount, sib, root), "verify");
                if (leafCount > 1) {
                    // The same proof must fail for a neighbouring digest or index.
                    vm.assertFalse(
                        BatchMerkle.verify(digests[(index + 1) % leafCount], index, leafCount, sib, root), "other digest"
                    );
                }
            }
        }
    }
}
