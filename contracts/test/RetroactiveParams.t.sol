// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";
import {IProtocolConfigErrors} from "../src/errors/ProtocolConfigErrors.sol";

/// @dev Governance parameter changes applied to receipts and disputes that already exist.
///      publicationDeadline, drawPeriod and challengeWindow are read from the *current*
///      parameters when a claim opens, when a challenge is drawn/resolved and when a challenge
///      opens, so shortening one of them reached back in time:
///      - a shorter publicationDeadline slashed an honest operator that published inside the
///        deadline it signed under (claimUnpublished, then answerUnpublished BatchCommittedLate);
///      - a shorter drawPeriod let the cheating operator `resolve` a fresh challenge of its fraud
///        Inconclusive at once (the draw deadline is not stored), after which the window closed;
///      - a shorter challengeWindow closed the window of a fraud already committed.
///      Each test plays the attack against whatever setParams accepts and asserts the promise
///      (honest operator keeps its stake / the fraud is slashed).
contract RetroactiveParamsTest is Fixture {
    address internal claimant = address(0xC1A1);

    function _tryShorten(IProtocolConfigTypes.Params memory p) internal returns (bool accepted) {
        try config.setParams(p) {
            accepted = true;
        } catch {
            accepted = false;
        }
    }

    /// Honest operator: signs at t, commits its batch at t + 45 min (inside the 1 h deadline it
    /// signed under). Governance then halves publicationDeadline; a claimant claims the receipt
    /// "unpublished" at t + 46 min. The operator must be able to answer and keep its stake.
    function test_attackShorterPublicationDeadline_honestOperatorKeepsStake() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 1);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        bytes32[] memory digests = new bytes32[](1);
        digests[0] = digestOf(r);
        bytes32 root = merkleRoot(digests);
        uint256 t = r.issuedAt;

        vm.warp(t + 45 minutes);
        vm.prank(operator);
        batches.commitBatch(root, 1, "da://local/late-but-in-time");

        IProtocolConfigTypes.Params memory p = defaultParams();
        p.publicationDeadline = 30 minutes;
        _tryShorten(p);

        vm.warp(t + 46 minutes);
        vm.deal(claimant, 10 ether);
        vm.prank(claimant);
        try cm.claimUnpublished{value: 1 ether}(r, sig) returns (uint256 id) {
            // The operator answers with its (in-time) inclusion proof.
            cm.answerUnpublished(id, root, 0, merkleProof(digests, 0));
        } catch {}
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 20 ether, "honest operator lost stake");
        vm.assertEq(uint256(stakes.accountOf(operator).locked), 0, "honest operator stake left locked");
    }

    /// Cheating operator + governance: a fraud is challenged late in its window; governance cuts
    /// drawPeriod to 1 s; the operator resolves the challenge Inconclusive before any draw. The
    /// window then closes and the fraud is never slashed. The promise: it is slashed.
    function test_attackShorterDrawPeriod_fraudStillSlashed() public {
        Posted memory fraud = postBatch(OTHER_OUT, 2, 0);
        vm.warp(block.timestamp + 1 days - 30 minutes); // 30 min left in the window
        uint256 id = open(fraud);

        IProtocolConfigTypes.Params memory p = defaultParams();
        p.drawPeriod = 1;
        _tryShorten(p);
        vm.warp(block.timestamp + 2);
        try cm.resolve(id) {} catch {} // the operator's move
        vm.warp(block.timestamp + 31 minutes); // the window is closed now

        if (cm.challenge(id).status == IChallengeManagerTypes.Status.AwaitingDraw) {
            IChallengeManagerTypes.Member[] memory ms = draw(id);
            commitAndReveal(id, ms, allSame(ms.length, HONEST_OUT));
            cm.resolve(id);
        }
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed), "fraud escaped");
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "slash not taken");
    }

    /// Cheating operator + governance: a fraud committed at t; at t + 1 h governance halves the
    /// challenge window; an honest challenger arrives at t + 13 h, inside the window the batch
    /// was committed under. The challenge must open (and the fraud be slashed).
    function test_attackShorterChallengeWindow_fraudStillChallengeable() public {
        Posted memory fraud = postBatch(OTHER_OUT, 2, 0);
        vm.warp(block.timestamp + 1 hours);
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.challengeWindow = 12 hours;
        p.claimWindow = 12 hours; // claimWindow <= challengeWindow
        _tryShorten(p);
        vm.warp(block.timestamp + 12 hours);
        uint256 id = open(fraud); // reverted ChallengeWindowClosed before the fix
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(ms.length, HONEST_OUT));
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed), "fraud escaped");
    }

    /// The rule itself: each of the three may grow, none may shrink (typed error with values).
    function test_setParams_shorterWindows_revert() public {
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.publicationDeadline = 30 minutes;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.ParamShortened.selector, "publicationDeadline", 1 hours, 30 minutes
            )
        );
        config.setParams(p);

        p = defaultParams();
        p.drawPeriod = 59 minutes;
        vm.expectRevert(
            abi.encodeWithSelector(IProtocolConfigErrors.ParamShortened.selector, "drawPeriod", 1 hours, 59 minutes)
        );
        config.setParams(p);

        p = defaultParams();
        p.challengeWindow = 12 hours;
        p.claimWindow = 12 hours;
        vm.expectRevert(
            abi.encodeWithSelector(IProtocolConfigErrors.ParamShortened.selector, "challengeWindow", 1 days, 12 hours)
        );
        config.setParams(p);

        p = defaultParams();
        p.publicationDeadline = 2 hours;
        p.drawPeriod = 2 hours;
        p.challengeWindow = 2 days;
        p.unbondingPeriod = 4 days;
        config.setParams(p);
        vm.assertEq(uint256(config.params().publicationDeadline), 2 hours);
    }
}
