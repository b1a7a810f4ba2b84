// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {BatchRegistry} from "../src/BatchRegistry.sol";
import {IBatchRegistryErrors} from "../src/errors/BatchRegistryErrors.sol";
import {IBatchRegistryTypes} from "../src/types/BatchRegistryTypes.sol";

contract BatchRegistryTest is Fixture {
    function test_commitBatch_activeOperator_succeeds() public {
        bytes32 root = keccak256("root");
        vm.prank(operator);
        bytes32 id = batches.commitBatch(root, 1024, "da://local/0xabc");
        vm.assertEq(id, keccak256(abi.encode(operator, root)));
        IBatchRegistryTypes.Batch memory b = batches.batchOf(operator, root);
        vm.assertEq(uint256(b.leafCount), 1024);
        vm.assertEq(uint256(b.committedAt), block.timestamp);
        vm.assertEq(uint256(b.committedBlock), block.number);
    }

    function test_commitBatch_sameRootOtherOperator_succeeds() public {
        // Copying another operator's root cannot block it: ids are per operator.
        bytes32 root = keccak256("root");
        vm.prank(operator);
        batches.commitBatch(root, 4, "da://local/0x01");
        address op2 = address(0x0B2);
        vm.deal(op2, 20 ether);
        vm.startPrank(op2);
        stakes.register{value: 20 ether}(stakes.accountOf(operator).role);
        batches.commitBatch(root, 4, "da://local/0x01");
        vm.stopPrank();
    }

    function test_commitBatch_duplicate_reverts() public {
        bytes32 root = keccak256("root");
        vm.startPrank(operator);
        bytes32 id = batches.commitBatch(root, 2, "");
        vm.expectRevert(abi.encodeWithSelector(IBatchRegistryErrors.BatchAlreadyCommitted.selector, id, operator, root));
        batches.commitBatch(root, 2, "");
        vm.stopPrank();
    }

    function test_commitBatch_empty_reverts() public {
        vm.prank(operator);
        vm.expectRevert(abi.encodeWithSelector(IBatchRegistryErrors.EmptyBatch.selector, keccak256("r")));
        batches.commitBatch(keccak256("r"), 0, "");
    }

    function test_commitBatch_zeroRoot_reverts() public {
        vm.prank(operator);
        vm.expectRevert(IBatchRegistryErrors.ZeroRoot.selector);
        batches.commitBatch(bytes32(0), 1, "");
    }

    function test_commitBatch_notOperator_reverts() public {
        vm.prank(verifiers[0]);
        vm.expectRevert(abi.encodeWithSelector(IBatchRegistryErrors.NotActiveOperator.selector, verifiers[0]));
        batches.commitBatch(keccak256("r"), 1, "");
    }
}
