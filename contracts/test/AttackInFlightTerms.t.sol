// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";

/// @dev Issue 31, fresh-eyes review: the terms a dispute is decided by must be the ones in force
///      when its committee was drawn (or its claim opened), and "one colluding seat cannot block a
///      verdict" must hold for the committee actually drawn, not only for a full one.
///
///      Before the fix `resolve` read τ, α and β from the *current* parameters and compared
///      against τ even when the pool gave fewer seats than `committeeSize`:
///      - a legitimate governance move from (3 seats, τ 6666) to (6 seats, τ 8333), which
///        ProtocolConfig accepts (8333·6 <= 5·10000), turned every in-flight 2-of-3 fraud verdict
///        Inconclusive: one colluding seat shielded the fraud and paid nothing;
///      - under (6 seats, τ 8333) a pool of 4 verifiers gives a committee of 4, where 3 honest
///        equal seats (7500) were short of τ: one sybil seat blocked every fraud in that pool;
///      - lowering α/β after the draw (or after a claim opened) cut the challenger's, claimant's
///        and majority's promised rewards retroactively.
///      Fixture: 4 verifiers of 5 ETH declared for FINGERPRINT, S = 10, bond 1, α 20 %, β 30 %.
contract AttackInFlightTermsTest is Fixture {
    address internal claimant = address(0xC1A1);

    function _sixSeats() internal pure returns (IProtocolConfigTypes.Params memory p) {
        p = defaultParams();
        p.committeeSize = 6;
        p.quorumBps = 8333; // 8333·6 = 49998 <= 5·10000: accepted
    }

    /// 2 of 3 equal seats reveal the true output, one colluder the receipt's; governance then
    /// moves to 6 seats / τ 8333 before anyone resolves. The fraud is still slashed (before:
    /// Inconclusive, the colluder unpunished, the challenger's α gone).
    function test_attackQuorumRaisedBeforeResolve_fraudStillSlashed() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0)); // true output: OTHER_OUT
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 3);
        bytes32[] memory outs = allSame(3, OTHER_OUT);
        outs[2] = HONEST_OUT; // the colluder
        commitAndReveal(id, ms, outs);
        config.setParams(_sixSeats());
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(operator).stake), 10 ether, "operator slashed");
        vm.assertEq(uint256(stakes.accountOf(ms[2].account).stake), 4.5 ether, "colluder pays");
    }

    /// Under (6 seats, τ 8333) a pool of 4 equal verifiers gives a committee of 4; 3 honest
    /// seats against 1 colluder decide (n - 1 of n), as ProtocolConfig's argument promises for a
    /// full committee (before: 7500 < 8333, Inconclusive).
    function test_attackSmallPoolUnderLargeCommittee_oneSeatCannotBlock() public {
        config.setParams(_sixSeats());
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        vm.assertEq(ms.length, 4, "the whole pool");
        bytes32[] memory outs = allSame(4, OTHER_OUT);
        outs[3] = HONEST_OUT;
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(uint256(stakes.accountOf(ms[3].account).stake), 4.5 ether, "colluder pays");
    }

    /// The mirror for an honest receipt: 3 of 4 seats on the receipt dismiss it (before:
    /// Inconclusive, the griefer's bond came back).
    function test_attackSmallPoolUnderLargeCommittee_honestReceiptDismissed() public {
        config.setParams(_sixSeats());
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32[] memory outs = allSame(4, HONEST_OUT);
        outs[0] = OTHER_OUT; // the griefer's partner
        commitAndReveal(id, ms, outs);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Dismissed));
        vm.assertEq(cm.credits(challenger), 0, "griefer loses its bond");
    }

    /// Governance halves α and zeroes β between the draw and the resolve: the challenger and
    /// the majority are paid the α and β in force at the draw (before: 1 ETH instead of 3).
    function test_attackRewardsCutBeforeResolve_paidAsDrawn() public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        commitAndReveal(id, ms, allSame(3, OTHER_OUT));
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.challengerRewardBps = 1000;
        p.majorityRewardBps = 0;
        config.setParams(p);
        cm.resolve(id);
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.Slashed));
        vm.assertEq(cm.credits(challenger), 1 ether + 2 ether, "bond + alpha (20% of 10)");
        vm.assertEq(cm.credits(ms[0].account), 1 ether, "beta (30% of 10) split in three");
    }

    /// Governance zeroes α while a claim is open: the claimant is paid the α in force when it
    /// claimed (before: bond only).
    function test_attackRewardCutDuringClaim_paidAsClaimed() public {
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, 77);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        vm.warp(uint256(r.issuedAt) + 1 hours + 1);
        vm.deal(claimant, 10 ether);
        vm.prank(claimant);
        uint256 id = cm.claimUnpublished{value: 1 ether}(r, sig);
        IProtocolConfigTypes.Params memory p = defaultParams();
        p.challengerRewardBps = 0;
        config.setParams(p);
        vm.warp(cm.claim(id).responseDeadline + 1);
        cm.resolveUnpublished(id);
        vm.assertEq(cm.credits(claimant), 1 ether + 2 ether, "bond + alpha (20% of 10)");
    }
}
