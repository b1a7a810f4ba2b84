// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {PoolKey} from "../src/lib/PoolKey.sol";
import {Test} from "./utils/Test.sol";
import {Fixture} from "./utils/Fixture.sol";
import {CoverageRef} from "./utils/CoverageRef.sol";
import {Vm} from "./utils/Test.sol";
import {ChallengeManager} from "../src/ChallengeManager.sol";
import {StakeRegistry} from "../src/StakeRegistry.sol";
import {ReceiptLib} from "../src/lib/ReceiptLib.sol";
import {IChallengeManager} from "../src/interfaces/IChallengeManager.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IStakeRegistry} from "../src/interfaces/IStakeRegistry.sol";
import {IStakeRegistryTypes} from "../src/types/StakeRegistryTypes.sol";

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

    /// @dev Slashes per (receipt digest, fault class: 0 content, 1 withholding) with stake taken.
    mapping(bytes32 => uint256) public slashCount;
    mapping(bytes32 => uint256) public takenFor;
    bytes32[] internal slashedDigests;
    bytes32[] internal allDigests;
    bool public doubleSlash;
    /// @dev A slash took less than its liability while the operator still had stake left.
    bool public shortSlash;
    uint256 public operatorWithdrawn;
    /// @dev Stake taken from the operator (StakeRegistry.Slashed events).
    uint256 public operatorSlashed;
    uint256 public calls;

    /// @dev An address the operator controls, filing withholding claims on its own receipts.
    address public constant OPERATOR_ALT = address(0xA17);
    uint256[] internal selfClaims;

    /// @dev The verifiers' (slot, weight) when each challenge opened, for the reference draw.
    struct Seat {
        uint256 slot;
        address who;
        uint256 weight;
    }

    mapping(uint256 => Seat[]) internal seatsAtOpen;

    /// @dev Issue 31, honest run: a colluding committee member (verifiers[3], the operator's
    ///      sybil) that always reveals a wrong output. Captured = its weight alone reached τ of
    ///      its committee; only then may an honest party (operator or revealing member) pay.
    bool public honestRevealerPaid;
    bool public honestSlashedUncaptured;
    bool public colluderOutvotedUnpunished;
    uint256 public slashedByCapture;
    /// @dev A draw chose other members than the reference draw over the weights at open.
    bool public committeeMoved;
    uint256 public drawsChecked;

    constructor(bool honest_) {
        honest = honest_;
        setUp();
        vm.deal(OPERATOR_ALT, 100 ether);
        initialEth = totalEth();
    }

    function colluder() public view returns (address) {
        return verifiers[3];
    }

    function actors() public view returns (address[] memory a) {
        a = new address[](verifiers.length + 3);
        a[0] = operator;
        a[1] = challenger;
        a[2] = OPERATOR_ALT;
        for (uint256 i = 0; i < verifiers.length; i++) {
            a[i + 3] = verifiers[i];
        }
    }

    function totalEth() public view returns (uint256 sum) {
        address[] memory a = actors();
        for (uint256 i = 0; i < a.length; i++) {
            sum += a[i].balance;
        }
        sum += address(stakes).balance + address(cm).balance;
    }

    function liveChallengeIds() external view returns (uint256[] memory) {
        return liveChallenges;
    }

    function liveClaimIds() external view returns (uint256[] memory) {
        uint256[] memory all = new uint256[](liveClaims.length + selfClaims.length);
        for (uint256 i = 0; i < liveClaims.length; i++) {
            all[i] = liveClaims[i];
        }
        for (uint256 i = 0; i < selfClaims.length; i++) {
            all[liveClaims.length + i] = selfClaims[i];
        }
        return all;
    }

    function slashedReceipts() external view returns (bytes32[] memory) {
        return slashedDigests;
    }

    function disputedReceipts() external view returns (bytes32[] memory) {
        return allDigests;
    }

    function systems() external view returns (StakeRegistry, ChallengeManager, address, address[] memory) {
        return (stakes, cm, operator, verifiers);
    }

    // ---- actions ----------------------------------------------------------------------

    function postBatchAction(uint256 n) external {
        calls++;
        if (!stakes.isActiveOperator(operator)) return;
        // The honest operator refuses to sign while no declared verifier covers its fingerprint
        // (such a receipt is invalid on its face); the mixed one signs anyway.
        if (honest && !stakes.isCoveredAt(PoolKey.key(FINGERPRINT, MODEL), uint64(block.timestamp))) return;
        n = bound(n, 1, 9);
        posted.push(postBatch(HONEST_OUT, n, n / 2));
        allDigests.push(digestOf(posted[posted.length - 1].receipt));
    }

    function openAction(uint256 seed) external {
        calls++;
        if (posted.length == 0) return;
        Posted memory p = posted[seed % posted.length];
        bytes32 d = digestOf(p.receipt);
        IChallengeManagerTypes.ReceiptState memory rs = cm.receiptState(d);
        // A live claim on the receipt does not hold a challenge off.
        if (rs.slashed || rs.liveChallenge != 0) return;
        if (block.timestamp > batches.batchOf(operator, p.root).committedAt + 1 days) return;
        if (challenger.balance < 1 ether) return;
        vm.recordLogs();
        uint256 id = open(p);
        _countSlashes();
        if (cm.challenge(id).status == IChallengeManagerTypes.Status.AwaitingDraw) {
            liveChallenges.push(id);
            // The committee's pool: verifiers declared for the receipt's fingerprint now (the end
            // of the open block), leaving ones included.
            uint256 used = stakes.poolSlotsUsed(PoolKey.key(FINGERPRINT, MODEL));
            for (uint256 slot = 1; slot <= used; slot++) {
                (address who, uint256 w) = stakes.poolSlotAt(PoolKey.key(FINGERPRINT, MODEL), slot, block.number);
                if (w != 0) seatsAtOpen[id].push(Seat(slot, who, w));
            }
        }
        // Every later stake change lands after the open block.
        vm.roll(block.number + 1);
    }

    /// The operator, from a second address, claims its own published receipt unpublished (to
    /// lock its stake, as in issue 13 attack 1) and answers the claim later.
    function selfClaimAction(uint256 seed) external {
        calls++;
        if (posted.length == 0) return;
        Posted memory p = posted[seed % posted.length];
        IChallengeManagerTypes.ReceiptState memory rs = cm.receiptState(digestOf(p.receipt));
        if (rs.liveClaim != 0 || OPERATOR_ALT.balance < 1 ether) return;
        if (block.timestamp <= uint256(p.receipt.issuedAt) + 1 hours) return;
        vm.prank(OPERATOR_ALT);
        selfClaims.push(cm.claimUnpublished{value: 1 ether}(p.receipt, p.signature));
    }

    function answerSelfClaimAction(uint256 seed) external {
        calls++;
        if (selfClaims.length == 0) return;
        _answerSelfClaim(seed % selfClaims.length);
    }

    /// @dev The operator answers its own claim (always before its deadline: see _warp).
    function _answerSelfClaim(uint256 k) internal {
        uint256 id = selfClaims[k];
        IChallengeManagerTypes.Claim memory cl = cm.claim(id);
        for (uint256 i = 0; i < posted.length; i++) {
            if (digestOf(posted[i].receipt) != cl.receiptDigest) continue;
            vm.prank(operator);
            cm.answerUnpublished(id, posted[i].root, posted[i].index, posted[i].proof);
            break;
        }
        selfClaims[k] = selfClaims[selfClaims.length - 1];
        selfClaims.pop();
    }

    /// @dev Moves the clock to `t`, first answering the self-claims whose deadline it passes.
    function _warp(uint256 t) internal {
        for (uint256 k = selfClaims.length; k > 0; k--) {
            if (cm.claim(selfClaims[k - 1]).responseDeadline < t) _answerSelfClaim(k - 1);
        }
        vm.warp(t);
    }

    /// A verifier adds stake (moves the live weights between open and draw).
    function bondAction(uint256 who, uint256 amount) external {
        calls++;
        address v = verifiers[who % verifiers.length];
        amount = bound(amount, 1, 3 ether);
        if (v.balance < amount) return;
        vm.prank(v);
        stakes.bond{value: amount}();
    }

    function drawAction(uint256 seed) external {
        calls++;
        if (liveChallenges.length == 0) return;
        uint256 id = liveChallenges[seed % liveChallenges.length];
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        if (c.status != IChallengeManagerTypes.Status.AwaitingDraw) return;
        if (block.timestamp > c.openedAt + 1 hours) return;
        if (block.number <= c.targetBlock) vm.roll(c.targetBlock + 1); // block numbers only grow
        cm.drawCommittee(id);
        _checkDraw(id, c.targetBlock);
        if (
            cm.challenge(id).status != IChallengeManagerTypes.Status.Voting
                && cm.challenge(id).status != IChallengeManagerTypes.Status.AwaitingDraw
        ) {
            _dropChallenge(id);
        }
    }

    function voteAction(uint256 seed) external {
        calls++;
        if (liveChallenges.length == 0) return;
        uint256 id = liveChallenges[seed % liveChallenges.length];
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        if (c.status != IChallengeManagerTypes.Status.Voting || c.commits != 0 || block.timestamp > c.commitDeadline) {
            return;
        }
        IChallengeManagerTypes.Member[] memory ms = cm.committee(id);
        bytes32[] memory outs = new bytes32[](ms.length);
        for (uint256 i = 0; i < ms.length; i++) {
            uint256 r = uint256(keccak256(abi.encode(seed, i))) % 8;
            if (honest && ms[i].account == colluder()) outs[i] = OTHER_OUT; // always reveals, wrong
            else if (r == 0) outs[i] = bytes32(0); // abstains: penalized
            else if (honest || r < 4) outs[i] = c.receiptOutHash;
            else outs[i] = OTHER_OUT;
        }
        for (uint256 i = 0; i < ms.length; i++) {
            if (outs[i] == bytes32(0)) continue; // abstains
            bytes32 commitment = cm.voteCommitment(id, ms[i].account, outs[i], bytes32(i + 1));
            vm.prank(ms[i].account);
            cm.commitVote(id, commitment);
        }
        _warp(c.commitDeadline + 1);
        for (uint256 i = 0; i < ms.length; i++) {
            if (outs[i] == bytes32(0)) continue;
            vm.prank(ms[i].account);
            cm.revealVote(id, outs[i], bytes32(i + 1));
        }
    }

    function resolveAction(uint256 seed) external {
        calls++;
        if (liveChallenges.length == 0) return;
        uint256 id = liveChallenges[seed % liveChallenges.length];
        IChallengeManagerTypes.Challenge memory c = cm.challenge(id);
        if (c.status == IChallengeManagerTypes.Status.AwaitingDraw) {
            if (block.timestamp <= c.openedAt + 1 hours) _warp(c.openedAt + 1 hours + 1);
        } else if (c.reveals < c.members && block.timestamp <= c.revealDeadline) {
            _warp(c.revealDeadline + 1);
        }
        bool voting = c.status == IChallengeManagerTypes.Status.Voting;
        bool captured = voting && _colluderCaptured(id, c.totalWeight);
        vm.recordLogs();
        cm.resolve(id);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        _countSlashesIn(logs);
        if (honest && voting) _checkNoHonestPays(id, captured, logs);
        _dropChallenge(id);
    }

    /// @dev The colluder revealed, and its weight alone reaches τ of the committee weight.
    function _colluderCaptured(uint256 id, uint256 total) internal view returns (bool) {
        IChallengeManagerTypes.Member[] memory ms = cm.committee(id);
        for (uint256 i = 0; i < ms.length; i++) {
            if (ms[i].account != colluder()) continue;
            if (cm.vote(id, ms[i].account).state != IChallengeManagerTypes.VoteState.Revealed) return false;
            return uint256(ms[i].weight) * 10_000 >= uint256(config.params().quorumBps) * total;
        }
        return false;
    }

    /// @dev Honest run: the receipt is true; every member but the colluder that revealed voted
    ///      it. Uncaptured, nobody who revealed it pays and the operator is not slashed; a
    ///      colluder outvoted by a dismissal pays.
    function _checkNoHonestPays(uint256 id, bool captured, Vm.Log[] memory logs) internal {
        IChallengeManagerTypes.Status s = cm.challenge(id).status;
        bool colluderPaid = false;
        for (uint256 i = 0; i < logs.length; i++) {
            if (logs[i].emitter != address(cm)) continue;
            if (logs[i].topics[0] == IChallengeManager.OperatorSlashed.selector) {
                (, uint256 amount,) = abi.decode(logs[i].data, (IChallengeManagerTypes.Fault, uint256, uint256));
                if (captured) slashedByCapture += amount;
                else honestSlashedUncaptured = true;
            }
            if (logs[i].topics[0] != IChallengeManager.MemberPenalized.selector) continue;
            address m = address(uint160(uint256(logs[i].topics[2])));
            if (m == colluder()) {
                colluderPaid = true;
            } else if (!captured && cm.vote(id, m).state == IChallengeManagerTypes.VoteState.Revealed) {
                honestRevealerPaid = true;
            }
        }
        bool colluderRevealed = cm.vote(id, colluder()).state == IChallengeManagerTypes.VoteState.Revealed;
        if (colluderRevealed && s == IChallengeManagerTypes.Status.Dismissed && !colluderPaid) {
            colluderOutvotedUnpunished = true;
        }
    }

    function claimAction(uint256 seed) external {
        calls++;
        if (honest) return; // an honest operator publishes in time
        ReceiptLib.Receipt memory r = makeReceipt(HONEST_OUT, seed);
        r.issuedAt = uint64(block.timestamp - 2 hours);
        bytes memory sig = signReceipt(OPERATOR_KEY, r);
        IChallengeManagerTypes.ReceiptState memory rs = cm.receiptState(digestOf(r));
        if (rs.unpublishedSlashed || rs.liveClaim != 0 || challenger.balance < 1 ether) return;
        vm.prank(challenger);
        liveClaims.push(cm.claimUnpublished{value: 1 ether}(r, sig));
        allDigests.push(digestOf(r));
    }

    function resolveClaimAction(uint256 seed) external {
        calls++;
        if (liveClaims.length == 0) return;
        uint256 k = seed % liveClaims.length;
        uint256 id = liveClaims[k];
        IChallengeManagerTypes.Claim memory cl = cm.claim(id);
        if (block.timestamp <= cl.responseDeadline) _warp(cl.responseDeadline + 1);
        vm.recordLogs();
        cm.resolveUnpublished(id);
        _countSlashes();
        liveClaims[k] = liveClaims[liveClaims.length - 1];
        liveClaims.pop();
    }

    function warpAction(uint256 dt) external {
        calls++;
        _warp(block.timestamp + bound(dt, 1, 3 hours));
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

    /// A verifier toggles its declaration: undeclare (stays drawable until leaveAt), re-declare
    /// (cancels), or completes a due undeclaration (anyone may).
    function declarationAction(uint256 who) external {
        calls++;
        address v = verifiers[who % verifiers.length];
        (bytes32[] memory fps, uint64[] memory leaveAt) = stakes.declarationsOf(v);
        vm.startPrank(v);
        if (fps.length == 0) {
            if (stakes.activeStake(v) >= 1 ether) stakes.declareFingerprint(FINGERPRINT, MODEL);
        } else if (leaveAt[0] == 0) {
            stakes.undeclareFingerprint(FINGERPRINT, MODEL);
        } else if (block.timestamp >= leaveAt[0]) {
            stakes.completeUndeclare(v, FINGERPRINT, MODEL);
        } else {
            stakes.declareFingerprint(FINGERPRINT, MODEL);
        }
        vm.stopPrank();
    }

    function withdrawAction(uint256 who) external {
        calls++;
        address[] memory a = actors();
        address x = a[who % a.length];
        IStakeRegistryTypes.Account memory acc = stakes.accountOf(x);
        if (acc.unbonding == 0 || block.timestamp < acc.unbondReadyAt || acc.stake == acc.locked) return;
        uint256 before = x.balance;
        vm.prank(x);
        uint256 free = stakes.freeStake(x);
        stakes.withdraw();
        // INVARIANT under test: what left is never more than the stake above the liabilities.
        require(x.balance - before <= free, "withdrew stake held by liabilities");
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
        _countSlashesIn(vm.getRecordedLogs());
    }

    function _countSlashesIn(Vm.Log[] memory logs) internal {
        for (uint256 i = 0; i < logs.length; i++) {
            if (logs[i].emitter == address(cm) && logs[i].topics[0] == IChallengeManager.OperatorSlashed.selector) {
                bytes32 d = logs[i].topics[2];
                (IChallengeManagerTypes.Fault fault, uint256 amount,) =
                    abi.decode(logs[i].data, (IChallengeManagerTypes.Fault, uint256, uint256));
                if (amount == 0) continue;
                bytes32 key = keccak256(abi.encode(d, fault == IChallengeManagerTypes.Fault.Unpublished ? 1 : 0));
                if (++slashCount[key] > 1) doubleSlash = true;
                if (takenFor[d] == 0) slashedDigests.push(d);
                takenFor[d] += amount;
            }
            if (
                logs[i].emitter == address(stakes) && logs[i].topics[0] == IStakeRegistry.Slashed.selector
                    && address(uint160(uint256(logs[i].topics[1]))) == operator
            ) {
                (uint256 amount, uint256 newStake) = abi.decode(logs[i].data, (uint256, uint256));
                operatorSlashed += amount;
                // A dispute's liability is slashAmount (10 ether): it takes all of it unless the
                // operator's stake ran out.
                if (amount != 10 ether && newStake != 0) shortSlash = true;
            }
        }
    }

    /// @dev Recomputes the draw from the weights recorded at open (slot order, same seat rule,
    ///      nobody excluded: the challenger is drawable like any verifier) and compares it with
    ///      the members the contract chose.
    function _checkDraw(uint256 id, uint40 target) internal {
        IChallengeManagerTypes.Member[] memory ms = cm.committee(id);
        if (cm.challenge(id).status == IChallengeManagerTypes.Status.AwaitingDraw) return; // re-armed
        Seat[] memory seats = seatsAtOpen[id];
        // Sort by slot (insertion sort; a handful of verifiers).
        for (uint256 i = 1; i < seats.length; i++) {
            for (uint256 j = i; j > 0 && seats[j - 1].slot > seats[j].slot; j--) {
                (seats[j - 1], seats[j]) = (seats[j], seats[j - 1]);
            }
        }
        bytes32 seed = keccak256(abi.encode(blockhash(target), id));
        (address[] memory expected, uint256 filled) = _referenceDraw(seats, seed);
        drawsChecked++;
        if (filled != ms.length) committeeMoved = true;
        for (uint256 i = 0; i < ms.length && i < filled; i++) {
            if (ms[i].account != expected[i]) committeeMoved = true;
        }
    }

    /// @dev Seats drawn without replacement from `seats` (sorted by slot).
    function _referenceDraw(Seat[] memory seatsIn, bytes32 seed)
        internal
        pure
        returns (address[] memory expected, uint256 filled)
    {
        Seat[] memory seats = new Seat[](seatsIn.length);
        uint256 pool = 0;
        for (uint256 i = 0; i < seatsIn.length; i++) {
            seats[i] = Seat(seatsIn[i].slot, seatsIn[i].who, seatsIn[i].weight);
            pool += seats[i].weight;
        }
        uint256 size = 3; // committeeSize
        expected = new address[](size);
        for (uint256 nonce = 0; filled < size && pool != 0; nonce++) {
            uint256 x = uint256(keccak256(abi.encode(seed, nonce))) % pool;
            for (uint256 j = 0; j < seats.length; j++) {
                if (x >= seats[j].weight) {
                    x -= seats[j].weight;
                    continue;
                }
                pool -= seats[j].weight;
                seats[j].weight = 0;
                expected[filled++] = seats[j].who;
                break;
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
        s = new bytes4[](15);
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
        s[11] = this.selfClaimAction.selector;
        s[12] = this.answerSelfClaimAction.selector;
        s[13] = this.bondAction.selector;
        s[14] = this.declarationAction.selector;
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
        for (uint256 i = 0; i < ids.length; i++) {
            bonds += cm.challenge(ids[i]).bond;
        }
        ids = handler.liveClaimIds();
        for (uint256 i = 0; i < ids.length; i++) {
            bonds += cm.claim(ids[i]).bond;
        }
        vm.assertEq(address(cm).balance, bonds + cm.totalCredits() + cm.totalBurnt(), "cm balance accounting");
        vm.assertEq(cm.bondsHeld(), bonds, "bondsHeld view");
    }

    /// No receipt is slashed twice for the same kind of fault.
    function invariant_noDoubleSlash() public view {
        vm.assertFalse(handler.doubleSlash(), "a receipt was slashed twice");
    }

    /// The amount a proven fault costs the operator does not depend on any other claim or
    /// challenge anyone opened (self-claims included): every slash takes its whole liability
    /// (slashAmount) unless the operator's stake is exhausted by earlier slashes.
    function invariant_slashIndependentOfOtherDisputes() public view {
        vm.assertFalse(handler.shortSlash(), "a slash took less than slashAmount with stake left");
    }

    /// Stake conservation: the operator's stake changes only by its withdrawals and by stake
    /// actually taken in slashes.
    function invariant_operatorStakeConserved() public view {
        (StakeRegistry stakes,, address op,) = handler.systems();
        vm.assertEq(
            uint256(stakes.accountOf(op).stake) + handler.operatorWithdrawn() + handler.operatorSlashed(),
            20 ether,
            "operator stake + withdrawn + slashed"
        );
    }

    /// A receipt is marked slashed only when stake was actually taken for it (and every
    /// slash that took stake marked its receipt).
    function invariant_slashedMeansStakeTaken() public view {
        (, ChallengeManager cm,,) = handler.systems();
        bytes32[] memory ds = handler.slashedReceipts();
        for (uint256 i = 0; i < ds.length; i++) {
            IChallengeManagerTypes.ReceiptState memory rs = cm.receiptState(ds[i]);
            vm.assertTrue(rs.slashed || rs.unpublishedSlashed, "stake taken but receipt not marked");
        }
        ds = handler.disputedReceipts();
        for (uint256 i = 0; i < ds.length; i++) {
            IChallengeManagerTypes.ReceiptState memory rs = cm.receiptState(ds[i]);
            if (rs.slashed || rs.unpublishedSlashed) {
                vm.assertGe(handler.takenFor(ds[i]), 1, "marked slashed without stake taken");
            }
        }
    }

    /// Committee membership is independent of stake and declaration changes after the open
    /// block: every draw equals a reference draw over the weights, in the pool of the receipt's
    /// fingerprint, recorded when the challenge opened (so every member was declared for the
    /// fingerprint at the snapshot).
    function invariant_committeeFixedAtOpen() public view {
        vm.assertFalse(handler.committeeMoved(), "a post-open stake change moved a committee");
    }

    /// The operator's liabilities equal the sum of its live challenges' and claims' liabilities;
    /// verifiers' stake never drops below their locked penalties by withdrawal.
    function invariant_lockedStakeStays() public view {
        (StakeRegistry stakes, ChallengeManager cm, address op, address[] memory vs) = handler.systems();
        IStakeRegistryTypes.Account memory a = stakes.accountOf(op);
        uint256 reserved = 0;
        uint256[] memory ids = handler.liveChallengeIds();
        for (uint256 i = 0; i < ids.length; i++) {
            reserved += cm.challenge(ids[i]).lockedStake;
        }
        ids = handler.liveClaimIds();
        for (uint256 i = 0; i < ids.length; i++) {
            reserved += cm.claim(ids[i]).lockedStake;
        }
        vm.assertEq(a.locked, reserved, "operator lock == live liabilities");
        vs; // verifiers: withdrawAction checks that no withdrawal touches stake held by liabilities
    }

    /// Whatever bonds, unbonds, slashes, penalties and declaration toggles ran: FINGERPRINT's
    /// coverage now is the weight (and number) of its counting declarations, recomputed from
    /// the accounts, and the total by time is the draw tree's total.
    function invariant_coverageIsSumOfCountingDeclarations() public view {
        (StakeRegistry stakes,,, address[] memory vs) = handler.systems();
        // the fixture's (FINGERPRINT, MODEL) pool
        bytes32 pool = PoolKey.key(keccak256("fingerprint"), keccak256("model"));
        (uint256 sum, uint256 count, uint256 total) = CoverageRef.recompute(stakes, vs, pool);
        uint64 t = uint64(block.timestamp);
        vm.assertEq(stakes.coverageWeightAt(pool, t), sum, "coverage weight == counting declarations");
        vm.assertEq(stakes.coverageAt(pool, t), count, "coverage count == counting declarations");
        vm.assertEq(stakes.verifierWeightAtTime(t), total, "total by time == all weights");
        vm.assertEq(stakes.verifierWeightAtTime(t), stakes.totalWeightAt(block.number), "== the draw tree's");
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
    /// own withdrawals, and by committees the colluder captured alone (its weight >= τ of the
    /// committee: stake-weighted voting promises nothing then).
    function invariant_honestOperatorNeverSlashed() public view {
        (StakeRegistry stakes,, address op,) = handler.systems();
        vm.assertEq(
            stakes.accountOf(op).stake + handler.operatorWithdrawn() + handler.slashedByCapture(),
            20 ether,
            "honest operator stake"
        );
        vm.assertFalse(handler.honestSlashedUncaptured(), "honest operator slashed by an uncaptured committee");
    }

    /// Issue 31: with a colluding member that always reveals a wrong output, no member that
    /// revealed the true output pays unless the colluder alone held τ of the committee, and a
    /// colluder outvoted by a dismissal pays the penalty.
    function invariant_noHonestRevealerPays() public view {
        vm.assertFalse(handler.honestRevealerPaid(), "an honest revealer paid");
        vm.assertFalse(handler.colluderOutvotedUnpunished(), "an outvoted colluder paid nothing");
    }
}
