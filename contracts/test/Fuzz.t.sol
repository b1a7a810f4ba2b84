// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {BatchMerkle} from "../src/lib/BatchMerkle.sol";
import {ChallengeManager} from "../src/ChallengeManager.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";

contract FuzzTest is Fixture {
    function _digests(uint256 seed, uint256 n) internal pure returns (bytes32[] memory d) {
        d = new bytes32[](n);
        for (uint256 i = 0; i < n; i++) d[i] = keccak256(abi.encode(seed, i));
    }

    function testFuzz_merkleProof_everyLeafVerifies_succeeds(uint256 seed, uint256 n, uint256 index) public pure {
        n = bound(n, 1, 100);
        index = bound(index, 0, n - 1);
        bytes32[] memory d = _digests(seed, n);
        bytes32 root = merkleRoot(d);
        bytes32[] memory proof = merkleProof(d, index);
        vm.assertTrue(BatchMerkle.verify(d[index], index, n, proof, root), "proof verifies");
    }

    function testFuzz_merkleProof_tamperedSibling_reverts(uint256 seed, uint256 n, uint256 index, uint256 which)
        public
        pure
    {
        n = bound(n, 2, 100);
        index = bound(index, 0, n - 1);
        bytes32[] memory d = _digests(seed, n);
        bytes32 root = merkleRoot(d);
        bytes32[] memory proof = merkleProof(d, index);
        vm.assume(proof.length > 0);
        proof[which % proof.length] ^= bytes32(uint256(1));
        vm.assertFalse(BatchMerkle.verify(d[index], index, n, proof, root), "tampered proof rejected");
    }

    function testFuzz_merkleProof_wrongLeafCount_reverts(uint256 seed, uint256 n, uint256 index, uint256 m) public pure {
        n = bound(n, 1, 64);
        m = bound(m, 1, 128);
        vm.assume(m != n);
        index = bound(index, 0, n - 1);
        bytes32[] memory d = _digests(seed, n);
        bytes32[] memory proof = merkleProof(d, index);
        // A proof is only accepted under the leaf count it was built for, or under one whose
        // tree has the same shape along this path; never for a different root.
        (bool ok, bytes32 r) = BatchMerkle.computeRoot(d[index], index, m, proof);
        if (ok) vm.assertEq(r, merkleRoot(d), "same path shape gives the same root");
    }

    function testFuzz_openChallenge_anyLeaf_succeeds(uint256 n, uint256 index) public {
        n = bound(n, 1, 40);
        index = bound(index, 0, n - 1);
        uint256 id = open(postBatch(HONEST_OUT, n, index));
        vm.assertEq(uint256(cm.challenge(id).status), uint256(IChallengeManagerTypes.Status.AwaitingDraw));
    }

    /// Any vote pattern: stake is conserved and the outcome follows the quorum rule.
    function testFuzz_resolve_anyVotes_followsQuorum_succeeds(uint8 pattern) public {
        uint256 id = open(postBatch(HONEST_OUT, 2, 0));
        IChallengeManagerTypes.Member[] memory ms = draw(id);
        bytes32[] memory outs = new bytes32[](ms.length);
        uint256 honestW;
        uint256 otherW;
        for (uint256 i = 0; i < ms.length; i++) {
            uint256 c = (pattern >> (2 * i)) & 3;
            outs[i] = c == 0 ? bytes32(0) : (c == 1 ? HONEST_OUT : OTHER_OUT);
            if (c == 1) honestW += ms[i].weight;
            if (c >= 2) otherW += ms[i].weight;
        }
        uint256 ethBefore = address(stakes).balance + address(cm).balance;
        commitAndReveal(id, ms, outs);
        vm.warp(cm.challenge(id).revealDeadline + 1);
        cm.resolve(id);
        uint256 total = cm.challenge(id).totalWeight;
        uint256 tau = config.params().quorumBps;
        IChallengeManagerTypes.Status s = cm.challenge(id).status;
        if (honestW * 10_000 >= tau * total) vm.assertEq(uint256(s), uint256(IChallengeManagerTypes.Status.Dismissed));
        else if (otherW * 10_000 >= tau * total) vm.assertEq(uint256(s), uint256(IChallengeManagerTypes.Status.Slashed));
        else vm.assertEq(uint256(s), uint256(IChallengeManagerTypes.Status.Inconclusive));
        // Who pays the penalty: non-revealers always; revealers outvoted by a decided quorum.
        for (uint256 i = 0; i < ms.length; i++) {
            bool pays = outs[i] == bytes32(0)
                || (s == IChallengeManagerTypes.Status.Slashed && outs[i] == HONEST_OUT)
                || (s == IChallengeManagerTypes.Status.Dismissed && outs[i] != HONEST_OUT);
            vm.assertEq(uint256(stakes.accountOf(ms[i].account).stake), pays ? 4.5 ether : 5 ether, "penalty rule");
            vm.assertEq(uint256(stakes.accountOf(ms[i].account).locked), 0, "every member settled");
        }
        vm.assertEq(address(stakes).balance + address(cm).balance, ethBefore, "no ETH created or lost");
        vm.assertEq(address(cm).balance, cm.totalCredits() + cm.totalBurnt(), "no bond left behind");
    }

    function testFuzz_unbondWithdraw_neverExceedsFree_succeeds(uint128 unbond, uint128 extra) public {
        unbond = uint128(bound(unbond, 1, 20 ether));
        extra = uint128(bound(extra, 0, 50 ether));
        vm.deal(operator, uint256(extra) + 1 ether);
        if (extra > 0) {
            vm.prank(operator);
            stakes.bond{value: extra}();
        }
        open(postBatch(HONEST_OUT, 1, 0)); // locks 10 ether
        vm.prank(operator);
        stakes.requestUnbond(unbond);
        vm.warp(block.timestamp + 2 days);
        IStakeRegistryTypes.Account memory a = stakes.accountOf(operator);
        uint256 free = a.stake - a.locked;
        if (free == 0) return;
        vm.prank(operator);
        uint256 out = stakes.withdraw();
        vm.assertEq(out, unbond < free ? unbond : free);
        vm.assertGe(stakes.accountOf(operator).stake, stakes.accountOf(operator).locked, "locked stays");
    }
}
