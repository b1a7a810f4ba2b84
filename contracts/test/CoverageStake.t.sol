// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {PoolKey} from "../src/lib/PoolKey.sol";
import {TwoFingerprints} from "./utils/TwoFingerprints.sol";
import {CoverageRef} from "./utils/CoverageRef.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";
import {IStakeRegistryErrors} from "../src/errors/StakeRegistryErrors.sol";

/// @dev Coverage measured in stake (docs/contracts.md "Coverage in stake") and the challenger's
///      seat (docs/contracts.md "Full challenge", step 3). The fixture's 4 verifiers
///      (5 ether each) declare FINGERPRINT; FP2 is a second approved fingerprint; the registry
///      requires MIN_COVERAGE_BPS = 10% of all verifier weight.
contract CoverageStakeTest is TwoFingerprints {
    address internal sybil = address(0x5B11);

    function setUp() public override {
        super.setUp();
        vm.deal(sybil, 1000 ether);
    }

    function _now() internal view returns (uint64) {
        return uint64(block.timestamp);
    }

    function _joinFp2(address v, uint256 amount) internal {
        vm.deal(v, v.balance + amount);
        vm.prank(v);
        stakes.register{value: amount}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(v);
        stakes.declareFingerprint(FP2, MODEL);
    }

    function _openAs(address who, Posted memory p) internal returns (uint256 id) {
        vm.deal(who, who.balance + 1 ether); // the challenge bond
        vm.prank(who);
        id = cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    // ---- constructor ------------------------------------------------------------------------

    function test_constructor_minCoverageBpsTooLarge_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.MinCoverageBpsTooLarge.selector, 10_001, 10_000));
        new StakeRegistry(address(this), config, 10 minutes, 10_001);
        StakeRegistry all = new StakeRegistry(address(this), config, 10 minutes, 10_000); // 100%: allowed
        vm.assertEq(all.minCoverageBps(), 10_000);
        vm.assertEq(stakes.minCoverageBps(), MIN_COVERAGE_BPS);
    }

    // ---- coverage weight follows every weight change ------------------------------------------

    function test_coverageWeight_followsBondUnbondSlash_succeeds() public {
        address v = verifiers[0];
        vm.prank(v);
        stakes.declareFingerprint(FP2, MODEL);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 5 ether);
        vm.assertEq(stakes.verifierWeightAtTime(_now()), 20 ether);
        vm.warp(block.timestamp + 1);
        vm.prank(v);
        stakes.bond{value: 3 ether}();
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 8 ether, "bond");
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FINGERPRINT, MODEL), _now()), 23 ether, "every declared pool");
        vm.assertEq(stakes.verifierWeightAtTime(_now()), 23 ether);
        vm.warp(block.timestamp + 1);
        vm.prank(v);
        stakes.requestUnbond(2 ether);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 6 ether, "unbond request");
        vm.assertEq(stakes.verifierWeightAtTime(_now()), 21 ether);
        vm.warp(block.timestamp + 1);
        vm.startPrank(address(cm));
        stakes.lock(v, 1.5 ether);
        stakes.slashLocked(v, 1.5 ether);
        vm.stopPrank();
        // stake 8 - 1.5 = 6.5, still 2 unbonding: active 4.5
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 4.5 ether, "slash");
        vm.assertEq(stakes.verifierWeightAtTime(_now()), 19.5 ether);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), _now()), 1, "count view unchanged in meaning");
        // The history by time is final.
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now() - 3), 5 ether);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now() - 2), 8 ether);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now() - 1), 6 ether);
        vm.assertEq(stakes.verifierWeightAtTime(_now() - 2), 23 ether);
    }

    function test_coverageWeight_slashBelowMinimum_stopsCounting_succeeds() public {
        address v = verifiers[0];
        vm.prank(v);
        stakes.declareFingerprint(FP2, MODEL);
        vm.startPrank(address(cm));
        stakes.lock(v, 4.5 ether);
        stakes.slashLocked(v, 4.5 ether); // 0.5 ether left: below the 1 ether minimum
        vm.stopPrank();
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 0);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), _now()), 0);
        vm.assertEq(stakes.verifierWeightAtTime(_now()), 15 ether);
        vm.prank(v);
        stakes.bond{value: 2 ether}(); // back above the minimum: counts again
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 2.5 ether);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), _now()), 1);
    }

    function test_coverageWeight_leavingDeclarationNoLongerCounts_succeeds() public {
        address v = verifiers[0];
        vm.prank(v);
        stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FINGERPRINT, MODEL), _now()), 15 ether);
        vm.prank(v);
        stakes.bond{value: 3 ether}(); // still in the pool, not in the coverage
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FINGERPRINT, MODEL), _now()), 15 ether);
        vm.assertEq(stakes.verifierWeightAtTime(_now()), 23 ether);
        vm.prank(v);
        stakes.declareFingerprint(FINGERPRINT, MODEL); // cancels: counts again with its weight now
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FINGERPRINT, MODEL), _now()), 23 ether);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), _now()), 4);
    }

    /// Random bonds, unbond requests, slashes, undeclarations and re-declarations of FP2 by the
    /// 4 verifiers: the coverage weight (and count) always equals the sum over declarations that
    /// count, recomputed here from the accounts; the total by time equals the draw tree's total.
    function testFuzz_coverageWeightFollowsStake(uint256[12] memory ops) public {
        for (uint256 i = 0; i < 4; i++) {
            vm.prank(verifiers[i]);
            stakes.declareFingerprint(FP2, MODEL);
        }
        for (uint256 k = 0; k < ops.length; k++) {
            address v = verifiers[ops[k] % 4];
            uint256 action = (ops[k] >> 8) % 5;
            uint256 amount = bound(ops[k] >> 16, 1, 4 ether);
            vm.warp(block.timestamp + 1);
            vm.roll(block.number + 1);
            if (action == 0) {
                vm.prank(v);
                stakes.bond{value: amount}();
            } else if (action == 1) {
                uint256 active = stakes.activeStake(v);
                if (active <= 1 ether) continue;
                vm.prank(v);
                stakes.requestUnbond(uint128(amount < active - 1 ether ? amount : active - 1 ether));
            } else if (action == 2) {
                vm.startPrank(address(cm));
                stakes.lock(v, amount);
                stakes.slashLocked(v, amount);
                vm.stopPrank();
            } else {
                (bytes32[] memory fps, uint64[] memory leaveAt) = stakes.declarationsOf(v);
                bool leaving = false;
                for (uint256 j = 0; j < fps.length; j++) {
                    if (fps[j] == PoolKey.key(FP2, MODEL)) leaving = leaveAt[j] != 0;
                }
                vm.prank(v);
                if (leaving) stakes.declareFingerprint(FP2, MODEL);
                else stakes.undeclareFingerprint(FP2, MODEL);
            }
        }
        (uint256 sum, uint256 count, uint256 total) = CoverageRef.recompute(stakes, verifiers, PoolKey.key(FP2, MODEL));
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), sum, "coverage weight");
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), _now()), count, "coverage count");
        vm.assertEq(stakes.verifierWeightAtTime(_now()), total, "total by time");
        vm.assertEq(stakes.verifierWeightAtTime(_now()), stakes.totalWeightAt(block.number), "same as the draw tree");
    }

    // ---- the fraction -------------------------------------------------------------------------

    /// FP2's only declarant holds 2.5 ether; the rest hold 20 + 2.5: FP2 has exactly 10% of all
    /// verifier weight, which covers (>=). One wei more elsewhere and it does not.
    function test_isCoveredAt_fractionBoundaryExact_succeeds() public {
        address v = address(0xF2F2);
        _joinFp2(v, 2.5 ether);
        vm.prank(verifiers[0]);
        stakes.bond{value: 2.5 ether}();
        uint64 t = _now();
        vm.assertEq(stakes.verifierWeightAtTime(t), 25 ether);
        uint64 notice = stakes.coverageNotice();
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t + notice), "exactly 10%");
        vm.warp(t + 1);
        vm.prank(verifiers[1]);
        stakes.bond{value: 1}();
        vm.assertFalse(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t + 1 + notice), "one wei short of 10%");
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t + notice), "the earlier time is final");
    }

    /// Any weights: covered iff the declared weight is > 0 and at least 10% of the total,
    /// recomputed here from the registered amounts.
    function testFuzz_isCoveredAt_matchesFraction(uint96 fp2Stake, uint96 otherBond, bool declare) public {
        fp2Stake = uint96(bound(fp2Stake, 1 ether, 500 ether));
        otherBond = uint96(bound(otherBond, 1, 500 ether));
        address v = address(0xF2F2);
        vm.deal(v, fp2Stake);
        vm.prank(v);
        stakes.register{value: fp2Stake}(IStakeRegistryTypes.Role.Verifier);
        if (declare) {
            vm.prank(v);
            stakes.declareFingerprint(FP2, MODEL);
        }
        vm.deal(verifiers[2], 1000 ether);
        vm.prank(verifiers[2]);
        stakes.bond{value: otherBond}();
        uint256 covered = declare ? fp2Stake : 0;
        uint256 total = 20 ether + uint256(fp2Stake) + otherBond;
        bool expected = covered != 0 && covered * 10_000 >= 1000 * total;
        vm.assertEq(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), _now() + stakes.coverageNotice()), expected);
    }

    /// Several changes under one timestamp: the last one is the value at that time.
    function test_coverageWeight_sameTimestamp_lastWriteWins_succeeds() public {
        vm.prank(verifiers[0]);
        stakes.declareFingerprint(FP2, MODEL);
        vm.prank(verifiers[0]);
        stakes.bond{value: 1 ether}();
        vm.prank(verifiers[1]);
        stakes.declareFingerprint(FP2, MODEL);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now()), 11 ether);
        vm.assertEq(stakes.coverageWeightAt(PoolKey.key(FP2, MODEL), _now() - 1), 0);
    }

    // ---- attack: a sybil captures a small pool ----------------------------------------------

    /// The operator registers a sybil verifier with the minimum stake, declares FP2 (approved,
    /// nobody else runs it) and signs a tampered receipt under it. Under the count rule (one
    /// declared verifier covers) the sybil was the whole committee and voted the receipt through.
    /// Now FP2 holds 1 / 21 < 10% of all verifier weight: invalid on its face, slashed at open.
    function test_attackSybilCapture_smallPool_slashedAtOpen_succeeds() public {
        _joinFp2(sybil, 1 ether);
        vm.warp(block.timestamp + stakes.coverageNotice());
        vm.roll(block.number + 1);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), _now()), 1, "the sybil alone declared FP2");
        Posted memory p = postUnder(FP2, OTHER_OUT, 2, 0);
        uint256 stakeBefore = stakes.accountOf(operator).stake;
        uint256 id = open(p);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(stakes.accountOf(operator).stake, stakeBefore - 10 ether);
    }

    /// The same sybil holding 10% covers FP2: it is then 2x as much stake as the bound of the
    /// security claim (an attacker under minCoverage / 2 = 5% of all weight). What it costs.
    function test_attackSybilCapture_needsTheFraction_succeeds() public {
        _joinFp2(sybil, uint256(20 ether) / 9 + 1); // 2.22.. ether: just over 10% of 22.22..
        vm.warp(block.timestamp + stakes.coverageNotice());
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), _now()), "10% covers");
        uint256 total = stakes.verifierWeightAtTime(_now());
        vm.assertGe(stakes.weightOf(sybil) * 10_000, MIN_COVERAGE_BPS * total, "the sybil holds 10%");
    }

    // ---- honest operator: a later large bond does not reach an earlier receipt -------------

    /// FP2 is covered (3 of 23 ether) when the operator signs. Then a whale bonds 100 ether
    /// (FP2 falls to 2.4%): receipts from then on are uncovered (the operator sees it
    /// coverageNotice ahead and stops serving FP2), but the earlier receipt is not an invalid
    /// receipt and its committee dismisses the challenge.
    function test_attackHonestOperator_largeBondAfterSigning_notSlashed_succeeds() public {
        address v = address(0xF2F2);
        _joinFp2(v, 3 ether);
        vm.warp(block.timestamp + stakes.coverageNotice());
        vm.roll(block.number + 1);
        Posted memory p = postUnder(FP2, HONEST_OUT, 2, 0);
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), p.receipt.issuedAt), "covered when signed");
        vm.warp(block.timestamp + 1);
        vm.prank(verifiers[3]);
        stakes.bond{value: 95 ether}();
        vm.assertFalse(
            stakes.isCoveredAt(PoolKey.key(FP2, MODEL), _now() + stakes.coverageNotice()), "later receipts uncovered"
        );
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), p.receipt.issuedAt), "the earlier one stays covered");
        vm.warp(block.timestamp + 1 hours);
        vm.roll(block.number + 1);
        uint256 stakeBefore = stakes.accountOf(operator).stake;
        uint256 id = open(p);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 1);
        vm.assertEq(ms[0].account, v);
        commitAndReveal(id, ms, allSame(1, HONEST_OUT));
        cm.resolve(id);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(stakes.accountOf(operator).stake, stakeBefore);
    }

    // ---- the lone challenger ------------------------------------------------------------------

    /// FP2's only declared verifier (13% of the weight: covered) catches a tampered FP2 receipt
    /// and challenges it itself. Excluding it left the committee empty: Inconclusive, the cheat
    /// unslashed. Now it is drawn (nobody else is drawable) and its vote slashes.
    function test_attackLoneChallenger_sitsAndSlashes_succeeds() public {
        address v = address(0xF2F2);
        _joinFp2(v, 3 ether);
        vm.warp(block.timestamp + stakes.coverageNotice());
        vm.roll(block.number + 1);
        Posted memory p = postUnder(FP2, HONEST_OUT, 2, 0); // FP2 really gives OTHER_OUT
        uint256 id = _openAs(v, p);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 1, "the lone challenger sits");
        vm.assertEq(ms[0].account, v);
        commitAndReveal(id, ms, allSame(1, OTHER_OUT));
        uint256 stakeBefore = stakes.accountOf(operator).stake;
        cm.resolve(id);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(stakes.accountOf(operator).stake, stakeBefore - 10 ether);
    }

    /// A challenger who is one of several declared verifiers is drawable like them (issue 31):
    /// over every seed tried, it sits in some committees (before: never, while others were
    /// drawable).
    function test_drawCommittee_challengerDrawableAmongOthers_succeeds() public {
        bool seated = false;
        for (uint256 k = 0; k < 8 && !seated; k++) {
            Posted memory p = postBatch(keccak256(abi.encode("out", k)), 2, 0);
            uint256 id = _openAs(verifiers[0], p);
            IChallengeManagerTypes.Member[] memory ms = draw(id);
            vm.assertEq(ms.length, 3);
            for (uint256 i = 0; i < ms.length; i++) {
                if (ms[i].account == verifiers[0]) seated = true;
            }
            vm.roll(block.number + 1);
        }
        vm.assertTrue(seated, "the challenger sits in some committee");
    }

    /// Any subset of the verifiers declared FP2 (plus enough weight to cover it), any
    /// challenger among them or not: the committee is min(committeeSize, pool) members of the
    /// pool, the challenger counted like any other member.
    function testFuzz_challengerDrawnLikeAnyone(uint8 mask, uint8 who, uint256 salt) public {
        mask = uint8(bound(mask, 1, 15));
        address ch = who % 5 == 4 ? challenger : verifiers[who % 4];
        uint256 declared = 0;
        for (uint256 i = 0; i < 4; i++) {
            if (mask & (1 << i) == 0) continue;
            declared++;
            vm.prank(verifiers[i]);
            stakes.declareFingerprint(FP2, MODEL);
        }
        vm.warp(block.timestamp + stakes.coverageNotice());
        vm.roll(block.number + 1);
        Posted memory p = postUnder(FP2, keccak256(abi.encode(salt)), 2, 0);
        uint256 id = _openAs(ch, p);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, declared < 3 ? declared : 3);
        for (uint256 i = 0; i < ms.length; i++) {
            bool inPool = false;
            for (uint256 j = 0; j < 4; j++) {
                if (ms[i].account == verifiers[j] && mask & (1 << j) != 0) inPool = true;
            }
            vm.assertTrue(inPool, "a declared verifier");
        }
    }
}
