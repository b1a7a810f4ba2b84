// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Test} from "./Test.sol";
import {ProtocolConfig} from "../../src/ProtocolConfig.sol";
import {StakeRegistry} from "../../src/StakeRegistry.sol";
import {BatchRegistry} from "../../src/BatchRegistry.sol";
import {ChallengeManager} from "../../src/ChallengeManager.sol";
import {AuditLog} from "../../src/AuditLog.sol";
import {ReceiptLib} from "../../src/lib/ReceiptLib.sol";
import {BatchMerkle} from "../../src/lib/BatchMerkle.sol";
import {IChallengeManagerTypes} from "../../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../../src/types/ProtocolConfigTypes.sol";
import {IStakeRegistryTypes} from "../../src/types/StakeRegistryTypes.sol";

/// @dev Deploys the whole system with small test parameters and offers the protocol steps as
///      helpers (sign a receipt, commit a batch, open, draw, vote, resolve).
abstract contract Fixture is Test {
    ProtocolConfig internal config;
    StakeRegistry internal stakes;
    BatchRegistry internal batches;
    ChallengeManager internal cm;
    AuditLog internal audits;

    uint256 internal constant OPERATOR_KEY = 0xA11CE;
    address internal operator;
    address internal challenger = address(0xC0FFEE);
    address[] internal verifiers;

    bytes32 internal constant MODEL = keccak256("model");
    bytes32 internal constant FINGERPRINT = keccak256("fingerprint");
    bytes32 internal constant MEASUREMENT = keccak256("measurement");
    uint64 internal constant EPOCH = 1;
    bytes32 internal constant HONEST_OUT = keccak256("honest output");
    bytes32 internal constant OTHER_OUT = keccak256("different output");

    uint256 internal constant T0 = 1_767_225_600;
    /// @dev StakeRegistry.minCoverageBps of the fixture: the production default (10%).
    uint256 internal constant MIN_COVERAGE_BPS = 1000;
    /// @dev ProtocolConfig.governanceNotice of the fixture: the production default (10 minutes).
    uint64 internal constant GOVERNANCE_NOTICE = 10 minutes;

    function defaultParams() internal pure returns (IProtocolConfigTypes.Params memory p) {
        p.challengeWindow = 1 days;
        p.publicationDeadline = 1 hours;
        p.responsePeriod = 1 hours;
        p.drawPeriod = 1 hours;
        p.commitPeriod = 1 hours;
        p.revealPeriod = 1 hours;
        p.unbondingPeriod = 2 days;
        p.drawDelayBlocks = 2;
        p.committeeSize = 3;
        p.quorumBps = 6666; // 2 of 3 equal seats are a quorum (ProtocolConfig: τ·n <= (n - 1)·BPS)
        p.challengerRewardBps = 2000;
        p.majorityRewardBps = 3000;
        p.challengeBond = 1 ether;
        p.nonRevealPenalty = 0.5 ether;
        p.slashAmount = 10 ether;
        p.minOperatorStake = 20 ether; // >= MIN_OPERATOR_STAKE_SLASHES (2) · slashAmount
        p.minVerifierStake = 1 ether;
        p.claimWindow = 1 days;
    }

    /// @dev The parameters the fixture deploys with (a test may start from others).
    function initialParams() internal pure virtual returns (IProtocolConfigTypes.Params memory) {
        return defaultParams();
    }

    function setUp() public virtual {
        vm.warp(T0);
        vm.roll(100);
        config = new ProtocolConfig(address(this), initialParams(), GOVERNANCE_NOTICE);
        stakes = new StakeRegistry(address(this), config, 10 minutes, MIN_COVERAGE_BPS);
        batches = new BatchRegistry(stakes);
        cm = new ChallengeManager(config, stakes, batches);
        audits = new AuditLog(stakes);
        stakes.setChallengeManager(address(cm));
        config.approve(IProtocolConfigTypes.Kind.Model, MODEL);
        config.approve(IProtocolConfigTypes.Kind.EngineFingerprint, FINGERPRINT);
        config.approve(IProtocolConfigTypes.Kind.EnclaveMeasurement, MEASUREMENT);
        config.registerKeyEpoch(EPOCH, hex"04aabb", keccak256("commitments"), 2, 3);
        operator = vm.addr(OPERATOR_KEY);
        vm.deal(operator, 100 ether);
        vm.prank(operator);
        stakes.register{value: 20 ether}(IStakeRegistryTypes.Role.Operator);
        vm.deal(challenger, 100 ether);
        for (uint256 i = 0; i < 4; i++) {
            address v = address(uint160(0xBEEF00 + i));
            verifiers.push(v);
            vm.deal(v, 100 ether);
            vm.prank(v);
            stakes.register{value: 5 ether}(IStakeRegistryTypes.Role.Verifier);
            vm.prank(v);
            stakes.declareFingerprint(FINGERPRINT, MODEL);
        }
        // Receipts rely on coverage COVERAGE_NOTICE before their issuedAt.
        vm.warp(T0 + 10 + stakes.coverageNotice());
    }

    // ---- receipts ---------------------------------------------------------------------

    function makeReceipt(bytes32 outHash, uint256 salt) internal view returns (ReceiptLib.Receipt memory r) {
        r = ReceiptLib.Receipt({
            version: 1,
            operator: operator,
            chainId: block.chainid,
            modelId: MODEL,
            engineFingerprintHash: FINGERPRINT,
            reqHash: keccak256(abi.encode("req", salt)),
            outHash: outHash,
            keyEpoch: EPOCH,
            ciphertextHash: keccak256(abi.encode("ct", salt)),
            issuedAt: uint64(block.timestamp)
        });
    }

    function digestOf(ReceiptLib.Receipt memory r) internal view returns (bytes32) {
        return ReceiptLib.digest(cm.domainSeparator(), ReceiptLib.structHashMemory(r));
    }

    function signReceipt(uint256 key, ReceiptLib.Receipt memory r) internal view returns (bytes memory) {
        (uint8 v, bytes32 rr, bytes32 s) = vm.sign(key, digestOf(r));
        return abi.encodePacked(rr, s, v);
    }

    // ---- Merkle (test-side builder, independent of BatchMerkle's verifier) ---------------

    function merkleRoot(bytes32[] memory digests) internal pure returns (bytes32) {
        bytes32[] memory level = new bytes32[](digests.length);
        for (uint256 i = 0; i < digests.length; i++) {
            level[i] = keccak256(abi.encodePacked(bytes1(0x00), digests[i]));
        }
        while (level.length > 1) level = _up(level);
        return level[0];
    }

    function merkleProof(bytes32[] memory digests, uint256 index) internal pure returns (bytes32[] memory) {
        bytes32[] memory level = new bytes32[](digests.length);
        for (uint256 i = 0; i < digests.length; i++) {
            level[i] = keccak256(abi.encodePacked(bytes1(0x00), digests[i]));
        }
        bytes32[] memory tmp = new bytes32[](64);
        uint256 n = 0;
        while (level.length > 1) {
            uint256 sib = index ^ 1;
            if (sib < level.length) tmp[n++] = level[sib];
            level = _up(level);
            index >>= 1;
        }
        bytes32[] memory out = new bytes32[](n);
        for (uint256 i = 0; i < n; i++) {
            out[i] = tmp[i];
        }
        return out;
    }

    function _up(bytes32[] memory level) private pure returns (bytes32[] memory next) {
        next = new bytes32[]((level.length + 1) / 2);
        for (uint256 i = 0; i < level.length / 2; i++) {
            next[i] = keccak256(abi.encodePacked(bytes1(0x01), level[2 * i], level[2 * i + 1]));
        }
        if (level.length % 2 == 1) next[next.length - 1] = level[level.length - 1];
    }

    // ---- protocol steps -----------------------------------------------------------------

    struct Posted {
        ReceiptLib.Receipt receipt;
        bytes signature;
        bytes32 root;
        uint256 index;
        bytes32[] proof;
    }

    /// @dev Commits a batch of `n` receipts (all with `outHash`) and returns receipt `index`.
    function postBatch(bytes32 outHash, uint256 n, uint256 index) internal returns (Posted memory p) {
        return _post(FINGERPRINT, outHash, n, index, uint256(outHash));
    }

    /// @dev The same under engine fingerprint `fp` (salted by it too, so the receipts differ).
    function postUnder(bytes32 fp, bytes32 outHash, uint256 n, uint256 index) internal returns (Posted memory p) {
        unchecked {
            return _post(fp, outHash, n, index, uint256(outHash) + uint256(fp));
        }
    }

    /// @dev The same under engine fingerprint `fp` and model `model` (salted by both).
    function postFor(bytes32 fp, bytes32 model, bytes32 outHash, uint256 n, uint256 index)
        internal
        returns (Posted memory p)
    {
        unchecked {
            return _postFor(fp, model, outHash, n, index, uint256(outHash) + uint256(fp) + uint256(model));
        }
    }

    function _post(bytes32 fp, bytes32 outHash, uint256 n, uint256 index, uint256 salt)
        private
        returns (Posted memory p)
    {
        return _postFor(fp, MODEL, outHash, n, index, salt);
    }

    function _postFor(bytes32 fp, bytes32 model, bytes32 outHash, uint256 n, uint256 index, uint256 salt)
        private
        returns (Posted memory p)
    {
        bytes32[] memory digests = new bytes32[](n);
        for (uint256 i = 0; i < n; i++) {
            ReceiptLib.Receipt memory r = makeReceipt(outHash, i + salt);
            r.engineFingerprintHash = fp;
            r.modelId = model;
            digests[i] = digestOf(r);
            if (i == index) p.receipt = r;
        }
        p.signature = signReceipt(OPERATOR_KEY, p.receipt);
        p.root = merkleRoot(digests);
        p.index = index;
        p.proof = merkleProof(digests, index);
        vm.prank(operator);
        batches.commitBatch(p.root, uint32(n), "da://local/0x00");
    }

    function open(Posted memory p) internal returns (uint256 id) {
        vm.prank(challenger);
        id = cm.openChallenge{value: 1 ether}(p.receipt, p.signature, p.root, p.index, p.proof);
    }

    function draw(uint256 id) internal returns (IChallengeManagerTypes.Member[] memory) {
        uint256 target = cm.challenge(id).targetBlock;
        if (block.number <= target) vm.roll(target + 1); // block numbers only grow
        cm.drawCommittee(id);
        return cm.committee(id);
    }

    function commitAndReveal(uint256 id, IChallengeManagerTypes.Member[] memory ms, bytes32[] memory outs) internal {
        for (uint256 i = 0; i < ms.length; i++) {
            if (outs[i] == bytes32(0)) continue; // abstains
            bytes32 commitment = cm.voteCommitment(id, ms[i].account, outs[i], bytes32(i + 1));
            vm.prank(ms[i].account);
            cm.commitVote(id, commitment);
        }
        vm.warp(cm.challenge(id).commitDeadline + 1);
        for (uint256 i = 0; i < ms.length; i++) {
            if (outs[i] == bytes32(0)) continue;
            vm.prank(ms[i].account);
            cm.revealVote(id, outs[i], bytes32(i + 1));
        }
    }

    function allSame(uint256 n, bytes32 v) internal pure returns (bytes32[] memory outs) {
        outs = new bytes32[](n);
        for (uint256 i = 0; i < n; i++) {
            outs[i] = v;
        }
    }
}
