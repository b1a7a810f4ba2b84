// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {ProtocolConfig} from "../src/ProtocolConfig.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryErrors} from "../src/errors/StakeRegistryErrors.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";

contract StakeRegistryTest is Fixture {
    address internal newcomer = address(0xD00D);

    function test_register_verifier_succeeds() public {
        vm.deal(newcomer, 2 ether);
        vm.prank(newcomer);
        stakes.register{value: 2 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.assertEq(stakes.accountOf(newcomer).stake, 2 ether);
        vm.assertTrue(stakes.isVerifier(newcomer), "verifier");
        vm.assertEq(stakes.verifierCount(), 5);
        vm.assertEq(stakes.totalStake(), address(stakes).balance);
    }

    function test_register_belowMinimum_reverts() public {
        vm.deal(newcomer, 20 ether);
        vm.prank(newcomer);
        vm.expectRevert(
            abi.encodeWithSelector(IStakeRegistryErrors.StakeBelowMinimum.selector, IStakeRegistryTypes.Role.Operator, 19 ether, 20 ether)
        );
        stakes.register{value: 19 ether}(IStakeRegistryTypes.Role.Operator);
    }

    function test_register_twice_reverts() public {
        vm.prank(operator);
        vm.expectRevert(
            abi.encodeWithSelector(IStakeRegistryErrors.AlreadyRegistered.selector, operator, IStakeRegistryTypes.Role.Operator)
        );
        stakes.register{value: 10 ether}(IStakeRegistryTypes.Role.Verifier);
    }

    function test_register_roleNone_reverts() public {
        vm.prank(newcomer);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.InvalidRole.selector, IStakeRegistryTypes.Role.None));
        stakes.register(IStakeRegistryTypes.Role.None);
    }

    function test_bond_registered_succeeds() public {
        vm.prank(operator);
        stakes.bond{value: 5 ether}();
        vm.assertEq(stakes.accountOf(operator).stake, 25 ether);
    }

    function test_bond_unregistered_reverts() public {
        vm.deal(newcomer, 1 ether);
        vm.prank(newcomer);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NotRegistered.selector, newcomer));
        stakes.bond{value: 1 ether}();
    }

    function test_requestUnbond_tooMuch_reverts() public {
        vm.prank(operator);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.UnbondExceedsStake.selector, operator, 21 ether, 20 ether));
        stakes.requestUnbond(21 ether);
    }

    function test_requestUnbond_deactivatesOperator_succeeds() public {
        vm.prank(operator);
        stakes.requestUnbond(15 ether);
        vm.assertFalse(stakes.isActiveOperator(operator), "below minimum active stake");
        vm.assertEq(stakes.activeStake(operator), 5 ether);
    }

    function test_withdraw_afterUnbondingPeriod_succeeds() public {
        vm.prank(operator);
        stakes.requestUnbond(5 ether);
        vm.warp(block.timestamp + 2 days);
        uint256 before = operator.balance;
        vm.prank(operator);
        stakes.withdraw();
        vm.assertEq(operator.balance, before + 5 ether);
        vm.assertEq(stakes.accountOf(operator).stake, 15 ether);
        vm.assertEq(stakes.totalStake(), address(stakes).balance);
    }

    function test_withdraw_early_reverts() public {
        vm.prank(operator);
        stakes.requestUnbond(5 ether);
        uint64 ready = uint64(block.timestamp + 2 days);
        vm.warp(block.timestamp + 2 days - 1);
        vm.prank(operator);
        vm.expectRevert(
            abi.encodeWithSelector(IStakeRegistryErrors.UnbondingNotReady.selector, operator, ready, block.timestamp)
        );
        stakes.withdraw();
    }

    function test_withdraw_lockedByLiveChallenge_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.prank(operator);
        stakes.requestUnbond(20 ether);
        open(p); // locks 10 ether
        vm.warp(block.timestamp + 2 days);
        vm.prank(operator);
        stakes.withdraw(); // only the free 10 ether leave
        vm.assertEq(stakes.accountOf(operator).stake, 10 ether);
        vm.prank(operator);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NothingToWithdraw.selector, operator, 10 ether, 10 ether));
        stakes.withdraw();
    }

    function test_withdraw_nothingUnbonding_reverts() public {
        vm.prank(operator);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NothingToWithdraw.selector, operator, 0, 0));
        stakes.withdraw();
    }

    function test_lock_notChallengeManager_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NotChallengeManager.selector, address(this)));
        stakes.lock(operator, 1);
    }

    function test_unlock_notChallengeManager_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NotChallengeManager.selector, address(this)));
        stakes.unlock(operator, 1);
    }

    function test_slashLocked_notChallengeManager_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NotChallengeManager.selector, address(this)));
        stakes.slashLocked(operator, 1);
    }

    function test_slashLocked_moreThanLocked_reverts() public {
        vm.prank(address(cm));
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.ExceedsLocked.selector, operator, 1, 0));
        stakes.slashLocked(operator, 1);
    }

    function test_lock_beyondFreeStake_recordsFullLiability_succeeds() public {
        vm.prank(address(cm));
        stakes.lock(operator, 50 ether);
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 50 ether, "full liability recorded");
        vm.assertEq(stakes.freeStake(operator), 0);
        // Settling it as a slash takes what there is, and clears the whole liability.
        vm.prank(address(cm));
        uint256 taken = stakes.slashLocked(operator, 50 ether);
        vm.assertEq(taken, 20 ether);
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 0);
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 0);
    }

    function test_syncParams_newMinimum_succeeds() public {
        vm.assertEq(uint256(stakes.minOperatorStake()), 20 ether);
        vm.assertTrue(stakes.isActiveOperator(operator), "active at 20 ether");
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.minOperatorStake = 25 ether;
        config.setParams(p);
        stakes.syncParams();
        // a raise waits its notice (AttackOperatorMinimumRaise.t.sol), then applies
        vm.assertTrue(stakes.isActiveOperator(operator), "active through the notice");
        vm.warp(stakes.pendingMinOperatorStakeAt());
        stakes.syncParams();
        vm.assertEq(uint256(stakes.minOperatorStake()), 25 ether);
        vm.assertFalse(stakes.isActiveOperator(operator), "inactive below the new minimum");
    }

    function test_setChallengeManager_twice_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.ChallengeManagerAlreadySet.selector, address(cm)));
        stakes.setChallengeManager(address(1));
    }

    function test_register_verifierTakesAndReleasesSlot_succeeds() public {
        uint256 count = stakes.verifierCount();
        vm.deal(newcomer, 2 ether);
        vm.prank(newcomer);
        stakes.register{value: 2 ether}(IStakeRegistryTypes.Role.Verifier);
        uint256 slot = stakes.accountOf(newcomer).slot;
        vm.assertTrue(slot != 0, "slot taken");
        vm.assertEq(stakes.verifierCount(), count + 1);
        vm.assertEq(stakes.weightOf(newcomer), 2 ether);
        vm.prank(newcomer);
        stakes.requestUnbond(1.5 ether); // active 0.5 < minimum 1: weight 0, slot released
        vm.assertEq(uint256(stakes.accountOf(newcomer).slot), 0);
        vm.assertEq(stakes.weightOf(newcomer), 0);
        vm.assertEq(stakes.verifierCount(), count);
        vm.deal(newcomer, 1 ether);
        vm.prank(newcomer);
        stakes.bond{value: 1 ether}(); // active 1.5: back in, in the slot it left (reused first)
        vm.assertEq(uint256(stakes.accountOf(newcomer).slot), slot);
        vm.assertEq(stakes.weightOf(newcomer), 1.5 ether);
    }
}
