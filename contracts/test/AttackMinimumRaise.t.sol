// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";

/// @dev Issue 31, fresh-eyes review: a raised verifier minimum reached back into receipts already
///      covered. Governance raises minVerifierStake from 1 to 6 ETH (an ordinary change); anyone
///      calls syncParams and syncWeight on the four honest 5 ETH verifiers, whose draw weight
///      drops to 0 at once; the cheating operator's fraud, signed and committed while they
///      covered it (20 ETH declared), is then judged by its partner X (6 ETH) alone: Dismissed,
///      the honest challenger's bond to X. Cost: X's 6 ETH, bonded a day, and a few syncWeight
///      calls. Now a raise applies maxDisputeSpan + coverageNotice after it is first synced.
contract AttackMinimumRaiseTest is Fixture {
    address internal constant X = address(0x5B11);

    function _raise() internal {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.minVerifierStake = 6 ether;
        config.setParams(p);
        stakes.syncParams();
        for (uint256 i = 0; i < 4; i++) {
            stakes.syncWeight(verifiers[i]);
        }
    }

    function test_attackVerifierMinimumRaise_coveredFraudNotJudgedBySybilAlone() public {
        vm.deal(X, 100 ether);
        vm.prank(X);
        stakes.register{value: 6 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(X);
        stakes.declareFingerprint(FINGERPRINT, MODEL);
        Posted memory q = postBatch(HONEST_OUT, 2, 0); // the fraud: the true output is OTHER_OUT
        _raise();
        vm.roll(block.number + 1);
        uint256 id = open(q);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3, "the honest verifiers are still drawable");
        bytes32[] memory outs = new bytes32[](ms.length);
        for (uint256 i = 0; i < ms.length; i++) {
            outs[i] = ms[i].account == X ? HONEST_OUT : OTHER_OUT;
        }
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        // X (6 ETH) may still sit with two 5 ETH honest seats and block them (the stake
        // assumption: it outweighs one), but it can no longer judge alone: the fraud is never
        // dismissed, the challenger keeps its bond, no honest member pays.
        vm.assertTrue(
            cm.challenge(id).status != IChallengeManagerTypes.Status.Dismissed, "fraud dismissed by X alone"
        );
        vm.assertGe(cm.credits(challenger), 1 ether, "challenger lost its bond");
        for (uint256 i = 0; i < 4; i++) {
            vm.assertEq(uint256(stakes.accountOf(verifiers[i]).stake), 5 ether, "honest verifier paid");
        }
    }

    /// The raise does apply, once its notice has passed and someone syncs again.
    function test_verifierMinimumRaise_appliesAfterNotice_succeeds() public {
        _raise();
        vm.assertEq(uint256(stakes.minVerifierStake()), 1 ether, "not yet");
        vm.assertEq(stakes.weightOf(verifiers[0]), 5 ether);
        uint256 at = stakes.pendingMinVerifierStakeAt();
        vm.assertEq(at, block.timestamp + config.maxDisputeSpan(config.params()) + stakes.coverageNotice());
        vm.warp(at - 1);
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minVerifierStake()), 1 ether, "one second early");
        vm.warp(at);
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minVerifierStake()), 6 ether);
        stakes.syncWeight(verifiers[0]);
        vm.assertEq(stakes.weightOf(verifiers[0]), 0, "below the new minimum");
        // lowering applies at once
        config.setParams(defaultParams());
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minVerifierStake()), 1 ether);
    }
}
