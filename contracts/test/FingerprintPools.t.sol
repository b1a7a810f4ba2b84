// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {PoolKey} from "../src/lib/PoolKey.sol";
import {TwoFingerprints} from "./utils/TwoFingerprints.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";
import {IStakeRegistryErrors} from "../src/errors/StakeRegistryErrors.sol";

/// @dev Committees drawn from the verifiers declared for the receipt's engine fingerprint
///      (docs/contracts.md "Fingerprint pools"). The fixture's 4 verifiers declare FINGERPRINT;
///      FP2 is a second approved fingerprint (an image upgrade) that only `fp2Verifier` runs.
contract FingerprintPoolsTest is TwoFingerprints {
    address internal fp2Verifier = address(0xF2F2);

    function setUp() public override {
        super.setUp();
        vm.deal(fp2Verifier, 100 ether);
    }

    /// Undeclaring keeps a verifier drawable this long.
    function _span() internal view returns (uint256) {
        return config.maxDisputeSpan(config.params()) + stakes.coverageNotice();
    }

    /// 3 ether: 13% of all verifier weight (23 ether), over the fixture's 10% coverage share.
    function _registerFp2Verifier() internal {
        vm.prank(fp2Verifier);
        stakes.register{value: 3 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(fp2Verifier);
        stakes.declareFingerprint(FP2, MODEL);
    }

    // ---- declarations: unit ----------------------------------------------------------------

    function test_declareFingerprint_entersPoolAndCoverage_succeeds() public {
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), 4);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), uint64(block.timestamp)), 0);
        _registerFp2Verifier();
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), uint64(block.timestamp)), 1);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FP2, MODEL), uint64(block.timestamp - 1)), 0, "checkpointed by time");
        vm.roll(block.number + 1);
        vm.assertEq(stakes.poolWeightAt(PoolKey.key(FP2, MODEL), block.number - 1), 3 ether);
        vm.assertEq(stakes.poolWeightAt(PoolKey.key(FINGERPRINT, MODEL), block.number - 1), 20 ether);
        (bytes32[] memory fps, uint64[] memory leaveAt) = stakes.declarationsOf(fp2Verifier);
        vm.assertEq(fps.length, 1);
        vm.assertEq(fps[0], PoolKey.key(FP2, MODEL));
        vm.assertEq(uint256(leaveAt[0]), 0);
    }

    function test_declareFingerprint_unapproved_reverts() public {
        bytes32 fp = keccak256("never approved");
        vm.prank(verifiers[0]);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.FingerprintNotApproved.selector, fp));
        stakes.declareFingerprint(fp, MODEL);
    }

    function test_declareFingerprint_allVerifiersKey_reverts() public {
        vm.prank(verifiers[0]);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.FingerprintNotApproved.selector, bytes32(0)));
        stakes.declareFingerprint(bytes32(0), MODEL);
    }

    function test_declareFingerprint_notVerifier_reverts() public {
        vm.prank(operator);
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.NotVerifier.selector, operator));
        stakes.declareFingerprint(FINGERPRINT, MODEL);
    }

    function test_declareFingerprint_twice_reverts() public {
        vm.prank(verifiers[0]);
        vm.expectRevert(
            abi.encodeWithSelector(
                IStakeRegistryErrors.AlreadyDeclared.selector, verifiers[0], PoolKey.key(FINGERPRINT, MODEL)
            )
        );
        stakes.declareFingerprint(FINGERPRINT, MODEL);
    }

    function test_declareFingerprint_tooMany_reverts() public {
        vm.startPrank(verifiers[0]);
        for (uint256 i = 0; i < 3; i++) {
            bytes32 fp = keccak256(abi.encode("extra", i));
            vm.stopPrank();
            config.approve(IProtocolConfigTypes.Kind.EngineFingerprint, fp);
            vm.startPrank(verifiers[0]);
            stakes.declareFingerprint(fp, MODEL);
        }
        vm.expectRevert(abi.encodeWithSelector(IStakeRegistryErrors.TooManyDeclarations.selector, verifiers[0], 4));
        stakes.declareFingerprint(FP2, MODEL);
        vm.stopPrank();
    }

    function test_undeclareFingerprint_notDeclared_reverts() public {
        vm.prank(verifiers[0]);
        vm.expectRevert(
            abi.encodeWithSelector(IStakeRegistryErrors.NotDeclared.selector, verifiers[0], PoolKey.key(FP2, MODEL))
        );
        stakes.undeclareFingerprint(FP2, MODEL);
    }

    function test_undeclareFingerprint_twice_reverts() public {
        vm.prank(verifiers[0]);
        uint64 leaveAt = stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        vm.assertEq(uint256(leaveAt), block.timestamp + _span());
        vm.prank(verifiers[0]);
        vm.expectRevert(
            abi.encodeWithSelector(
                IStakeRegistryErrors.AlreadyLeaving.selector, verifiers[0], PoolKey.key(FINGERPRINT, MODEL), leaveAt
            )
        );
        stakes.undeclareFingerprint(FINGERPRINT, MODEL);
    }

    function test_completeUndeclare_beforeDelay_reverts() public {
        vm.prank(verifiers[0]);
        uint64 leaveAt = stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        vm.warp(leaveAt - 1);
        vm.expectRevert(
            abi.encodeWithSelector(
                IStakeRegistryErrors.UndeclareNotReady.selector,
                verifiers[0],
                PoolKey.key(FINGERPRINT, MODEL),
                leaveAt,
                leaveAt - 1
            )
        );
        stakes.completeUndeclare(verifiers[0], FINGERPRINT, MODEL);
    }

    function test_completeUndeclare_neverRequested_reverts() public {
        vm.expectRevert(
            abi.encodeWithSelector(
                IStakeRegistryErrors.UndeclareNotReady.selector,
                verifiers[0],
                PoolKey.key(FINGERPRINT, MODEL),
                0,
                block.timestamp
            )
        );
        stakes.completeUndeclare(verifiers[0], FINGERPRINT, MODEL);
    }

    function test_undeclare_coverageDropsAtOnce_poolAfterDelay_succeeds() public {
        vm.prank(verifiers[0]);
        uint64 leaveAt = stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        vm.assertEq(
            stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), 3, "stops counting at once"
        );
        vm.roll(block.number + 1);
        vm.assertEq(stakes.poolWeightAt(PoolKey.key(FINGERPRINT, MODEL), block.number - 1), 20 ether, "still drawable");
        vm.warp(leaveAt);
        stakes.completeUndeclare(verifiers[0], FINGERPRINT, MODEL); // anyone may
        vm.roll(block.number + 1);
        vm.assertEq(stakes.poolWeightAt(PoolKey.key(FINGERPRINT, MODEL), block.number - 1), 15 ether);
        (bytes32[] memory fps,) = stakes.declarationsOf(verifiers[0]);
        vm.assertEq(fps.length, 0);
    }

    /// A receipt relies on the coverage COVERAGE_NOTICE before its issuedAt: a verifier that
    /// leaves cannot race an operator that checked just before signing, and a new declaration
    /// covers receipts only after the notice.
    function test_isCoveredAt_readsCoverageNoticeEarlier_succeeds() public {
        uint64 notice = stakes.coverageNotice();
        _registerFp2Verifier();
        uint64 t = uint64(block.timestamp);
        vm.assertFalse(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t), "not yet: declared less than the notice ago");
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t + notice), "covered after the notice");
        vm.warp(t + 100);
        vm.prank(fp2Verifier);
        stakes.undeclareFingerprint(FP2, MODEL);
        vm.assertTrue(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t + notice + 99), "what the operator saw stays");
        vm.assertFalse(
            stakes.isCoveredAt(PoolKey.key(FP2, MODEL), t + notice + 100), "left: receipts from here on are uncovered"
        );
        vm.assertFalse(stakes.isCoveredAt(PoolKey.key(FP2, MODEL), notice - 1), "no underflow");
    }

    function test_redeclare_cancelsPendingUndeclare_succeeds() public {
        vm.startPrank(verifiers[0]);
        stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        stakes.declareFingerprint(FINGERPRINT, MODEL);
        vm.stopPrank();
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), 4);
        (, uint64[] memory leaveAt) = stakes.declarationsOf(verifiers[0]);
        vm.assertEq(uint256(leaveAt[0]), 0);
    }

    function test_requestUnbond_belowMinimumWhileDeclared_reverts() public {
        vm.prank(verifiers[0]);
        vm.expectRevert(
            abi.encodeWithSelector(
                IStakeRegistryErrors.DeclaredVerifierBelowMinimum.selector, verifiers[0], 1, 0.5 ether, 1 ether
            )
        );
        stakes.requestUnbond(4.5 ether);
        vm.prank(verifiers[0]);
        stakes.requestUnbond(4 ether); // down to the minimum: allowed
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), 4);
    }

    function test_bond_movesWeightInEveryDeclaredPool_succeeds() public {
        vm.prank(verifiers[0]);
        stakes.declareFingerprint(FP2, MODEL);
        vm.prank(verifiers[0]);
        stakes.bond{value: 3 ether}();
        vm.roll(block.number + 1);
        vm.assertEq(stakes.poolWeightAt(PoolKey.key(FINGERPRINT, MODEL), block.number - 1), 23 ether);
        vm.assertEq(stakes.poolWeightAt(PoolKey.key(FP2, MODEL), block.number - 1), 8 ether);
        vm.assertEq(stakes.totalWeightAt(block.number - 1), 23 ether);
    }

    // ---- attack: sign under the less-covered fingerprint -----------------------------------

    /// Before: FP2 approved, nobody declared for it. A tampered receipt under FP2 drew its
    /// committee from all verifiers (who run FINGERPRINT and abstain): Inconclusive, free fraud.
    /// Now: coverage at issuedAt is 0, the receipt is invalid on its face, slashed at open.
    function test_attackLowCoverage_uncoveredFingerprint_slashedAtOpen_succeeds() public {
        Posted memory p = postUnder(FP2, OTHER_OUT, 2, 1);
        uint256 stakeBefore = stakes.accountOf(operator).stake;
        uint256 id = open(p);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(stakes.accountOf(operator).stake, stakeBefore - 10 ether);
    }

    /// FP2 covered by one verifier (5 on FINGERPRINT). Every committee of an FP2 receipt is drawn
    /// from FP2's pool only, so the one verifier able to judge it judges it: the tampered receipt
    /// is slashed. Over the whole verifier set (the old draw) the committee is mostly verifiers
    /// who abstain on FP2, and short of quorum.
    function test_attackLowCoverage_tamperedReceipt_slashedNotInconclusive_succeeds() public {
        _registerFp2Verifier();
        vm.roll(block.number + 1);
        vm.warp(block.timestamp + stakes.coverageNotice()); // receipts rely on it from now on
        Posted memory p = postUnder(FP2, HONEST_OUT, 2, 0); // the receipt claims HONEST_OUT
        uint256 id = open(p);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 1);
        vm.assertEq(ms[0].account, fp2Verifier);
        // The pre-fix draw over all verifiers at the same snapshot and seed.
        (address[] memory all,,) = stakes.drawCommittee(
            stakes.ALL_VERIFIERS(),
            keccak256(abi.encode(blockhash(cm.challenge(id).targetBlock), id)),
            cm.challenge(id).snapshotBlock,
            3,
            challenger
        );
        uint256 able = 0;
        for (uint256 i = 0; i < all.length; i++) {
            if (all[i] == fp2Verifier) able++;
        }
        vm.assertLe(able * 2, all.length, "the old committee was mostly unable to judge FP2");
        bytes32[] memory outs = new bytes32[](1);
        outs[0] = OTHER_OUT; // what FP2 really gives
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
    }

    // ---- attack: declare after the seed is public -----------------------------------------

    /// A coalition sees blockhash(targetBlock) and registers + declares heavy verifiers before
    /// anyone calls drawCommittee. The draw reads FINGERPRINT's pool at the open block: none of
    /// them is ever drawn, whatever their weight; at a later snapshot they would dominate.
    function test_attackGrinding_declareAfterSeed_neverDrawn_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 id = open(p);
        vm.roll(cm.challenge(id).targetBlock + 1); // the seed is public now
        address[] memory coalition = new address[](8);
        for (uint256 i = 0; i < coalition.length; i++) {
            coalition[i] = address(uint160(0xBAD000 + i));
            vm.deal(coalition[i], 60 ether);
            vm.prank(coalition[i]);
            stakes.register{value: 50 ether}(IStakeRegistryTypes.Role.Verifier);
            vm.prank(coalition[i]);
            stakes.declareFingerprint(FINGERPRINT, MODEL);
        }
        bytes32 seed = keccak256(abi.encode(blockhash(cm.challenge(id).targetBlock), id));
        vm.roll(block.number + 1);
        (address[] memory live,,) =
            stakes.drawCommittee(PoolKey.key(FINGERPRINT, MODEL), seed, block.number - 1, 3, challenger);
        uint256 coalitionSeatsLive = 0;
        for (uint256 i = 0; i < live.length; i++) {
            if (uint160(live[i]) >= 0xBAD000 && uint160(live[i]) < 0xBAD008) coalitionSeatsLive++;
        }
        vm.assertGe(coalitionSeatsLive, 2, "a live-state draw would hand the coalition a majority");
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3);
        for (uint256 i = 0; i < ms.length; i++) {
            vm.assertTrue(uint160(ms[i].account) < 0xBAD000 || uint160(ms[i].account) >= 0xBAD008, "coalition drawn");
            vm.assertEq(uint256(ms[i].weight), 5 ether);
        }
    }

    // ---- attack: undeclare to dodge --------------------------------------------------------

    /// Every FINGERPRINT verifier tries to leave right after the open (e.g. a verifier who
    /// would have to vote against a partner operator): the committee is the same, and a member
    /// who then does not reveal pays the non-reveal penalty like any abstainer.
    function test_attackDodge_undeclareAfterOpen_stillDrawnAndPenalized_succeeds() public {
        Posted memory p = postBatch(OTHER_OUT, 2, 0);
        uint256 id = open(p);
        uint256 snap = vm.snapshotState();
        IChallengeManagerTypes.Member[] memory reference_ = draw(id);
        vm.revertToState(snap);
        vm.roll(block.number + 1);
        for (uint256 i = 0; i < verifiers.length; i++) {
            vm.prank(verifiers[i]);
            stakes.undeclareFingerprint(FINGERPRINT, MODEL);
            vm.expectRevert(); // cannot leave the pool before the delay, nor unbond below minimum
            stakes.completeUndeclare(verifiers[i], FINGERPRINT, MODEL);
            vm.prank(verifiers[i]);
            vm.expectRevert();
            stakes.requestUnbond(5 ether);
        }
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, reference_.length);
        for (uint256 i = 0; i < ms.length; i++) {
            vm.assertEq(ms[i].account, reference_[i].account);
        }
        address dodger = ms[0].account;
        uint256 stakeBefore = stakes.accountOf(dodger).stake;
        bytes32[] memory outs = allSame(ms.length, HONEST_OUT);
        outs[0] = bytes32(0); // the dodger does not reveal
        commitAndReveal(id, ms, outs);
        vm.warp(cm.challenge(id).revealDeadline + 1);
        cm.resolve(id);
        vm.assertEq(stakes.accountOf(dodger).stake, stakeBefore - 0.5 ether, "non-reveal penalty");
    }

    // ---- attack: honest operator after verifiers leave -------------------------------------

    /// The receipt was signed while FINGERPRINT was covered; then every verifier requests to
    /// leave. A challenge late in the window is not an invalid receipt (coverage is read at
    /// issuedAt) and the leaving verifiers, still drawable, dismiss it: the honest operator keeps
    /// its stake. A receipt signed after they all asked to leave is uncovered: slashed at open.
    function test_attackHonestOperator_verifiersLeaveAfterSigning_notSlashed_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.warp(block.timestamp + 1);
        for (uint256 i = 0; i < verifiers.length; i++) {
            vm.prank(verifiers[i]);
            stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        }
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp)), 0);
        vm.assertEq(stakes.coverageAt(PoolKey.key(FINGERPRINT, MODEL), p.receipt.issuedAt), 4);
        vm.warp(block.timestamp + 1 days - 10); // the challenge window's end
        vm.roll(block.number + 1);
        uint256 stakeBefore = stakes.accountOf(operator).stake;
        uint256 id = open(p);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3);
        commitAndReveal(id, ms, allSame(ms.length, HONEST_OUT));
        cm.resolve(id);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(stakes.accountOf(operator).stake, stakeBefore);

        Posted memory late = postBatch(OTHER_OUT, 2, 1); // signed with coverage 0
        uint256 id2 = open(late);
        vm.assertEq(uint256(_status(id2)), uint256(IChallengeManagerTypes.Status.Slashed));
    }

    // ---- fuzz ------------------------------------------------------------------------------

    /// Any subset of verifiers declared for FP2 (by a mask), any seed: every drawn member held
    /// weight in FP2's pool at the snapshot and had declared FP2.
    function testFuzz_drawnMembersDeclaredAtSnapshot(uint8 mask, bytes32 seed, uint8 leaveMask) public {
        mask = uint8(bound(mask, 1, 15));
        for (uint256 i = 0; i < 4; i++) {
            if (mask & (1 << i) == 0) continue;
            vm.prank(verifiers[i]);
            stakes.declareFingerprint(FP2, MODEL);
        }
        vm.roll(block.number + 1);
        uint256 snapshot = block.number - 1;
        // After the snapshot: some declared ones ask to leave, the rest declare.
        for (uint256 i = 0; i < 4; i++) {
            bool declared_ = mask & (1 << i) != 0;
            if (declared_ && leaveMask & (1 << i) == 0) continue;
            vm.prank(verifiers[i]);
            if (declared_) stakes.undeclareFingerprint(FP2, MODEL);
            else stakes.declareFingerprint(FP2, MODEL);
        }
        vm.roll(block.number + 1);
        (address[] memory ms,,) = stakes.drawCommittee(PoolKey.key(FP2, MODEL), seed, snapshot, 3, address(0));
        uint256 declared = 0;
        for (uint256 i = 0; i < 4; i++) {
            if (mask & (1 << i) != 0) declared++;
        }
        vm.assertEq(ms.length, declared < 3 ? declared : 3);
        for (uint256 m = 0; m < ms.length; m++) {
            bool found = false;
            for (uint256 i = 0; i < 4; i++) {
                if (ms[m] == verifiers[i] && mask & (1 << i) != 0) found = true;
            }
            vm.assertTrue(found, "drawn but not declared at the snapshot");
        }
    }
}
