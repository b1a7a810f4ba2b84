// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {TwoFingerprints} from "./utils/TwoFingerprints.sol";
import {Vm} from "./utils/Test.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManagerErrors} from "../src/errors/ChallengeManagerErrors.sol";
import {IProtocolConfigErrors} from "../src/errors/ProtocolConfigErrors.sol";
import {IAuditLogErrors} from "../src/errors/AuditLogErrors.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";

/// @dev Issue 31 ("the slashing game: no honest party pays, no fraud escapes"): each finding,
///      replayed against the real contracts. Every test here fails on the contracts before the
///      fix (named in its comment). Fixture: operator stake 20, slashAmount 10, bond 1, τ 6666,
///      committee 3, 4 verifiers of 5 declared for FINGERPRINT, penalty 0.5, publication
///      deadline 1 h, claim window 1 day.
contract NoHonestPaysTest is TwoFingerprints {
    // ---- finding 1: claims had no upper age ----------------------------------------------

    /// A receipt signed long ago (past publicationDeadline + claimWindow) can no longer be
    /// claimed unpublished (before: any receipt ever signed could be, at any age).
    function test_claimUnpublished_afterClaimWindow_reverts() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 31);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        uint256 claimBy = uint256(r.issuedAt) + 1 hours + 1 days;
        vm.warp(claimBy + 1);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.ClaimWindowClosed.selector, digestOf(r), claimBy, claimBy + 1
            )
        );
        cm.claimUnpublished{value: 1 ether}(r, sig);
    }

    /// The last second of the window still opens a claim.
    function test_claimUnpublished_lastSecondOfClaimWindow_succeeds() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 32);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1 days);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        vm.assertEq(uint256(cm.claim(id).status), uint256(IChallengeManagerTypes.ClaimStatus.Open));
    }

    function test_setParams_claimWindowOverChallengeWindow_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.claimWindow = p.challengeWindow + 1;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.InvalidParams.selector, "claimWindow not in [1, challengeWindow]"
            )
        );
        config.setParams(p);
    }

    // ---- finding 2: one seat blocked a proven fraud for free -----------------------------

    /// τ = 6667 with a committee of 3 made two equal honest votes (6666.67%) short of quorum.
    function test_setParams_oneSeatBlocksQuorum_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.quorumBps = 6667;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.InvalidParams.selector, "quorumBps > (committeeSize - 1) / committeeSize"
            )
        );
        config.setParams(p);
    }

    /// Two equal members reveal the true output, one colluding member reveals the receipt's:
    /// the fraud is slashed (before: Inconclusive) and the colluder pays the penalty (before: it
    /// revealed, so it paid nothing); the two honest members pay nothing.
    function test_resolve_oneColludingSeat_fraudSlashedColluderPays_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0)); // the receipt claims HONEST_OUT; true output is OTHER_OUT
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3);
        bytes32[] memory outs = allSame(3, OTHER_OUT);
        outs[2] = HONEST_OUT; // the colluder "matches" the fraudulent receipt
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "operator slashed");
        vm.assertEq(uint256(stakes.accountOf(ms[2].account).stake), 4.5 ether, "colluder pays the penalty");
        for (uint256 i = 0; i < 2; i++) {
            vm.assertEq(uint256(stakes.accountOf(ms[i].account).stake), 5 ether, "honest member untouched");
            vm.assertEq(cm.credits(ms[i].account), 1.5 ether, "beta split between the two");
            vm.assertEq(uint256(stakes.accountOf(ms[i].account).locked), 0);
        }
        vm.assertEq(uint256(stakes.accountOf(ms[2].account).locked), 0);
    }

    /// The mirror: an honest receipt, one member reveals another output. Dismissed; that member
    /// pays; a member revealing INVALID_EVIDENCE (the operator's evidence did not reach it) does
    /// not.
    function test_resolve_dismissed_outvotedMemberPays_invalidEvidenceDoesNot_succeeds() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.committeeSize = 4; // 3 of 4 = 7500 >= 6666
        config.setParams(p);
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 4);
        bytes32[] memory outs = allSame(4, HONEST_OUT);
        outs[3] = cm.INVALID_EVIDENCE(); // 3 of 4 on the receipt: 7500 >= 6666
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(uint256(stakes.accountOf(ms[3].account).stake), 5 ether, "INVALID_EVIDENCE not penalized");

        Posted memory q = postBatch(HONEST_OUT, 2, 1);
        uint256 id2 = open(q);
        ms = draw(id2);
        outs = allSame(4, HONEST_OUT);
        outs[0] = OTHER_OUT;
        commitAndReveal(id2, ms, outs);
        uint256 before = stakes.accountOf(ms[0].account).stake;
        cm.resolve(id2);
        vm.assertEq(uint256(cm.challenge(id2).status), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(uint256(stakes.accountOf(ms[0].account).stake), before - 0.5 ether, "outvoted member pays");
        vm.assertEq(uint256(stakes.accountOf(ms[0].account).locked), 0);
    }

    // ---- finding 3: the challenger's exclusion handed the committee to a sybil -----------

    address internal constant H = address(0x4401); // honest, 3 ETH
    address internal constant X = address(0x4402); // sybil, 1 ETH

    /// FP2's pool is H (3 ETH, honest) + X (1 ETH, the operator's sybil). H catches a tampered
    /// receipt and challenges from its registered key. Before: H was excluded, the committee was
    /// {X}, X matched the receipt and the fraud was dismissed. Now H sits: 3/4 of the committee
    /// weight reveals the true output, the operator is slashed and X pays the penalty.
    function test_attackSybilPool_honestChallengerSits_fraudSlashed_succeeds() public {
        vm.deal(H, 10 ether);
        vm.deal(X, 10 ether);
        vm.prank(H);
        stakes.register{value: 3 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(H);
        stakes.declareFingerprint(FP2, MODEL);
        vm.prank(X);
        stakes.register{value: 1 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(X);
        stakes.declareFingerprint(FP2, MODEL);
        vm.warp(block.timestamp + stakes.coverageNotice() + 1);
        vm.roll(block.number + 1);
        Posted memory p = postUnder(FP2, HONEST_OUT, 2, 0);
        vm.prank(H);
        uint256 id = cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.AwaitingDraw), "covered: needs a vote");
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 2, "H and X both sit");
        bytes32[] memory outs = new bytes32[](2);
        for (uint256 i = 0; i < 2; i++) {
            outs[i] = ms[i].account == H ? OTHER_OUT : HONEST_OUT;
        }
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether);
        vm.assertEq(uint256(stakes.accountOf(X).stake), 0.5 ether, "the sybil pays");
        vm.assertEq(uint256(stakes.accountOf(H).stake), 3 ether, "the honest challenger does not");
        vm.assertEq(cm.credits(H), 1 ether + 2 ether + 3 ether, "bond + alpha + all of beta");
    }

    // ---- finding 4: a verifier with 0 stake still counted --------------------------------

    /// A verifier unbonds everything and withdraws: it is no longer a verifier for AuditLog (and
    /// `isVerifier`, which the audit escalation reads). Before: the role alone counted.
    function test_isVerifier_afterUnbondAndWithdraw_false_recordAuditReverts() public {
        address v = address(0x4403);
        vm.deal(v, 10 ether);
        vm.prank(v);
        stakes.register{value: 2 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.assertTrue(stakes.isVerifier(v), "bonded: counts");
        vm.prank(v);
        stakes.requestUnbond(2 ether);
        vm.assertFalse(stakes.isVerifier(v), "unbonding stake is not active");
        vm.warp(block.timestamp + 2 days + 1);
        vm.prank(v);
        stakes.withdraw();
        vm.assertEq(uint256(stakes.accountOf(v).stake), 0);
        vm.assertFalse(stakes.isVerifier(v), "0 stake: does not count");
        vm.prank(v);
        vm.expectRevert(abi.encodeWithSelector(IAuditLogErrors.NotVerifier.selector, v));
        audits.recordAudit(keccak256("r"), HONEST_OUT, true, keccak256("report"));
    }

    /// Below the minimum (not only at 0): 1 ether is the minimum, 0.5 left active.
    function test_isVerifier_belowMinimum_false_succeeds() public {
        address v = address(0x4404);
        vm.deal(v, 10 ether);
        vm.prank(v);
        stakes.register{value: 1.5 ether}(IStakeRegistryTypes.Role.Verifier);
        vm.prank(v);
        stakes.requestUnbond(1 ether);
        vm.assertFalse(stakes.isVerifier(v), "0.5 active < 1 minimum");
    }

    // ---- finding 5: the answer's proof is logged -----------------------------------------

    /// answerUnpublished logs root, leaf index and siblings (before: only the batch id, so a
    /// root whose manifest was never published left the receipt's position unknown).
    function test_answerUnpublished_logsFullProof_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 5, 3);
        vm.warp(uint256(p.receipt.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(p.receipt, p.signature);
        vm.recordLogs();
        vm.prank(operator);
        cm.answerUnpublished(id, p.root, p.index, p.proof);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        bytes32 topic = keccak256("ClaimAnswered(uint256,bytes32,bytes32,uint256,bytes32[])");
        bool seen = false;
        for (uint256 i = 0; i < logs.length; i++) {
            if (logs[i].emitter != address(cm) || logs[i].topics[0] != topic) continue;
            seen = true;
            vm.assertEq(uint256(logs[i].topics[1]), id);
            (bytes32 bid, bytes32 root, uint256 leafIndex, bytes32[] memory siblings) =
                abi.decode(logs[i].data, (bytes32, bytes32, uint256, bytes32[]));
            vm.assertEq(bid, batches.batchId(operator, p.root));
            vm.assertEq(root, p.root);
            vm.assertEq(leafIndex, 3);
            vm.assertEq(siblings.length, p.proof.length);
            for (uint256 j = 0; j < siblings.length; j++) {
                vm.assertEq(siblings[j], p.proof[j]);
            }
        }
        vm.assertTrue(seen, "ClaimAnswered with the proof");
    }

    // ---- finding 6: resolve bounded --------------------------------------------------------

    function test_setParams_committeeOverMax_reverts() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.committeeSize = config.MAX_COMMITTEE_SIZE() + 1;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.InvalidParams.selector, "committeeSize not in [1, MAX_COMMITTEE_SIZE]"
            )
        );
        config.setParams(p);
    }

    /// The worst resolve the parameters allow: MAX_COMMITTEE_SIZE members, each declared on
    /// MAX_DECLARATIONS fingerprints, none revealing (every member's penalty rewrites its weight
    /// in 1 + MAX_DECLARATIONS pools). It stays under 15M gas.
    function test_resolve_worstCase_under15MGas_succeeds() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        uint16 n = config.MAX_COMMITTEE_SIZE();
        p.committeeSize = n;
        config.setParams(p);
        uint256 maxDecl = stakes.MAX_DECLARATIONS();
        bytes32[] memory fps = new bytes32[](maxDecl);
        fps[0] = FINGERPRINT;
        for (uint256 k = 1; k < maxDecl; k++) {
            fps[k] = keccak256(abi.encode("worst fp", k));
            config.approve(IProtocolConfigTypes.Kind.EngineFingerprint, fps[k]);
        }
        // Every member at exactly the minimum stake, so its penalty takes it out of every pool
        // (the costliest weight change: a path rewritten and a slot released per pool). The
        // fixture's 4 verifiers unbond down to the minimum and declare the other fingerprints;
        // n - 4 more join at the minimum, declared on MAX_DECLARATIONS fingerprints.
        for (uint256 i = 0; i < verifiers.length; i++) {
            vm.startPrank(verifiers[i]);
            stakes.requestUnbond(4 ether);
            for (uint256 k = 1; k < maxDecl; k++) {
                stakes.declareFingerprint(fps[k], MODEL);
            }
            vm.stopPrank();
        }
        for (uint256 i = verifiers.length; i < n; i++) {
            address v = address(uint160(0x5500 + i));
            vm.deal(v, 10 ether);
            vm.prank(v);
            stakes.register{value: 1 ether}(IStakeRegistryTypes.Role.Verifier);
            for (uint256 k = 0; k < maxDecl; k++) {
                vm.prank(v);
                stakes.declareFingerprint(fps[k], MODEL);
            }
        }
        vm.warp(block.timestamp + stakes.coverageNotice() + 1);
        vm.roll(block.number + 1);
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, n, "a full committee");
        vm.warp(cm.challenge(id).revealDeadline + 1);
        vm.roll(block.number + 1); // fresh checkpoints on every node: the costliest writes
        uint256 g = gasleft();
        cm.resolve(id);
        uint256 used = g - gasleft();
        vm.assertLe(used, 15_000_000, "worst resolve within 15M gas");
        for (uint256 i = 0; i < ms.length; i++) {
            vm.assertEq(stakes.weightOf(ms[i].account), 0, "each non-revealer paid, below the minimum");
        }
    }

    // ---- finding 7: governance acted in the same second -----------------------------------

    /// A receipt signed while a revocation is in its notice is valid: it needs a committee
    /// (before: the revocation took effect at once and this receipt was slashed at open).
    function test_revoke_receiptInNotice_needsCommittee_succeeds() public {
        config.revoke(IProtocolConfigTypes.Kind.Model, MODEL);
        vm.warp(block.timestamp + GOVERNANCE_NOTICE - 1);
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
    }

    /// The same for a key epoch's retirement.
    function test_retireKeyEpoch_receiptInNotice_needsCommittee_succeeds() public {
        config.retireKeyEpoch(EPOCH);
        vm.warp(block.timestamp + GOVERNANCE_NOTICE - 1);
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
        vm.assertEq(uint256(config.keyEpoch(EPOCH).retiredAt), block.timestamp + 1);
    }

    /// Revoke, then approve again: a receipt of the first interval stays valid (before: the
    /// re-approval overwrote `since`, so the honest operator's older receipt became
    /// "unapproved" and was slashed at open).
    function test_revokeThenReapprove_keepsEarlierInterval_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0); // issued inside the first interval
        uint64 first = config.approval(IProtocolConfigTypes.Kind.Model, MODEL).since;
        vm.warp(block.timestamp + 10);
        config.revoke(IProtocolConfigTypes.Kind.Model, MODEL);
        vm.warp(block.timestamp + GOVERNANCE_NOTICE + 60);
        config.approve(IProtocolConfigTypes.Kind.Model, MODEL);
        IProtocolConfigTypes.Approval[] memory h = config.approvalHistory(IProtocolConfigTypes.Kind.Model, MODEL);
        vm.assertEq(h.length, 2, "both intervals kept");
        vm.assertEq(uint256(h[0].since), uint256(first));
        vm.assertEq(uint256(h[1].since), block.timestamp);
        vm.assertFalse(
            config.isApprovedAt(IProtocolConfigTypes.Kind.Model, MODEL, h[0].until), "the gap stays unapproved"
        );
        uint256 id = open(p);
        vm.assertEq(uint256(_status(id)), uint256(IChallengeManagerTypes.Status.AwaitingDraw), "still valid");
    }

    /// Approving during a revocation's notice cancels it: one unbroken interval.
    function test_approve_cancelsPendingRevoke_succeeds() public {
        config.revoke(IProtocolConfigTypes.Kind.Model, MODEL);
        config.approve(IProtocolConfigTypes.Kind.Model, MODEL);
        vm.assertEq(uint256(config.approval(IProtocolConfigTypes.Kind.Model, MODEL).until), 0, "open again");
        vm.assertEq(config.approvalHistory(IProtocolConfigTypes.Kind.Model, MODEL).length, 1);
        vm.assertTrue(
            config.isApprovedAt(IProtocolConfigTypes.Kind.Model, MODEL, uint64(block.timestamp + 365 days)),
            "approved on"
        );
    }
}
