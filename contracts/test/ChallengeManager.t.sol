// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ProtocolConfig} from "../src/ProtocolConfig.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {BatchRegistry} from "../src/BatchRegistry.sol";
import {ChallengeManager} from "../src/ChallengeManager.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManagerErrors} from "../src/errors/ChallengeManagerErrors.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";

contract ChallengeManagerTest is Fixture {
    // ---- openChallenge ------------------------------------------------------------------

    function test_openChallenge_validReceipt_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 5, 3);
        uint256 id = open(p);
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
        vm.assertEq(c.receiptDigest, digestOf(p.receipt));
        vm.assertEq(c.operator, operator);
        vm.assertEq(c.challenger, challenger);
        vm.assertEq(uint256(c.lockedStake), 10 ether);
        vm.assertEq(stakes.accountOf(operator).locked, 10 ether);
        vm.assertEq(uint256(cm.receiptState(c.receiptDigest).liveChallenge), id);
        vm.assertEq(address(cm).balance, 1 ether);
    }

    function test_openChallenge_wrongSigner_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        p.signature = signReceipt(0xBAD, p.receipt);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.SignerMismatch.selector, operator, vm.addr(0xBAD))
        );
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_wrongChain_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        p.receipt.chainId = 1;
        p.signature = signReceipt(OPERATOR_KEY, p.receipt);
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.WrongChainId.selector, 1, block.chainid));
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_signedForOtherChainDomain_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 1, 0);
        // Signed while the chain id was different: the domain separator differs, so the
        // recovered address is not the operator's.
        uint256 chain = block.chainid;
        vm.chainId(5);
        bytes memory sig = signReceipt(OPERATOR_KEY, p.receipt);
        vm.chainId(chain);
        vm.prank(challenger);
        vm.expectRevert(); // SignerMismatch with an unpredictable recovered address
        cm.openChallenge{value: 1 ether}(p.receipt, sig, p.root, p.index, p.proof);
    }

    function test_openChallenge_proofForAnotherBatch_reverts() public {
        Posted memory a = postBatch(HONEST_OUT, 4, 1);
        Posted memory b = postBatch(OTHER_OUT, 4, 1);
        bytes32 bid = batches.batchId(operator, b.root);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.InvalidMerkleProof.selector, bid, digestOf(a.receipt), 1)
        );
        cm.openChallenge{value: 1 ether}(a.receipt, a.signature, b.root, a.index, a.proof);
    }

    function test_openChallenge_wrongLeafIndex_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 4, 1);
        bytes32 bid = batches.batchId(operator, p.root);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.InvalidMerkleProof.selector, bid, digestOf(p.receipt), 2)
        );
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, 2, p.proof);
    }

    function test_openChallenge_unknownBatch_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.BatchNotFound.selector, operator, bytes32(uint256(7)))
        );
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, bytes32(uint256(7)), p.index, p.proof);
    }

    function test_openChallenge_lateChallenge_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 deadline = block.timestamp + 1 days;
        vm.warp(deadline + 1);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.ChallengeWindowClosed.selector,
                batches.batchId(operator, p.root),
                deadline,
                deadline + 1
            )
        );
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_lastSecondOfWindow_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.warp(block.timestamp + 1 days);
        open(p);
    }

    function test_openChallenge_wrongBond_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.WrongBond.selector, 0.5 ether, 1 ether));
        cm.openChallenge{value: 0.5 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_unsupportedVersion_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 1, 0);
        p.receipt.version = 2;
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.UnsupportedReceiptVersion.selector, uint16(2)));
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_malformedSignature_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 1, 0);
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.InvalidSignature.selector, digestOf(p.receipt)));
        cm.openChallenge{value: 1 ether}(p.receipt, hex"1234", p.root, p.index, p.proof);
    }

    function test_openChallenge_highS_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 1, 0);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(OPERATOR_KEY, digestOf(p.receipt));
        uint256 n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141;
        bytes memory malleable = abi.encodePacked(r, bytes32(n - uint256(s)), v == 27 ? uint8(28) : uint8(27));
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.InvalidSignature.selector, digestOf(p.receipt)));
        cm.openChallenge{value: 1 ether}(p.receipt, malleable, p.root, p.index, p.proof);
    }

    function test_openChallenge_signerNotOperator_reverts() public {
        // A non-operator has no committed batch: the lookup keyed by its address fails.
        uint256 key = 0xB0B;
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 1);
        r.operator = vm.addr(key);
        bytes memory sig = signReceipt(key, r);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.BatchNotFound.selector, vm.addr(key), bytes32(uint256(1)))
        );
        cm.openChallenge{value: 1 ether}(r, sig, bytes32(uint256(1)), 0, new bytes32[](0));
    }

    function test_claimUnpublished_signerNotOperator_reverts() public {
        uint256 key = 0xB0B;
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 1);
        r.operator = vm.addr(key);
        bytes memory sig = signReceipt(key, r);
        vm.warp(block.timestamp + 2 hours);
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.NotOperator.selector, vm.addr(key)));
        cm.claimUnpublished{value: 1 ether}(r, sig);
    }

    function test_openChallenge_liveDispute_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 id = open(p);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.DisputeAlreadyLive.selector, digestOf(p.receipt), uint64(id), 0
            )
        );
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_alreadySlashed_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 id = open(p);
        commitAndReveal(id, draw(id), allSame(3, OTHER_OUT));
        cm.resolve(id);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.ReceiptAlreadySlashed.selector, digestOf(p.receipt))
        );
        cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function test_openChallenge_unapprovedModel_slashesAtOnce_succeeds() public {
        config.revoke(IProtocolConfigTypes.Kind.Model, MODEL);
        vm.warp(block.timestamp + GOVERNANCE_NOTICE); // the revocation's effect
        Posted memory p = postBatch(HONEST_OUT, 3, 2);
        uint256 before = stakes.accountOf(operator).stake;
        uint256 id = open(p);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(stakes.accountOf(operator).stake, before - 10 ether);
        vm.assertTrue(cm.receiptState(digestOf(p.receipt)).slashed, "receipt marked slashed");
        vm.assertEq(cm.credits(challenger), 1 ether + 2 ether, "bond + alpha");
        vm.assertEq(cm.totalBurnt(), 8 ether);
    }

    function test_openChallenge_receiptBeforeRevocation_needsCommittee_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 1, 0);
        vm.warp(block.timestamp + 5);
        config.revoke(IProtocolConfigTypes.Kind.Model, MODEL);
        uint256 id = open(p);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
    }

    function test_openChallenge_retiredKeyEpoch_slashesAtOnce_succeeds() public {
        config.retireKeyEpoch(EPOCH);
        vm.warp(block.timestamp + GOVERNANCE_NOTICE); // the retirement's effect
        Posted memory p = postBatch(HONEST_OUT, 1, 0);
        uint256 id = open(p);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
    }

    // ---- drawCommittee ------------------------------------------------------------------

    function test_drawCommittee_afterTargetBlock_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3);
        uint256 total = 0;
        for (uint256 i = 0; i < ms.length; i++) {
            vm.assertEq(uint256(ms[i].weight), 5 ether);
            vm.assertEq(stakes.accountOf(ms[i].account).locked, 0.5 ether);
            for (uint256 j = 0; j < i; j++) {
                vm.assertTrue(ms[i].account != ms[j].account, "distinct members");
            }
            total += ms[i].weight;
        }
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.Voting));
        vm.assertEq(uint256(c.totalWeight), total);
        vm.assertEq(uint256(c.commitDeadline), block.timestamp + 1 hours);
    }

    function test_drawCommittee_beforeTargetBlock_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        uint64 target = cm.challenge(id).targetBlock;
        vm.roll(target);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.DrawTooEarly.selector, id, target, target));
        cm.drawCommittee(id);
    }

    function test_drawCommittee_hashOutOfReach_rearms_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        uint64 target = cm.challenge(id).targetBlock;
        vm.roll(uint256(target) + 300);
        cm.drawCommittee(id);
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
        vm.assertEq(uint256(c.targetBlock), uint256(target) + 302);
        vm.roll(uint256(c.targetBlock) + 1);
        cm.drawCommittee(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Voting));
    }

    /// A verifier that challenges is drawable like any other (issue 31: excluding it handed a
    /// small pool to whoever else was in it). Pool of exactly 3 = committee size: the
    /// challenging verifier sits (before: excluded, a committee of 2).
    function test_drawCommittee_challengerVerifierSits_succeeds() public {
        vm.prank(verifiers[3]);
        stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        vm.warp(block.timestamp + config.maxDisputeSpan(config.params()) + stakes.coverageNotice());
        stakes.completeUndeclare(verifiers[3], FINGERPRINT, MODEL);
        vm.roll(block.number + 1);
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.prank(verifiers[0]);
        uint256 id = cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3, "the whole pool");
        bool seated = false;
        for (uint256 i = 0; i < ms.length; i++) {
            if (ms[i].account == verifiers[0]) seated = true;
        }
        vm.assertTrue(seated, "the challenger sits");
    }

    function test_drawCommittee_afterDrawPeriod_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        uint256 deadline = block.timestamp + 1 hours;
        vm.warp(deadline + 1);
        vm.roll(block.number + 10);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.DrawPeriodOver.selector, id, deadline, deadline + 1)
        );
        cm.drawCommittee(id);
    }

    function test_drawCommittee_twice_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        draw(id);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.WrongStatus.selector,
                id,
                IChallengeManagerTypes.Status.Voting,
                IChallengeManagerTypes.Status.AwaitingDraw
            )
        );
        cm.drawCommittee(id);
    }

    function test_drawCommittee_unknownChallenge_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.UnknownChallenge.selector, 42));
        cm.drawCommittee(42);
    }

    // ---- commitVote / revealVote --------------------------------------------------------

    function test_commitVote_member_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32 cmt = cm.voteCommitment(id, ms[0].account, HONEST_OUT, "salt");
        vm.prank(ms[0].account);
        cm.commitVote(id, cmt);
        IChallengeManagerTypes.Vote memory v = cm.vote(id, ms[0].account);
        vm.assertEq(v.value, cmt);
        vm.assertEq(uint256(v.state), uint256(IChallengeManagerTypes.VoteState.Committed));
    }

    function test_commitVote_doubleVote_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.startPrank(ms[0].account);
        cm.commitVote(id, bytes32(uint256(1)));
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.AlreadyCommitted.selector, id, ms[0].account));
        cm.commitVote(id, bytes32(uint256(2)));
        vm.stopPrank();
    }

    function test_commitVote_nonMember_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        draw(id);
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.NotCommitteeMember.selector, id, challenger));
        cm.commitVote(id, bytes32(uint256(1)));
    }

    function test_commitVote_afterDeadline_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        uint64 deadline = cm.challenge(id).commitDeadline;
        vm.warp(uint256(deadline) + 1);
        vm.prank(ms[0].account);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.CommitPhaseOver.selector, id, deadline, uint256(deadline) + 1
            )
        );
        cm.commitVote(id, bytes32(uint256(1)));
    }

    function test_commitVote_zeroCommitment_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.prank(ms[0].account);
        vm.expectRevert(IChallengeManagerErrors.ZeroCommitment.selector);
        cm.commitVote(id, bytes32(0));
    }

    function test_commitVote_beforeDraw_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        vm.prank(verifiers[0]);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.WrongStatus.selector,
                id,
                IChallengeManagerTypes.Status.AwaitingDraw,
                IChallengeManagerTypes.Status.Voting
            )
        );
        cm.commitVote(id, bytes32(uint256(1)));
    }

    function test_revealVote_mismatch_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        address m = ms[0].account;
        bytes32 cmt = cm.voteCommitment(id, m, HONEST_OUT, "salt");
        vm.prank(m);
        cm.commitVote(id, cmt);
        vm.warp(cm.challenge(id).commitDeadline + 1);
        bytes32 computed = cm.voteCommitment(id, m, OTHER_OUT, "salt");
        vm.prank(m);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.RevealMismatch.selector, id, m, cmt, computed));
        cm.revealVote(id, OTHER_OUT, "salt");
    }

    function test_revealVote_copiedCommitment_reverts() public {
        // A member copying another's commitment cannot open it: the voter is bound in.
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32 cmt = cm.voteCommitment(id, ms[0].account, HONEST_OUT, "salt");
        vm.prank(ms[0].account);
        cm.commitVote(id, cmt);
        vm.prank(ms[1].account);
        cm.commitVote(id, cmt);
        vm.warp(cm.challenge(id).commitDeadline + 1);
        bytes32 computed = cm.voteCommitment(id, ms[1].account, HONEST_OUT, "salt");
        vm.prank(ms[1].account);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.RevealMismatch.selector, id, ms[1].account, cmt, computed)
        );
        cm.revealVote(id, HONEST_OUT, "salt");
    }

    function test_revealVote_beforeCommitPhaseEnds_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32 cmt = cm.voteCommitment(id, ms[0].account, HONEST_OUT, "s");
        vm.prank(ms[0].account);
        cm.commitVote(id, cmt);
        uint64 deadline = cm.challenge(id).commitDeadline;
        vm.prank(ms[0].account);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.RevealPhaseNotOpen.selector, id, deadline, block.timestamp)
        );
        cm.revealVote(id, HONEST_OUT, "s");
    }

    function test_revealVote_allCommitted_opensEarly_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        for (uint256 i = 0; i < ms.length; i++) {
            bytes32 cmt = cm.voteCommitment(id, ms[i].account, HONEST_OUT, "s");
            vm.prank(ms[i].account);
            cm.commitVote(id, cmt);
        }
        vm.prank(ms[0].account);
        cm.revealVote(id, HONEST_OUT, "s");
        vm.assertEq(uint256(cm.vote(id, ms[0].account).state), uint256(IChallengeManagerTypes.VoteState.Revealed));
    }

    function test_revealVote_twice_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(3, HONEST_OUT));
        vm.prank(ms[0].account);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.AlreadyRevealed.selector, id, ms[0].account));
        cm.revealVote(id, HONEST_OUT, bytes32(uint256(1)));
    }

    function test_revealVote_withoutCommit_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.warp(cm.challenge(id).commitDeadline + 1);
        vm.prank(ms[0].account);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.NotCommitted.selector, id, ms[0].account));
        cm.revealVote(id, HONEST_OUT, "s");
    }

    function test_revealVote_nonMember_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        draw(id);
        vm.warp(cm.challenge(id).commitDeadline + 1);
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.NotCommitteeMember.selector, id, challenger));
        cm.revealVote(id, HONEST_OUT, "s");
    }

    function test_revealVote_afterDeadline_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32 cmt = cm.voteCommitment(id, ms[0].account, HONEST_OUT, "s");
        vm.prank(ms[0].account);
        cm.commitVote(id, cmt);
        uint64 deadline = cm.challenge(id).revealDeadline;
        vm.warp(uint256(deadline) + 1);
        vm.prank(ms[0].account);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.RevealPhaseOver.selector, id, deadline, uint256(deadline) + 1
            )
        );
        cm.revealVote(id, HONEST_OUT, "s");
    }

    // ---- resolve ------------------------------------------------------------------------

    function test_resolve_matchingVotes_dismisses_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(3, HONEST_OUT));
        cm.resolve(id);
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(c.majorityOutHash, HONEST_OUT);
        vm.assertEq(stakes.accountOf(operator).stake, 20 ether, "operator untouched");
        vm.assertEq(stakes.accountOf(operator).locked, 0, "operator unlocked");
        uint256 paid = 0;
        for (uint256 i = 0; i < ms.length; i++) {
            paid += cm.credits(ms[i].account);
            vm.assertEq(stakes.accountOf(ms[i].account).locked, 0);
        }
        vm.assertEq(paid + cm.totalBurnt(), 1 ether, "bond to the committee, dust burnt");
        vm.assertEq(cm.credits(challenger), 0);
        vm.assertEq(cm.receiptState(c.receiptDigest).liveChallenge, 0);
    }

    function test_resolve_mismatchingVotes_slashes_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(3, OTHER_OUT));
        cm.resolve(id);
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        vm.assertEq(uint256(c.status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(c.majorityOutHash, OTHER_OUT);
        vm.assertEq(stakes.accountOf(operator).stake, 10 ether);
        vm.assertEq(cm.credits(challenger), 1 ether + 2 ether, "bond back + alpha");
        uint256 paid = 0;
        for (uint256 i = 0; i < ms.length; i++) {
            paid += cm.credits(ms[i].account);
        }
        vm.assertEq(paid, 3 ether, "beta to the majority (equal weights, no dust)");
        vm.assertEq(cm.totalBurnt(), 5 ether);
        vm.assertTrue(cm.receiptState(c.receiptDigest).slashed, "slashed");
    }

    function test_resolve_splitVote_inconclusive_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32[] memory outs = new bytes32[](3);
        outs[0] = HONEST_OUT;
        outs[1] = OTHER_OUT;
        outs[2] = keccak256("third");
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Inconclusive));
        vm.assertEq(cm.credits(challenger), 1 ether, "bond back");
        vm.assertEq(stakes.accountOf(operator).locked, 0);
    }

    function test_resolve_nonRevealerPenalized_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32[] memory outs = allSame(3, HONEST_OUT);
        outs[2] = bytes32(0); // member 2 never votes
        commitAndReveal(id, ms, outs);
        vm.warp(cm.challenge(id).revealDeadline + 1);
        cm.resolve(id);
        // 2 of 3 equal weights: 2·10000 >= 6666·3, a quorum (issue 31; with τ = 6667 it was not).
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(stakes.accountOf(ms[2].account).stake, 4.5 ether, "penalty slashed");
        vm.assertEq(stakes.accountOf(ms[2].account).locked, 0);
        vm.assertEq(cm.totalBurnt(), 0.5 ether);
    }

    function test_resolve_beforeRevealDeadline_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        draw(id);
        uint64 deadline = cm.challenge(id).revealDeadline;
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.TooEarlyToResolve.selector, id, deadline, block.timestamp)
        );
        cm.resolve(id);
    }

    function test_resolve_drawTimedOut_inconclusive_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        vm.warp(block.timestamp + 1 hours + 1);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Inconclusive));
        vm.assertEq(cm.credits(challenger), 1 ether);
        vm.assertEq(stakes.accountOf(operator).locked, 0);
    }

    function test_resolve_awaitingDrawTooEarly_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        uint256 deadline = block.timestamp + 1 hours;
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.TooEarlyToResolve.selector, id, deadline, block.timestamp)
        );
        cm.resolve(id);
    }

    function test_resolve_twice_reverts() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        commitAndReveal(id, draw(id), allSame(3, HONEST_OUT));
        cm.resolve(id);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.WrongStatus.selector,
                id,
                IChallengeManagerTypes.Status.Dismissed,
                IChallengeManagerTypes.Status.Voting
            )
        );
        cm.resolve(id);
    }

    function test_resolve_dismissedThenRechallenged_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 id = open(p);
        commitAndReveal(id, draw(id), allSame(3, HONEST_OUT));
        cm.resolve(id);
        uint256 id2 = open(p);
        vm.assertEq(id2, id + 1);
    }

    /// The only verifier of the fingerprint's pool opens the challenge itself: nobody else is
    /// drawable, so it sits (the lone challenger; without that the committee was empty and the
    /// challenge Inconclusive).
    function test_drawCommittee_loneChallengerSits_succeeds() public {
        _leaveAllBut(verifiers[0]);
        challenger = verifiers[0];
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Voting));
        vm.assertEq(ms.length, 1);
        vm.assertEq(ms[0].account, verifiers[0]);
    }

    /// The fingerprint was covered at issuedAt but its only verifier was penalised below the
    /// minimum before the open: nobody is drawable at the snapshot, the challenge ends
    /// inconclusive and the challenger gets its bond back.
    function test_resolve_noEligibleVerifiers_inconclusive_succeeds() public {
        _leaveAllBut(verifiers[0]);
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        vm.startPrank(address(cm));
        stakes.lock(verifiers[0], 4.5 ether);
        stakes.slashLocked(verifiers[0], 4.5 ether);
        vm.stopPrank();
        vm.roll(block.number + 1);
        uint256 id = open(p);
        vm.roll(cm.challenge(id).targetBlock + 1);
        cm.drawCommittee(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Inconclusive));
        vm.assertEq(cm.credits(challenger), 1 ether);
    }

    /// Every verifier but `stay` leaves FINGERPRINT's pool.
    function _leaveAllBut(address stay) internal {
        for (uint256 i = 0; i < verifiers.length; i++) {
            if (verifiers[i] == stay) continue;
            vm.prank(verifiers[i]);
            stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        }
        vm.warp(block.timestamp + stakes.config().maxDisputeSpan(config.params()) + stakes.coverageNotice());
        for (uint256 i = 0; i < verifiers.length; i++) {
            if (verifiers[i] != stay) stakes.completeUndeclare(verifiers[i], FINGERPRINT, MODEL);
        }
        vm.roll(block.number + 1);
    }

    // ---- withholding claims -------------------------------------------------------------

    function test_claimUnpublished_afterDeadline_succeeds() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 9);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        IChallengeManagerTypes.Claim memory cl = cm.claim(id);
        vm.assertEq(uint256(cl.status), uint256(IChallengeManagerTypes.ClaimStatus.Open));
        vm.assertEq(uint256(cl.lockedStake), 10 ether);
    }

    function test_claimUnpublished_beforeDeadline_reverts() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 9);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        uint64 publishBy = r.issuedAt + 1 hours;
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.PublicationDeadlineNotPassed.selector, digestOf(r), publishBy, block.timestamp
            )
        );
        cm.claimUnpublished{value: 1 ether}(r, sig);
    }

    function test_resolveUnpublished_unanswered_slashes_succeeds() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 9);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        vm.warp(block.timestamp + 1 hours + 1);
        cm.resolveUnpublished(id);
        vm.assertEq(uint256(cm.claim(id).status), uint256(IChallengeManagerTypes.ClaimStatus.Slashed));
        vm.assertEq(stakes.accountOf(operator).stake, 10 ether);
        vm.assertEq(cm.credits(challenger), 3 ether);
        vm.assertEq(cm.totalBurnt(), 8 ether);
        vm.assertTrue(cm.receiptState(digestOf(r)).unpublishedSlashed, "slashed for withholding");
        vm.assertFalse(cm.receiptState(digestOf(r)).slashed, "content fault still open");
    }

    function test_resolveUnpublished_tooEarly_reverts() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 9);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        uint64 deadline = cm.claim(id).responseDeadline;
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.ResponsePeriodNotOver.selector, id, deadline, block.timestamp
            )
        );
        cm.resolveUnpublished(id);
    }

    function test_answerUnpublished_timelyInclusion_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 3, 1);
        vm.warp(uint256(p.receipt.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(p.receipt, p.signature);
        cm.answerUnpublished(id, p.root, p.index, p.proof);
        vm.assertEq(uint256(cm.claim(id).status), uint256(IChallengeManagerTypes.ClaimStatus.Answered));
        vm.assertEq(cm.credits(operator), 1 ether, "bond to the operator");
        vm.assertEq(stakes.accountOf(operator).locked, 0);
    }

    function test_answerUnpublished_lateBatch_reverts() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 0);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        bytes32[] memory digests = new bytes32[](1);
        digests[0] = digestOf(r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        bytes32 root = merkleRoot(digests);
        vm.prank(operator);
        batches.commitBatch(root, 1, "da://local/0x01");
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.BatchCommittedLate.selector,
                batches.batchId(operator, root),
                uint64(block.timestamp),
                r.issuedAt + 1 hours
            )
        );
        cm.answerUnpublished(id, root, 0, new bytes32[](0));
    }

    function test_answerUnpublished_afterResponsePeriod_reverts() public {
        Posted memory p = postBatch(HONEST_OUT, 3, 1);
        vm.warp(uint256(p.receipt.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(p.receipt, p.signature);
        uint64 deadline = cm.claim(id).responseDeadline;
        vm.warp(uint256(deadline) + 1);
        vm.expectRevert(
            abi.encodeWithSelector(
                IChallengeManagerErrors.ResponsePeriodOver.selector, id, deadline, uint256(deadline) + 1
            )
        );
        cm.answerUnpublished(id, p.root, p.index, p.proof);
    }

    /// A live challenge does not hold a claim off (and the reverse): they are different faults,
    /// and exclusivity let an operator's own dispute shield a receipt (issue 13, attack 1).
    function test_claimUnpublished_whileChallengeLive_succeeds() public {
        Posted memory p = postBatch(HONEST_OUT, 2, 0);
        uint256 id = open(p);
        vm.warp(uint256(p.receipt.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 cid = cm.claimUnpublished{value: 1 ether}(p.receipt, p.signature);
        IChallengeManagerTypes.ReceiptState memory rs = cm.receiptState(digestOf(p.receipt));
        vm.assertEq(uint256(rs.liveChallenge), id);
        vm.assertEq(uint256(rs.liveClaim), cid);
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 20 ether, "two full liabilities");
    }

    function test_claimUnpublished_whileClaimLive_reverts() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 9);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1);
        vm.prank(challenger);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        vm.prank(challenger);
        vm.expectRevert(
            abi.encodeWithSelector(IChallengeManagerErrors.DisputeAlreadyLive.selector, digestOf(r), 0, uint64(id))
        );
        cm.claimUnpublished{value: 1 ether}(r, sig);
    }

    // ---- credits / misc -----------------------------------------------------------------

    function test_withdrawCredits_afterSlash_succeeds() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        commitAndReveal(id, draw(id), allSame(3, OTHER_OUT));
        cm.resolve(id);
        uint256 before = challenger.balance;
        vm.prank(challenger);
        cm.withdrawCredits();
        vm.assertEq(challenger.balance, before + 3 ether);
        vm.assertEq(cm.credits(challenger), 0);
    }

    function test_withdrawCredits_none_reverts() public {
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSelector(IChallengeManagerErrors.NoCredits.selector, challenger));
        cm.withdrawCredits();
    }

    function test_receive_fromStranger_reverts() public {
        vm.prank(challenger);
        (bool ok,) = address(cm).call{value: 1}("");
        vm.assertFalse(ok, "plain ETH refused");
    }

    function test_recordAudit_verifier_succeeds() public {
        vm.recordLogs();
        vm.prank(verifiers[0]);
        audits.recordAudit(bytes32(uint256(1)), HONEST_OUT, true, bytes32(uint256(2)));
        vm.assertEq(vm.getRecordedLogs().length, 1);
    }

    function test_recordAudit_stranger_reverts() public {
        vm.prank(challenger);
        vm.expectRevert(abi.encodeWithSignature("NotVerifier(address)", challenger));
        audits.recordAudit(bytes32(uint256(1)), HONEST_OUT, true, bytes32(0));
    }
}
