// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ProtocolConfig} from "../src/ProtocolConfig.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {IProtocolConfigErrors} from "../src/errors/ProtocolConfigErrors.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";

contract ProtocolConfigTest is Fixture {
    function test_setParams_owner_succeeds() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.committeeSize = 5;
        config.setParams(p);
        vm.assertEq(uint256(config.params().committeeSize), 5);
    }

    function test_setParams_stranger_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, challenger));
        config.setParams(p);
    }

    function test_setParams_shortUnbonding_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.unbondingPeriod = uint64(config.maxDisputeSpan(p));
        vm.expectRevert(
            abi.encodeWithSelector(IProtocolConfigErrors.InvalidParams.selector, "unbondingPeriod <= window + adjudication")
        );
        config.setParams(p);
    }

    function test_setParams_quorumAtHalf_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.quorumBps = 5000;
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.InvalidParams.selector, "quorumBps not in (5000, 10000]"));
        config.setParams(p);
    }

    function test_setParams_rewardsOver100Percent_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.challengerRewardBps = 6000;
        p.majorityRewardBps = 4001;
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.InvalidParams.selector, "alpha + beta > 10000"));
        config.setParams(p);
    }

    /// Issue 31: the minimum stake must pay MIN_OPERATOR_STAKE_SLASHES frauds in full (before:
    /// one slashAmount was enough, so an operator at the minimum paid for its first fraud only).
    function test_setParams_minStakeUnderTwoSlashes_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.slashAmount = p.minOperatorStake / 2 + 1;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.InvalidParams.selector, "minOperatorStake < MIN_OPERATOR_STAKE_SLASHES * slashAmount"
            )
        );
        config.setParams(p);
    }

    function test_approve_newEntry_succeeds() public {
        bytes32 id = keccak256("new model");
        config.approve(IProtocolConfigTypes.Kind.Model, id);
        vm.assertTrue(config.isApproved(IProtocolConfigTypes.Kind.Model, id), "approved");
        vm.assertFalse(config.isApproved(IProtocolConfigTypes.Kind.EngineFingerprint, id), "other list untouched");
    }

    function test_approve_twice_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.AlreadyApproved.selector, IProtocolConfigTypes.Kind.Model, MODEL));
        config.approve(IProtocolConfigTypes.Kind.Model, MODEL);
    }

    function test_approve_stranger_reverts() public {
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, challenger));
        config.approve(IProtocolConfigTypes.Kind.Model, keccak256("x"));
    }

    function test_revoke_keepsEarlierReceiptsValid_succeeds() public {
        uint64 before = uint64(block.timestamp);
        vm.warp(block.timestamp + 100);
        config.revoke(IProtocolConfigTypes.Kind.Model, MODEL);
        uint64 until = uint64(block.timestamp) + GOVERNANCE_NOTICE;
        vm.assertTrue(config.isApprovedAt(IProtocolConfigTypes.Kind.Model, MODEL, before), "valid before");
        vm.assertTrue(config.isApprovedAt(IProtocolConfigTypes.Kind.Model, MODEL, until - 1), "valid in the notice");
        vm.assertFalse(config.isApprovedAt(IProtocolConfigTypes.Kind.Model, MODEL, until), "not from until on");
    }

    function test_revoke_notApproved_reverts() public {
        bytes32 id = keccak256("never");
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.NotApproved.selector, IProtocolConfigTypes.Kind.Model, id));
        config.revoke(IProtocolConfigTypes.Kind.Model, id);
    }

    function test_registerKeyEpoch_valid_succeeds() public {
        config.registerKeyEpoch(7, hex"0102", bytes32(uint256(3)), 3, 5);
        IProtocolConfigTypes.KeyEpoch memory e = config.keyEpoch(7);
        vm.assertEq(uint256(e.threshold), 3);
        vm.assertEq(uint256(e.shardCount), 5);
        vm.assertEq(keccak256(e.publicKey), keccak256(hex"0102"));
        vm.assertTrue(config.isKeyEpochLiveAt(7, uint64(block.timestamp)), "live");
    }

    function test_registerKeyEpoch_duplicate_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.KeyEpochExists.selector, EPOCH));
        config.registerKeyEpoch(EPOCH, hex"01", bytes32(0), 1, 1);
    }

    function test_registerKeyEpoch_thresholdAboveShards_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.InvalidThreshold.selector, 4, 3));
        config.registerKeyEpoch(9, hex"01", bytes32(0), 4, 3);
    }

    function test_registerKeyEpoch_emptyKey_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.EmptyPublicKey.selector, 9));
        config.registerKeyEpoch(9, "", bytes32(0), 1, 1);
    }

    function test_retireKeyEpoch_live_succeeds() public {
        config.retireKeyEpoch(EPOCH);
        uint64 at = uint64(block.timestamp) + GOVERNANCE_NOTICE;
        vm.assertFalse(config.isKeyEpochLiveAt(EPOCH, at), "retired from now + notice");
        vm.assertTrue(config.isKeyEpochLiveAt(EPOCH, at - 1), "live before");
    }

    function test_retireKeyEpoch_twice_reverts() public {
        config.retireKeyEpoch(EPOCH);
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.KeyEpochAlreadyRetired.selector, EPOCH, uint64(block.timestamp) + GOVERNANCE_NOTICE
            )
        );
        config.retireKeyEpoch(EPOCH);
    }

    function test_retireKeyEpoch_unknown_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IProtocolConfigErrors.UnknownKeyEpoch.selector, 99));
        config.retireKeyEpoch(99);
    }
}
