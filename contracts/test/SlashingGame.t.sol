// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ChallengeManager} from "../src/ChallengeManager.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManagerErrors} from "../src/errors/ChallengeManagerErrors.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";

/// @dev Issue 13 ("Soundness of the slashing game"): each attack, replayed step by step against
///      the real contracts, must no longer work. Fixture: operator stake 20, slashAmount 10,
///      bond 1, α 20 %, β 30 %, τ 2/3, committee 3, 4 verifiers of 5, penalty 0.5, publication
///      deadline 1 h, response period 1 h.
contract SlashingGameTest is Fixture {
    address internal constant OPERATOR_ALT = address(0xA17); // the operator's second address

    function setUp() public override {
        super.setUp();
        vm.deal(OPERATOR_ALT, 100 ether);
    }

    function _fraud(Posted memory p) internal returns (uint256 id) {
        id = open(p);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(ms.length, OTHER_OUT));
        cm.resolve(id);
    }

    // ---- attack 1: self-claims lock the stake, fraud slashed for 0 -----------------------

    /// The operator self-claims its fraudulent receipt and another one (liabilities 20 = its
    /// whole stake) before a real challenge opens. The challenge still opens, records its own
    /// full liability, and the proven fraud costs exactly slashAmount; the self-claims are
    /// answered and take nothing.
    function test_attack1_selfClaimsDoNotShieldFraud_succeeds() public {
        Posted memory fraud = postBatch(HONEST_OUT, 4, 1);
        Posted memory other = postBatch(keccak256("another batch"), 4, 2);
        vm.warp(block.timestamp + 1 hours + 1); // past the publication deadline
        vm.startPrank(OPERATOR_ALT);
        uint256 c1 = cm.claimUnpublished{value: 1 ether}(fraud.receipt, fraud.signature);
        uint256 c2 = cm.claimUnpublished{value: 1 ether}(other.receipt, other.signature);
        vm.stopPrank();
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 20 ether, "self-claims hold 20");

        uint256 id = open(fraud); // not blocked by the live claim on the same receipt
        vm.assertEq(uint256(cm.challenge(id).lockedStake), 10 ether, "full liability, not what was free");
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 30 ether);

        // The operator answers its own claims in time (bond back to itself).
        vm.startPrank(operator);
        cm.answerUnpublished(c1, fraud.root, fraud.index, fraud.proof);
        cm.answerUnpublished(c2, other.root, other.index, other.proof);
        vm.stopPrank();

        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(ms.length, OTHER_OUT));
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "fraud cost exactly slashAmount");
        vm.assertEq(cm.credits(challenger), 1 ether + 2 ether, "bond + alpha of 10");
        vm.assertTrue(cm.receiptState(digestOf(fraud.receipt)).slashed, "marked: stake taken");
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 0);
    }

    /// Same, but the self-claims stay live until after the fraud is slashed: the amount is
    /// still slashAmount (liabilities are not shared or first-come).
    function test_attack1_selfClaimsLiveDuringSlash_fullAmount_succeeds() public {
        Posted memory fraud = postBatch(HONEST_OUT, 4, 1);
        vm.warp(block.timestamp + 1 hours + 1);
        uint256 id = open(fraud);
        vm.prank(OPERATOR_ALT);
        uint256 c1 = cm.claimUnpublished{value: 1 ether}(fraud.receipt, fraud.signature);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        // Everyone commits, so reveals open at once; all revealed, so resolve at once.
        for (uint256 i = 0; i < ms.length; i++) {
            bytes32 commitment = cm.voteCommitment(id, ms[i].account, OTHER_OUT, bytes32(i + 1));
            vm.prank(ms[i].account);
            cm.commitVote(id, commitment);
        }
        for (uint256 i = 0; i < ms.length; i++) {
            vm.prank(ms[i].account);
            cm.revealVote(id, OTHER_OUT, bytes32(i + 1));
        }
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 20 ether, "claim + challenge live");
        cm.resolve(id);
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "exactly slashAmount");
        vm.assertTrue(block.timestamp <= cm.claim(c1).responseDeadline, "claim still live");
        vm.prank(operator);
        cm.answerUnpublished(c1, fraud.root, fraud.index, fraud.proof);
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "the answered claim took nothing");
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 0);
    }

    /// Three frauds proven against 20 of stake: two take 10 each; the third finds nothing, so
    /// its receipt is NOT marked slashed and can be challenged again once the operator re-bonds.
    function test_attack1_noStakeLeft_receiptNotMarked_succeeds() public {
        Posted memory first = postBatch(HONEST_OUT, 2, 0);
        Posted memory second = postBatch(keccak256("b"), 2, 0);
        Posted memory third = postBatch(keccak256("c"), 2, 1);
        uint256 a = _fraud(first);
        uint256 b = _fraud(second);
        uint256 c = _fraud(third);
        vm.assertEq(uint256(cm.challenge(a).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(cm.challenge(b).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(cm.challenge(c).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 0);
        vm.assertFalse(cm.receiptState(digestOf(third.receipt)).slashed, "nothing taken: not marked");
        vm.prank(operator);
        stakes.bond{value: 20 ether}();
        uint256 again = _fraud(third);
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "slashed on re-challenge");
        vm.assertTrue(cm.receiptState(digestOf(third.receipt)).slashed, "marked");
        vm.assertTrue(again != c, "a new challenge");
    }

    // ---- attack 2: committee steering after the seed is public --------------------------

    /// A coalition with 3/7 of the verifier stake learns the seed (the target block is mined)
    /// and grinds wei-sized unbonds before calling drawCommittee. Under the old rule (live
    /// weights) the committee changes from trial to trial; now every trial draws the committee
    /// of the weights at the open block.
    function test_attack2_unbondGrindingAfterSeed_doesNotMoveCommittee_succeeds() public {
        // Honest: verifiers[0..3] with 5 each (20). Coalition: 3 accounts with 5 each (15 of 35 = 3/7).
        address[] memory coalition = new address[](3);
        for (uint256 i = 0; i < 3; i++) {
            coalition[i] = address(uint160(0xBAD000 + i));
            vm.deal(coalition[i], 10 ether);
            vm.prank(coalition[i]);
            stakes.register{value: 5 ether}(IStakeRegistryTypes.Role.Verifier);
        }
        vm.roll(block.number + 1);
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 id = open(p);
        uint256 target = cm.challenge(id).targetBlock;
        vm.roll(target + 1); // the seed blockhash(target) is now public
        bytes32 seed = keccak256(abi.encode(blockhash(target), id));

        uint256 base = vm.snapshotState();
        address[] memory baseline = _members(id, coalition, 0);
        vm.revertToState(base);
        bool liveRuleMoved = false;
        address[] memory liveFirst;
        for (uint256 trial = 1; trial <= 16; trial++) {
            uint256 snap = vm.snapshotState();
            for (uint256 i = 0; i < 3; i++) {
                vm.prank(coalition[i]);
                stakes.requestUnbond(uint128(trial * 7919 * (i + 1))); // a few wei, ground offline
            }
            address[] memory got = _members(id, coalition, trial);
            vm.assertEq(got.length, baseline.length);
            for (uint256 j = 0; j < got.length; j++) {
                vm.assertEq(got[j], baseline[j], "committee moved");
            }
            // What the old rule (live weights at draw time) would have drawn.
            address[] memory live = _liveRuleDraw(seed, coalition);
            if (trial == 1) liveFirst = live;
            else if (keccak256(abi.encode(live)) != keccak256(abi.encode(liveFirst))) liveRuleMoved = true;
            vm.revertToState(snap);
        }
        vm.assertTrue(liveRuleMoved, "the grinding did move committees under the live-weight rule");
    }

    function _members(uint256 id, address[] memory, uint256) internal returns (address[] memory out) {
        cm.drawCommittee(id);
        IChallengeManagerTypes.Member[] memory ms = cm.committee(id);
        out = new address[](ms.length);
        for (uint256 i = 0; i < ms.length; i++) {
            out[i] = ms[i].account;
        }
    }

    /// @dev Reference draw over the *current* weights (the pre-fix rule), slot order.
    function _liveRuleDraw(bytes32 seed, address[] memory coalition) internal view returns (address[] memory out) {
        address[] memory all = new address[](verifiers.length + coalition.length);
        uint256[] memory w = new uint256[](all.length);
        uint256[] memory slot = new uint256[](all.length);
        uint256 pool = 0;
        for (uint256 i = 0; i < all.length; i++) {
            all[i] = i < verifiers.length ? verifiers[i] : coalition[i - verifiers.length];
            w[i] = stakes.weightOf(all[i]);
            slot[i] = stakes.accountOf(all[i]).slot;
            pool += w[i];
        }
        out = new address[](3);
        for (uint256 nonce = 0; nonce < 3; nonce++) {
            uint256 x = uint256(keccak256(abi.encode(seed, nonce))) % pool;
            for (uint256 s = 1; s <= all.length + 1; s++) {
                for (uint256 i = 0; i < all.length; i++) {
                    if (slot[i] != s) continue;
                    if (x < w[i]) {
                        out[nonce] = all[i];
                        pool -= w[i];
                        w[i] = 0;
                        x = type(uint256).max; // done
                    } else if (x != type(uint256).max) {
                        x -= w[i];
                    }
                }
            }
        }
    }

    /// Weights written after the open block never reach the open block's snapshot, even when
    /// the same account leaves and another takes its slot.
    function test_attack2_slotReuseAfterOpen_keepsSnapshotOwner_succeeds() public {
        // verifiers[0] leaves the fingerprint's pool first (a declared verifier cannot unbond
        // below the minimum); the others cover the receipt.
        vm.prank(verifiers[0]);
        stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        vm.warp(block.timestamp + config.maxDisputeSpan(config.params()) + stakes.coverageNotice());
        stakes.completeUndeclare(verifiers[0], FINGERPRINT, MODEL);
        vm.roll(block.number + 1);
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        uint256 openBlock = block.number;
        uint256 slot0 = stakes.accountOf(verifiers[0]).slot;
        vm.roll(block.number + 1);
        vm.prank(verifiers[0]);
        stakes.requestUnbond(5 ether); // leaves: slot freed
        address newcomer = address(0xD00D);
        vm.deal(newcomer, 9 ether);
        vm.prank(newcomer);
        stakes.register{value: 9 ether}(IStakeRegistryTypes.Role.Verifier); // takes the freed slot
        vm.prank(newcomer);
        stakes.declareFingerprint(FINGERPRINT, MODEL);
        vm.assertEq(uint256(stakes.accountOf(newcomer).slot), slot0);
        (address owner, uint256 w) = stakes.slotAt(slot0, openBlock);
        vm.assertEq(owner, verifiers[0]);
        vm.assertEq(w, 5 ether);
        vm.assertEq(stakes.totalWeightAt(openBlock), 20 ether);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        for (uint256 i = 0; i < ms.length; i++) {
            vm.assertTrue(ms[i].account != newcomer, "registered after open: not drawable");
            vm.assertEq(uint256(ms[i].weight), 5 ether);
        }
    }

    // ---- attack 3: the verifier list filled for free -------------------------------------

    /// 300 throwaway accounts register, unbond and withdraw (capital back after the unbonding
    /// period). Their slots are released as they leave; an honest verifier registers after.
    function test_attack3_throwawayVerifiers_doNotFillList_succeeds() public {
        for (uint256 i = 0; i < 300; i++) {
            address t = address(uint160(0x7000000 + i));
            vm.deal(t, 1 ether);
            vm.startPrank(t);
            stakes.register{value: 1 ether}(IStakeRegistryTypes.Role.Verifier);
            stakes.requestUnbond(1 ether);
            vm.stopPrank();
        }
        vm.assertEq(stakes.verifierCount(), 4, "leavers hold no slot");
        vm.assertLe(stakes.slotsUsed(), 5, "slots reused");
        vm.warp(block.timestamp + 2 days);
        vm.prank(address(uint160(0x7000000)));
        stakes.withdraw();
        address honest = address(0xD00D);
        vm.deal(honest, 1 ether);
        vm.prank(honest);
        stakes.register{value: 1 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.assertEq(stakes.verifierCount(), 5);
    }

    /// The draw's cost does not grow with the number of verifiers (1,000 vs 4).
    function test_attack3_drawCostIndependentOfVerifierCount_succeeds() public {
        vm.roll(block.number + 1);
        uint256 small = _drawGas();
        for (uint256 i = 0; i < 996; i++) {
            address t = address(uint160(0x8000000 + i));
            vm.deal(t, 1 ether);
            vm.prank(t);
            stakes.register{value: 1 ether}(IStakeRegistryTypes.Role.Verifier);
        }
        vm.assertEq(stakes.verifierCount(), 1000);
        vm.roll(block.number + 1);
        uint256 large = _drawGas();
        vm.assertLe(large, small * 2, "draw over 1000 verifiers within 2x of 4 verifiers");
    }

    function _drawGas() internal view returns (uint256 used) {
        uint256 g = gasleft();
        stakes.drawCommittee(
            stakes.ALL_VERIFIERS(), keccak256(abi.encode(block.number)), block.number - 1, 3, address(0)
        );
        used = g - gasleft();
    }

    // ---- attack 4: receipts that can never be claimed ------------------------------------

    /// issuedAt = 2^64 - 1 used to overflow issuedAt + publicationDeadline (uint64) and could
    /// never be claimed. A receipt dated beyond now + MAX_CLOCK_SKEW is invalid on its face:
    /// the claim slashes at once.
    function test_attack4_maxIssuedAt_claimSlashesAtOnce_succeeds() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 77);
        r.issuedAt = type(uint64).max;
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        vm.assertEq(uint256(cm.claim(id).status), uint256(IChallengeManagerTypes.ClaimStatus.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether);
        vm.assertEq(cm.credits(challenger), 3 ether);
        vm.assertTrue(cm.receiptState(digestOf(r)).slashed, "marked");
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 0);
    }

    function test_attack4_issuedAtOneDayAhead_claimSlashesAtOnce_succeeds() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 78);
        r.issuedAt = uint64(block.timestamp + 1 days);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        vm.assertEq(uint256(cm.claim(id).status), uint256(IChallengeManagerTypes.ClaimStatus.Slashed));
    }

    /// Within the skew a receipt is ordinary: the publication deadline runs from issuedAt.
    function test_attack4_issuedAtWithinSkew_normalDeadline_reverts() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 79);
        r.issuedAt = uint64(block.timestamp + 5 minutes);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.PublicationDeadlineNotPassed.selector,
                digestOf(r),
                uint256(r.issuedAt) + 1 hours,
                block.timestamp
            )
        );
        cm.claimUnpublished{value: 1 ether}(r, sig);
    }

    /// A batched receipt dated after its batch's commit (beyond the skew) is slashed at open.
    function test_attack4_batchedFutureReceipt_slashedAtOpen_succeeds() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 80);
        r.issuedAt = type(uint64).max;
        bytes32[] memory ds = new bytes32[](1);
        ds[0] = digestOf(r);
        vm.prank(operator);
        batches.commitBatch(merkleRoot(ds), 1, "da://local/0x00");
        vm.prank(challenger);
        uint256 id =
            cm.openChallenge{value: 1 ether}(r, signReceipt(OPERATOR_KEY, r), merkleRoot(ds), 0, new bytes32[](0));
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether);
    }

    // ---- attack 6: forced abstention -----------------------------------------------------

    /// The operator makes the evidence unusable; every member reveals INVALID_EVIDENCE. That is
    /// a reveal (no penalty) and, at quorum, slashes the operator.
    function test_attack6_invalidEvidenceVotes_slashOperator_noPenalty_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        uint256[] memory before = new uint256[](ms.length);
        for (uint256 i = 0; i < ms.length; i++) {
            before[i] = stakes.accountOf(ms[i].account).stake;
        }
        commitAndReveal(id, ms, allSame(ms.length, cm.INVALID_EVIDENCE()));
        cm.resolve(id);
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(c.majorityOutHash, cm.INVALID_EVIDENCE());
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether);
        for (uint256 i = 0; i < ms.length; i++) {
            vm.assertEq(uint256(stakes.accountOf(ms[i].account).stake), before[i], "no non-reveal penalty");
            vm.assertEq(uint256(stakes.accountOf(ms[i].account).locked), 0);
            vm.assertGe(cm.credits(ms[i].account), 1, "share of beta");
        }
    }

    /// Members who computed another output and members who could not use the evidence are
    /// together against the receipt.
    function test_attack6_mixedAltAndInvalidEvidence_slashes_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32[] memory outs = allSame(ms.length, OTHER_OUT);
        outs[0] = cm.INVALID_EVIDENCE();
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(c.majorityOutHash, OTHER_OUT);
    }

    /// A receipt whose outHash is the reserved INVALID_EVIDENCE value would turn those votes
    /// into dismissals: it is invalid and slashed at open.
    function test_attack6_receiptClaimingInvalidEvidence_slashedAtOpen_succeeds() public {
        uint256 id = open(postBatch(cm.INVALID_EVIDENCE(), 2, 0));
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether);
    }

    function test_invalidEvidence_constant_succeeds() public view {
        vm.assertEq(cm.INVALID_EVIDENCE(), keccak256("verinfer.vote.invalid-evidence"));
    }
}
