// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Test} from "./utils/Test.sol";
import {Fixture} from "./utils/Fixture.sol";
import {Vm} from "./utils/Test.sol";
import {ChallengeManager} from "../src/ChallengeManager.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";

/// @dev Drives the whole protocol with random but well-formed steps. In honest mode the operator
///      publishes every receipt in time and every revealing member reports the receipt's outHash;
///      otherwise members vote at random and clients also file withholding claims.
contract ProtocolHandler is Fixture {
    bool public immutable honest;
    uint256 public immutable initialEth;

    Posted[] internal posted;
    uint256[] internal liveChallenges;
    uint256[] internal liveClaims;
    ReceiptLib.Receipt[] internal unpublished;
    bytes[] internal unpublishedSigs;

    mapping(bytes32 => uint256) public slashCount;
    bool public doubleSlash;
    uint256 public operatorWithdrawn;
    uint256 public calls;

    constructor(bool honest_) {
        honest = honest_;
        setUp();
        initialEth = totalEth();
    }

    function actors() public view returns (address[] memory a) {
        a = new address[](verifiers.length + 2);
        a[0] = operator;
        a[1] = challenger;
        for (uint256 i = 0; i < verifiers.length; i++) a[i + 2] = verifiers[i];
    }

    function totalEth() public view returns (uint256 sum) {
        address[] memory a = actors();
        for (uint256 i = 0; i < a.length; i++) sum += a[i].balance;
        sum += address(stakes).balance + address(cm).balance;
    }

    function liveChallengeIds() external view returns (uint256[] memory) {
        return liveChallenges;
    }

    function liveClaimIds() external view returns (uint256[] memory) {
        return liveClaims;
    }

    function systems() external view returns (StakeRegistry, ChallengeManager, address, address[] memory) {
        return (stakes, cm, operator, verifiers);
    }

    // ---- actions ----------------------------------------------------------------------

    function postBatchAction(uint256 n) external {
        calls++;
        if (!stakes.isActiveOperator(operator)) return;
        n = bound(n, 1, 9);
        posted.push(postBatch(HONEST_OUT, n, n / 2));
    }

    function openAction(uint256 seed) external {
        calls++;
        if (posted.length == 0) return;
        Posted memory p = posted[seed % posted.length];
        bytes32 d = digestOf(p.receipt);
        ChallengeManager.ReceiptState memory rs = cm.receiptState(d);
        if (rs.slashed || rs.liveChallenge != 0 || rs.liveClaim != 0) return;
        if (block.timestamp > batches.batchOf(operator, p.root).committedAt + 1 days) return;
        if (challenger.balance < 1 ether) return;
        vm.recordLogs();
        uint256 id = open(p);
        _countSlashes();
        if (cm.challenge(id).status == ChallengeManager.Status.AwaitingDraw) liveChallenges.push(id);
    }

    function drawAction(uint256 seed) external {
        calls++;
        if (liveChallenges.length == 0) return;
        uint256 id = liveChallenges[seed % liveChallenges.length];
        ChallengeManager.Challenge memory c = cm.challenge(id);
        if (c.status != ChallengeManager.Status.AwaitingDraw) return;
        if (block.timestamp > c.openedAt + 1 hours) return;
        vm.roll(c.targetBlock + 1);
        cm.drawCommittee(id);
        if (cm.challenge(id).status != ChallengeManager.Status.Voting && cm.challenge(id).status != ChallengeManager.Status.AwaitingDraw) {
            _dropChallenge(id);
        }
    }

    function voteAction(uint256 seed) external {
        calls++;
        if (liveChallenges.length == 0) return;
        uint256 id = liveChallenges[seed % liveChallenges.length];
        ChallengeManager.Challenge memory c = cm.challenge(id);
        if (c.status != ChallengeManager.Status.Voting || c.commits != 0 || block.timestamp > c.commitDeadline) return;
        ChallengeManager.Member[] memory ms = cm.committee(id);
        bytes32[] memory outs = new bytes32[](ms.length);
        for (uint256 i = 0; i < ms.length; i++) {
            uint256 r = uint256(keccak256(abi.encode(seed, i))) % 8;
            if (r == 0) outs[i] = bytes32(0); // abstains: penalized
            else if (honest || r < 4) outs[i] = c.receiptOutHash;
            else outs[i] = OTHER_OUT;
        }
        commitAndReveal(id, ms, outs);
    }

    function resolveAction(uint256 seed) external {
        calls++;
        if (liveChallenges.length == 0) return;
        uint256 id = liveChallenges[seed % liveChallenges.length];
        ChallengeManager.Challenge memory c = cm.challenge(id);
        if (c.status == ChallengeManager.Status.AwaitingDraw) {
            if (block.timestamp <= c.openedAt + 1 hours) vm.warp(c.openedAt + 1 hours + 1);
        } else if (c.reveals < c.members && block.timestamp <= c.revealDeadline) {
            vm.warp(c.revealDeadline + 1);
        }
        vm.recordLogs();
        cm.resolve(id);
        _countSlashes();
        _dropChallenge(id);
    }

    function claimAction(uint256 seed) external {
        calls++;
        if (honest) return; // an honest operator publishes in time
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, seed);
        r.issuedAt = uint64(block.timestamp - 2 hours);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        ChallengeManager.ReceiptState memory rs = cm.receiptState(digestOf(r));
        if (rs.slashed || rs.liveClaim != 0 || rs.liveChallenge != 0 || challenger.balance < 1 ether) return;
        vm.prank(challenger);
        liveClaims.push(cm.claimUnpublished{value: 1 ether}(r, sig));
    }

    function resolveClaimAction(uint256 seed) external {
        calls++;
        if (liveClaims.length == 0) return;
        uint256 k = seed % liveClaims.length;
        uint256 id = liveClaims[k];
        ChallengeManager.Claim memory cl = cm.claim(id);
        if (block.timestamp <= cl.responseDeadline) vm.warp(cl.responseDeadline + 1);
        vm.recordLogs();
        cm.resolveUnpublished(id);
        _countSlashes();
        liveClaims[k] = liveClaims[liveClaims.length - 1];
        liveClaims.pop();
    }

    function warpAction(uint256 dt) external {
        calls++;
        vm.warp(block.timestamp + bound(dt, 1, 3 hours));
        vm.roll(block.number + bound(dt, 1, 20));
    }

    function unbondAction(uint256 who, uint256 amount) external {
        calls++;
        address[] memory a = actors();
        address x = a[who % a.length];
        if (x == challenger) return;
        uint256 avail = stakes.activeStake(x);
        if (avail == 0) return;
        vm.prank(x);
        stakes.requestUnbond(uint128(bound(amount, 1, avail)));
    }

    function withdrawAction(uint256 who) external {
        calls++;
        address[] memory a = actors();
        address x = a[who % a.length];
        StakeRegistry.Account memory acc = stakes.accountOf(x);
        if (acc.unbonding == 0 || block.timestamp < acc.unbondReadyAt || acc.stake == acc.locked) return;
        uint256 before = x.balance;
        vm.prank(x);
        stakes.withdraw();
        // INVARIANT under test: what left is never more than the unlocked stake.
        require(stakes.accountOf(x).stake >= stakes.accountOf(x).locked, "withdrew locked stake");
        if (x == operator) operatorWithdrawn += x.balance - before;
    }

    function withdrawCreditsAction(uint256 who) external {
        calls++;
        address[] memory a = actors();
        address x = a[who % a.length];
        if (cm.credits(x) == 0) return;
        vm.prank(x);
        cm.withdrawCredits();
    }

    // ---- bookkeeping ------------------------------------------------------------------

    function _countSlashes() internal {
        Vm.Log[] memory logs = vm.getRecordedLogs();
        for (uint256 i = 0; i < logs.length; i++) {
            if (logs[i].emitter == address(cm) && logs[i].topics[0] == ChallengeManager.OperatorSlashed.selector) {
                bytes32 d = logs[i].topics[2];
                if (++slashCount[d] > 1) doubleSlash = true;
            }
        }
    }

    function _dropChallenge(uint256 id) internal {
        for (uint256 i = 0; i < liveChallenges.length; i++) {
            if (liveChallenges[i] == id) {
                liveChallenges[i] = liveChallenges[liveChallenges.length - 1];
                liveChallenges.pop();
                return;
            }
        }
    }

    function selectors() external pure returns (bytes4[] memory s) {
        s = new bytes4[](11);
        s[0] = this.postBatchAction.selector;
        s[1] = this.openAction.selector;
        s[2] = this.drawAction.selector;
        s[3] = this.voteAction.selector;
        s[4] = this.resolveAction.selector;
        s[5] = this.claimAction.selector;
        s[6] = this.resolveClaimAction.selector;
        s[7] = this.warpAction.selector;
        s[8] = this.unbondAction.selector;
        s[9] = this.withdrawAction.selector;
        s[10] = this.withdrawCreditsAction.selector;
    }
}

abstract contract ProtocolInvariants is Test {
    ProtocolHandler internal handler;

    function _init(bool honest) internal {
        handler = new ProtocolHandler(honest);
        targetContract(address(handler));
        targetSelector(FuzzSelector(address(handler), handler.selectors()));
        // The fuzzer must not impersonate protocol actors (it would fund or drain them).
        targetSender(address(0x5E4DE4));
    }

    /// Total stake is conserved: balances + stake + bonds + credits + burnt never change in sum.
    function invariant_ethConserved() public view {
        (StakeRegistry stakes, ChallengeManager cm,,) = handler.systems();
        vm.assertEq(handler.totalEth(), handler.initialEth(), "total ETH");
        vm.assertEq(address(stakes).balance, stakes.totalStake(), "registry balance == total stake");
        uint256 bonds = 0;
        uint256[] memory ids = handler.liveChallengeIds();
        for (uint256 i = 0; i < ids.length; i++) bonds += cm.challenge(ids[i]).bond;
        ids = handler.liveClaimIds();
        for (uint256 i = 0; i < ids.length; i++) bonds += cm.claim(ids[i]).bond;
        vm.assertEq(address(cm).balance, bonds + cm.totalCredits() + cm.totalBurnt(), "cm balance accounting");
        vm.assertEq(cm.bondsHeld(), bonds, "bondsHeld view");
    }

    /// No receipt is slashed twice.
    function invariant_noDoubleSlash() public view {
        vm.assertFalse(handler.doubleSlash(), "a receipt was slashed twice");
    }

    /// Nobody holds less stake than live disputes have locked; the operator's lock equals the
    /// sum reserved by its live challenges and claims.
    function invariant_lockedStakeStays() public view {
        (StakeRegistry stakes, ChallengeManager cm, address op, address[] memory vs) = handler.systems();
        StakeRegistry.Account memory a = stakes.accountOf(op);
        vm.assertGe(a.stake, a.locked, "operator stake >= locked");
        uint256 reserved = 0;
        uint256[] memory ids = handler.liveChallengeIds();
        for (uint256 i = 0; i < ids.length; i++) reserved += cm.challenge(ids[i]).lockedStake;
        ids = handler.liveClaimIds();
        for (uint256 i = 0; i < ids.length; i++) reserved += cm.claim(ids[i]).lockedStake;
        vm.assertEq(a.locked, reserved, "operator lock == live reservations");
        for (uint256 i = 0; i < vs.length; i++) {
            StakeRegistry.Account memory v = stakes.accountOf(vs[i]);
            vm.assertGe(v.stake, v.locked, "verifier stake >= locked");
        }
    }
}

contract MixedProtocolInvariantTest is ProtocolInvariants {
    function setUp() public {
        _init(false);
    }
}

contract HonestOperatorInvariantTest is ProtocolInvariants {
    function setUp() public {
        _init(true);
    }

    /// An operator whose receipts all match is never slashed: its stake only leaves by its
    /// own withdrawals.
    function invariant_honestOperatorNeverSlashed() public view {
        (StakeRegistry stakes,, address op,) = handler.systems();
        vm.assertEq(stakes.accountOf(op).stake + handler.operatorWithdrawn(), 20 ether, "honest operator stake");
    }
}
