// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {Vm} from "./utils/Test.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";
import {IStakeRegistry} from "../src/interfaces/IStakeRegistry.sol";

/// @dev Issue 31, left open by b768ff6: a raised operator minimum applied at once. Governance
///      raises minOperatorStake from 20 to 30 ETH (an ordinary change); anyone calls
///      syncParams. The honest operator (20 ETH, the minimum a block ago) is no longer an
///      active operator: commitBatch reverts, so the receipts it signed a moment before miss
///      their publication deadline and a stranger's claimUnpublished slashes it for each one.
///      Cost to the stranger: a bond it gets back. Now a raise applies maxDisputeSpan +
///      coverageNotice after it is first synced, announced by MinimumRaisePending.
contract AttackOperatorMinimumRaiseTest is Fixture {
    address internal constant STRANGER = address(0x57A7);

    function _raise(uint128 minimum) internal {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.minOperatorStake = minimum;
        config.setParams(p);
        stakes.syncParams();
    }

    function test_attackOperatorMinimumRaise_signedReceiptsStillCommitted_notSlashed() public {
        // The honest operator signs a receipt under the 20 ETH minimum, batching it as usual.
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 31);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        bytes32[] memory digests = new bytes32[](1);
        digests[0] = digestOf(r);
        bytes32 root = merkleRoot(digests);

        _raise(30 ether); // the attacker syncs the raise the same second
        vm.warp(block.timestamp + 30); // the operator's publisher commits 30 s later
        vm.roll(block.number + 2);
        vm.prank(operator);
        try batches.commitBatch(root, 1, "da://local/0x00") {} catch {} // reverted before the fix

        vm.warp(uint256(r.issuedAt) + defaultParams().publicationDeadline + 1);
        vm.deal(STRANGER, 10 ether);
        vm.prank(STRANGER);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        // The operator's claim responder answers with its inclusion proof, when one exists.
        if (batches.batchOf(operator, root).committedAt != 0) {
            vm.prank(operator);
            cm.answerUnpublished(id, root, 0, merkleProof(digests, 0));
        }
        vm.warp(cm.claim(id).responseDeadline + 1);
        try cm.resolveUnpublished(id) {} catch {}
        vm.assertTrue(
            cm.claim(id).status != IChallengeManagerTypes.ClaimStatus.Slashed,
            "honest operator slashed: its batch was refused under the new minimum"
        );
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 20 ether, "honest operator lost stake");
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 0, "honest operator stake left locked");
    }

    /// The raise is announced with its date, applies exactly then (not a second earlier), and
    /// an operator that bonded the shortfall in the meantime stays active throughout.
    function test_operatorMinimumRaise_appliesAfterNotice_succeeds() public {
        uint256 due = block.timestamp + config.maxDisputeSpan(config.params()) + stakes.coverageNotice();
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.minOperatorStake = 30 ether;
        config.setParams(p);
        vm.recordLogs();
        stakes.syncParams();
        _assertAnnounced(vm.getRecordedLogs(), 20 ether, 30 ether, due);
        vm.assertEq(uint256(stakes.minOperatorStake()), 20 ether, "not yet");
        vm.assertEq(uint256(stakes.pendingMinOperatorStake()), 30 ether);
        vm.assertEq(uint256(stakes.pendingMinOperatorStakeAt()), due);
        vm.assertTrue(stakes.isActiveOperator(operator), "active through the notice");

        // a stranger (not yet topped up) vs the honest operator (tops up during the notice)
        address late = address(0x1A7E);
        vm.deal(late, 100 ether);
        vm.prank(late);
        stakes.register{value: 30 ether}(IStakeRegistryTypes.Role.Operator); // new ones pay the new minimum
        vm.warp(due - 1);
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minOperatorStake()), 20 ether, "one second early");
        vm.warp(due);
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minOperatorStake()), 30 ether, "applied at the notice");
        vm.assertEq(uint256(stakes.pendingMinOperatorStake()), 0);
        vm.assertEq(uint256(stakes.pendingMinOperatorStakeAt()), 0);
        vm.assertFalse(stakes.isActiveOperator(operator), "did not top up: below the new minimum");
        vm.prank(operator);
        stakes.bond{value: 10 ether}();
        vm.assertTrue(stakes.isActiveOperator(operator), "topped up");
        vm.assertTrue(stakes.isActiveOperator(late), "registered at the new minimum");

        // lowering applies at once
        config.setParams(defaultParams());
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minOperatorStake()), 20 ether);
    }

    function _assertAnnounced(Vm.Log[] memory logs, uint256 current, uint256 pending, uint256 due) internal view {
        bytes32 topic = IStakeRegistry.MinimumRaisePending.selector;
        for (uint256 i = 0; i < logs.length; i++) {
            if (logs[i].emitter != address(stakes) || logs[i].topics[0] != topic) continue;
            vm.assertEq(logs[i].topics[1], bytes32(uint256(IStakeRegistryTypes.Role.Operator)), "role");
            (uint256 c, uint256 pe, uint64 d) = abi.decode(logs[i].data, (uint256, uint256, uint64));
            vm.assertEq(c, current, "current");
            vm.assertEq(pe, pending, "pending");
            vm.assertEq(uint256(d), due, "effectiveAt");
            return;
        }
        vm.assertTrue(false, "no MinimumRaisePending event");
    }

    /// A second, different raise restarts the notice; lowering cancels a pending raise.
    function test_operatorMinimumRaise_changedRaiseRestartsNotice_succeeds() public {
        _raise(30 ether);
        uint256 first = stakes.pendingMinOperatorStakeAt();
        vm.warp(block.timestamp + 1 hours);
        _raise(40 ether);
        vm.assertEq(uint256(stakes.pendingMinOperatorStake()), 40 ether);
        vm.assertEq(stakes.pendingMinOperatorStakeAt(), first + 1 hours, "a new raise, a new notice");
        vm.warp(first);
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minOperatorStake()), 20 ether, "the first date no longer applies");
        config.setParams(defaultParams());
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minOperatorStake()), 20 ether);
        vm.assertEq(uint256(stakes.pendingMinOperatorStake()), 0, "lowering cancels the raise");
        vm.assertEq(uint256(stakes.pendingMinOperatorStakeAt()), 0);
    }
}
