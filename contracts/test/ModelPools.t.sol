// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {PoolKey} from "../src/lib/PoolKey.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";
import {IStakeRegistryErrors} from "../src/errors/StakeRegistryErrors.sol";

/// @dev Issue 31 finding 4: pools and coverage are per (engine fingerprint, model). The
///      own-engine fingerprint is the same for every model; the fixture's 4 verifiers hold only
///      MODEL (model A) under FINGERPRINT. MODEL_B is a second approved model.
///      Before: pools were per fingerprint, so a fraud on MODEL_B drew a committee of A-holders,
///      who abstain: Inconclusive, every member paid the non-reveal penalty, the challenger got
///      its bond back, and the operator kept its stake (repeatable).
contract ModelPoolsTest is Fixture {
    bytes32 internal constant MODEL_B = keccak256("model B");
    address internal bHolder = address(0xB0B0);

    function setUp() public override {
        super.setUp();
        config.approve(IProtocolConfigTypes.Kind.Model, MODEL_B);
        vm.deal(bHolder, 100 ether);
    }

    function _status(uint256 id) internal view returns (IChallengeManagerTypes.Status) {
        return cm.challenge(id).status;
    }

    /// Nobody holds MODEL_B: its pool is uncovered, so a MODEL_B receipt is invalid on its face
    /// and slashed at open; no committee, nobody penalised. (Before: covered by the 4 A-holders,
    /// drawn from them, Inconclusive.)
    function test_attackOtherModel_uncoveredModel_slashedAtOpen_succeeds() public {
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), "A covered");
        vm.assertFalse(stakes.isCoveredAt(PoolKey.key(FINGERPRINT, MODEL_B), uint64(block.timestamp)), "B uncovered");
        Posted memory p = postFor(FINGERPRINT, MODEL_B, HONEST_OUT, 2, 1);
        uint256 stakeBefore = stakes.accountOf(operator).stake;
        uint256 id = open(p);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(stakes.accountOf(operator).stake, stakeBefore - 10 ether, "operator slashed");
        for (uint256 i = 0; i < verifiers.length; i++) {
            vm.assertEq(stakes.accountOf(verifiers[i]).stake, 5 ether, "no honest A-holder pays");
        }
    }

    /// One verifier holds MODEL_B (3 of 23 ether: over the 10% coverage share). A tampered
    /// MODEL_B receipt draws its committee from the (FINGERPRINT, MODEL_B) pool only: the
    /// B-holder judges it and the operator is slashed. The A-holders' pool (the old draw for
    /// every model under FINGERPRINT) holds none able to judge it.
    function test_attackOtherModel_tamperedReceipt_drawnFromModelPool_slashed_succeeds() public {
        vm.prank(bHolder);
        stakes.register{value: 3 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(bHolder);
        stakes.declareFingerprint(FINGERPRINT, MODEL_B);
        vm.roll(block.number + 1);
        vm.warp(block.timestamp + stakes.coverageNotice()); // receipts rely on it from now on
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL_B), uint64(block.timestamp)), 1);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), 4);

        Posted memory p = postFor(FINGERPRINT, MODEL_B, HONEST_OUT, 2, 0); // claims HONEST_OUT
        uint256 id = open(p);
        vm.assertEq(cm.challenge(id).pool, PoolKey.key(FINGERPRINT, MODEL_B));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 1);
        vm.assertEq(ms[0].account, bHolder);
        // The A-holders' pool at the same snapshot and seed: no member can run MODEL_B.
        (address[] memory old,,) = stakes.drawCommittee(
            PoolKey.key(FINGERPRINT, MODEL),
            keccak256(abi.encode(blockhash(cm.challenge(id).targetBlock), id)),
            cm.challenge(id).snapshotBlock,
            3,
            address(0)
        );
        for (uint256 i = 0; i < old.length; i++) {
            vm.assertTrue(old[i] != bHolder, "the A pool holds no B-holder");
        }
        bytes32[] memory outs = new bytes32[](1);
        outs[0] = OTHER_OUT; // what MODEL_B really gives
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
        for (uint256 i = 0; i < verifiers.length; i++) {
            vm.assertEq(stakes.accountOf(verifiers[i]).stake, 5 ether, "no A-holder drawn or penalised");
        }
    }

    /// A declaration names an approved model.
    function test_declareFingerprint_unapprovedModel_reverts() public {
        bytes32 unknown = keccak256("unapproved model");
        vm.prank(verifiers[0]);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.ModelNotApproved.selector, unknown));
        stakes.declareFingerprint(FINGERPRINT, unknown);
    }

    /// The same fingerprint with two models is two pool keys, each one of MAX_DECLARATIONS.
    function test_declareFingerprint_twoModels_twoPoolKeys_succeeds() public {
        vm.prank(verifiers[0]);
        stakes.declareFingerprint(FINGERPRINT, MODEL_B);
        (bytes32[] memory pools,) = stakes.declarationsOf(verifiers[0]);
        vm.assertEq(pools.length, 2);
        vm.assertEq(pools[0], PoolKey.key(FINGERPRINT, MODEL));
        vm.assertEq(pools[1], PoolKey.key(FINGERPRINT, MODEL_B));
        vm.assertEq(PoolKey.key(FINGERPRINT, MODEL_B), keccak256(abi.encode(FINGERPRINT, MODEL_B)));
    }
}
