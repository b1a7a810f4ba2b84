// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {IProtocolConfig} from "./interfaces/IProtocolConfig.sol";
import {IStakeRegistry} from "./interfaces/IStakeRegistry.sol";
import {IProtocolConfigTypes} from "./types/ProtocolConfigTypes.sol";

/// @title StakeRegistry
/// @notice The implementation of IStakeRegistry (the staking and liability rules are stated
///         there).
///
///         Verifier draw weights (active stake, or 0 below the minimum) live in a Fenwick (binary
///         indexed) tree over at most MAX_VERIFIERS slots whose every node keeps a checkpoint per
///         block, so a committee is drawn from the weights as they were at the end of a past
///         block (the challenge's open block) in O(log MAX_VERIFIERS) reads per seat, whatever the
///         number of verifiers. A verifier holds a slot only while its weight is > 0; slots freed
///         by leaving verifiers are reused.
contract StakeRegistry is Ownable, IStakeRegistry {
    using SafeCast for uint256;

    /// @notice A value as of the end of block `blockNumber` (until the next checkpoint).
    struct Checkpoint {
        uint48 blockNumber;
        uint208 value;
    }

    /// @notice Who held a draw-tree slot from the end of block `blockNumber` on.
    struct OwnerCheckpoint {
        uint48 blockNumber;
        address owner;
    }

    /// @notice log2 of the number of draw-tree slots.
    uint256 public constant TREE_DEPTH = 14;
    /// @notice Upper bound on verifiers holding a slot (weight > 0) at the same time. Draw cost
    ///         grows with TREE_DEPTH, not with the number of verifiers.
    uint256 public constant MAX_VERIFIERS = 1 << TREE_DEPTH;

    /// @inheritdoc IStakeRegistry
    IProtocolConfig public immutable config;
    /// @inheritdoc IStakeRegistry
    address public challengeManager;
    /// @inheritdoc IStakeRegistry
    uint96 public minOperatorStake;
    /// @inheritdoc IStakeRegistry
    uint256 public totalStake;
    /// @inheritdoc IStakeRegistry
    uint128 public minVerifierStake;
    /// @notice Highest slot ever assigned.
    uint256 public slotsUsed;
    /// @notice Verifiers holding a slot now (weight > 0).
    uint256 public verifierCount;

    mapping(address => Account) internal _accounts;
    /// @dev Fenwick node i (1..MAX_VERIFIERS) = sum of leaf weights in (i - lowbit(i), i].
    mapping(uint256 => Checkpoint[]) internal _tree;
    /// @dev Weight history of each slot.
    mapping(uint256 => Checkpoint[]) internal _leaf;
    /// @dev Holder history of each slot.
    mapping(uint256 => OwnerCheckpoint[]) internal _owners;
    /// @dev Slots released by verifiers (reused last in, first out).
    uint256[] internal _freeSlots;

    function _u112(uint256 x) private pure returns (uint112) {
        if (x > type(uint112).max) revert AmountTooLarge(x);
        return uint112(x);
    }

    modifier onlyChallengeManager() {
        if (msg.sender != challengeManager) revert NotChallengeManager(msg.sender);
        _;
    }

    /// @param governance May set the ChallengeManager once.
    /// @param config_ Source of the minimum stakes and the unbonding period.
    constructor(address governance, IProtocolConfig config_) Ownable(governance) {
        config = config_;
        _syncParams();
    }

    /// @inheritdoc IStakeRegistry
    function syncParams() external {
        _syncParams();
    }

    function _syncParams() internal {
        IProtocolConfigTypes.Params memory p = config.params();
        minOperatorStake = uint256(p.minOperatorStake).toUint96();
        minVerifierStake = p.minVerifierStake;
        emit ParamsSynced(p.minOperatorStake);
    }

    /// @inheritdoc IStakeRegistry
    function syncWeight(address account) external {
        _syncWeight(account, _accounts[account]);
    }

    /// @inheritdoc IStakeRegistry
    function setChallengeManager(address cm) external onlyOwner {
        if (challengeManager != address(0)) revert ChallengeManagerAlreadySet(challengeManager);
        challengeManager = cm;
        emit ChallengeManagerSet(cm);
    }

    // ---- stakers ------------------------------------------------------------------------

    /// @inheritdoc IStakeRegistry
    function register(Role role) external payable {
        Account storage a = _accounts[msg.sender];
        if (a.role != Role.None) revert AlreadyRegistered(msg.sender, a.role);
        if (role == Role.None) revert InvalidRole(role);
        IProtocolConfigTypes.Params memory p = config.params();
        uint256 minimum = role == Role.Operator ? p.minOperatorStake : p.minVerifierStake;
        if (msg.value < minimum) revert StakeBelowMinimum(role, msg.value, minimum);
        a.role = role;
        a.stake = _u112(msg.value);
        // Pre-warm the second slot (locked, unbondReadyAt): a dispute's first lock then rewrites
        // a live slot (~3k gas) instead of creating one (~20k) inside openChallenge. A ready time
        // of 1 is in the past, so it allows nothing: withdraw still needs unbonding > 0.
        a.unbondReadyAt = 1;
        totalStake += msg.value;
        emit Registered(msg.sender, role, msg.value);
        _syncWeight(msg.sender, a);
    }

    /// @inheritdoc IStakeRegistry
    function bond() external payable {
        Account storage a = _accounts[msg.sender];
        if (a.role == Role.None) revert NotRegistered(msg.sender);
        if (msg.value == 0) revert ZeroAmount();
        a.stake += _u112(msg.value);
        totalStake += msg.value;
        emit Bonded(msg.sender, msg.value, a.stake);
        _syncWeight(msg.sender, a);
    }

    /// @inheritdoc IStakeRegistry
    function requestUnbond(uint128 amount) external {
        Account storage a = _accounts[msg.sender];
        if (a.role == Role.None) revert NotRegistered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        uint256 available = a.stake - a.unbonding;
        if (amount > available) revert UnbondExceedsStake(msg.sender, amount, available);
        a.unbonding += _u112(amount);
        a.unbondReadyAt = uint64(block.timestamp) + config.params().unbondingPeriod;
        emit UnbondRequested(msg.sender, amount, a.unbonding, a.unbondReadyAt);
        _syncWeight(msg.sender, a);
    }

    /// @inheritdoc IStakeRegistry
    function withdraw() external returns (uint256 amount) {
        Account storage a = _accounts[msg.sender];
        if (a.unbonding == 0) revert NothingToWithdraw(msg.sender, 0, a.locked);
        if (block.timestamp < a.unbondReadyAt) {
            revert UnbondingNotReady(msg.sender, a.unbondReadyAt, block.timestamp);
        }
        // INVARIANT: stake held by live liabilities never leaves: payout <= stake - locked.
        uint256 free = a.stake > a.locked ? a.stake - a.locked : 0;
        amount = a.unbonding < free ? a.unbonding : free;
        if (amount == 0) revert NothingToWithdraw(msg.sender, a.unbonding, a.locked);
        a.stake -= _u112(amount);
        a.unbonding -= _u112(amount);
        totalStake -= amount;
        emit Withdrawn(msg.sender, amount);
        // Active stake (stake - unbonding) is unchanged: no weight update.
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    // ---- ChallengeManager hooks ---------------------------------------------------------

    /// @inheritdoc IStakeRegistry
    function lock(address account, uint256 amount) external onlyChallengeManager {
        if (amount == 0) return;
        Account storage a = _accounts[account];
        a.locked += amount.toUint128();
        emit Locked(account, amount, a.locked);
    }

    /// @inheritdoc IStakeRegistry
    function unlock(address account, uint256 amount) external onlyChallengeManager {
        if (amount == 0) return;
        Account storage a = _accounts[account];
        if (amount > a.locked) revert ExceedsLocked(account, amount, a.locked);
        a.locked -= amount.toUint128();
        emit Unlocked(account, amount, a.locked);
    }

    /// @inheritdoc IStakeRegistry
    function slashLocked(address account, uint256 amount) external onlyChallengeManager returns (uint256 taken) {
        if (amount == 0) return 0;
        Account storage a = _accounts[account];
        if (amount > a.locked) revert ExceedsLocked(account, amount, a.locked);
        a.locked -= amount.toUint128();
        taken = amount < a.stake ? amount : a.stake;
        if (taken == 0) return 0;
        a.stake -= _u112(taken);
        if (a.unbonding > a.stake) a.unbonding = a.stake;
        totalStake -= taken;
        emit Slashed(account, taken, a.stake);
        _syncWeight(account, a);
        (bool ok,) = challengeManager.call{value: taken}("");
        if (!ok) revert TransferFailed(challengeManager, taken);
    }

    // ---- draw tree ------------------------------------------------------------------------

    /// @dev Brings `who`'s draw weight (active stake if >= the verifier minimum, else 0) into the
    ///      tree, taking a slot when it becomes > 0 and releasing it when it becomes 0.
    function _syncWeight(address who, Account storage a) internal {
        if (a.role != Role.Verifier) return;
        uint256 active = uint256(a.stake) - a.unbonding;
        uint256 w = active >= minVerifierStake ? active : 0;
        uint256 slot = a.slot;
        if (slot == 0) {
            if (w == 0) return;
            slot = _takeSlot(who);
            a.slot = uint24(slot);
        }
        uint256 old = _latest(_leaf[slot]);
        if (w != old) {
            _write(_leaf[slot], w);
            for (uint256 i = slot; i <= MAX_VERIFIERS; i += i & (~i + 1)) {
                Checkpoint[] storage node = _tree[i];
                _write(node, w > old ? _latest(node) + (w - old) : _latest(node) - (old - w));
            }
            emit WeightChanged(who, slot, w);
        }
        if (w == 0) {
            a.slot = 0;
            _freeSlots.push(slot);
            verifierCount -= 1;
        }
    }

    function _takeSlot(address who) internal returns (uint256 slot) {
        uint256 n = _freeSlots.length;
        if (n != 0) {
            slot = _freeSlots[n - 1];
            _freeSlots.pop();
        } else {
            slot = slotsUsed + 1;
            if (slot > MAX_VERIFIERS) revert TooManyVerifiers(MAX_VERIFIERS);
            slotsUsed = slot;
        }
        verifierCount += 1;
        _owners[slot].push(OwnerCheckpoint(uint48(block.number), who));
    }

    /// @dev Always appends, even within one block (lookups take the last checkpoint at or
    ///      before a block): a transaction's gas then does not depend on whether an earlier
    ///      transaction of the same block touched the node, so eth_estimateGas, run against
    ///      another block number, stays exact.
    function _write(Checkpoint[] storage h, uint256 v) internal {
        h.push(Checkpoint(uint48(block.number), uint208(v)));
    }

    function _latest(Checkpoint[] storage h) internal view returns (uint256) {
        uint256 n = h.length;
        return n == 0 ? 0 : h[n - 1].value;
    }

    /// @dev The value as of the end of block `blk`: the last checkpoint at or before it.
    function _at(Checkpoint[] storage h, uint256 blk) internal view returns (uint256) {
        uint256 n = h.length;
        if (n == 0) return 0;
        Checkpoint storage last = h[n - 1];
        if (last.blockNumber <= blk) return last.value; // the common case: no change since
        uint256 lo = 0;
        uint256 hi = n - 1; // h[hi] is after blk
        while (lo < hi) {
            uint256 mid = (lo + hi) / 2;
            if (h[mid].blockNumber <= blk) lo = mid + 1;
            else hi = mid;
        }
        return lo == 0 ? 0 : h[lo - 1].value;
    }

    function _ownerAt(uint256 slot, uint256 blk) internal view returns (address) {
        OwnerCheckpoint[] storage h = _owners[slot];
        uint256 n = h.length;
        while (n != 0 && h[n - 1].blockNumber > blk) n--;
        return n == 0 ? address(0) : h[n - 1].owner;
    }

    /// @inheritdoc IStakeRegistry
    function drawCommittee(bytes32 seed, uint256 snapshotBlock, uint256 size, address exclude)
        external
        view
        returns (address[] memory members, uint256[] memory weights, uint256 total)
    {
        if (snapshotBlock >= block.number) revert SnapshotNotFinal(snapshotBlock, block.number);
        members = new address[](size);
        weights = new uint256[](size);
        // Slots already taken out of the pool (chosen members and the excluded account).
        Removed memory out = Removed(new uint256[](size + 1), new uint256[](size + 1), 0);
        uint256 filled = 0;
        uint256 pool = _at(_tree[MAX_VERIFIERS], snapshotBlock);
        uint256 used = slotsUsed;
        for (uint256 nonce = 0; filled < size && pool != 0; nonce++) {
            uint256 slot = _find(uint256(keccak256(abi.encode(seed, nonce))) % pool, snapshotBlock, out, used);
            uint256 w = _at(_leaf[slot], snapshotBlock);
            out.slots[out.n] = slot;
            out.weights[out.n] = w;
            out.n++;
            pool -= w;
            address who = _ownerAt(slot, snapshotBlock);
            if (who == exclude) continue;
            members[filled] = who;
            weights[filled] = w;
            total += w;
            filled++;
        }
        assembly ("memory-safe") {
            mstore(members, filled)
            mstore(weights, filled)
        }
    }

    /// @dev Slots taken out of a draw's pool so far.
    struct Removed {
        uint256[] slots;
        uint256[] weights;
        uint256 n;
    }

    /// @dev Fenwick descent: the smallest slot whose prefix weight (removed slots counted as 0)
    ///      exceeds x. A step past `used` (the highest slot ever assigned) is never taken: the
    ///      range would hold every remaining weight, which exceeds x; so it is not read.
    function _find(uint256 x, uint256 blk, Removed memory out, uint256 used) internal view returns (uint256) {
        uint256 pos = 0;
        for (uint256 step = MAX_VERIFIERS >> 1; step != 0; step >>= 1) {
            uint256 next = pos + step;
            if (next > used) continue;
            uint256 v = _at(_tree[next], blk);
            for (uint256 k = 0; k < out.n; k++) {
                if (out.slots[k] > pos && out.slots[k] <= next) v -= out.weights[k];
            }
            if (v <= x) {
                pos = next;
                x -= v;
            }
        }
        return pos + 1;
    }

    // ---- views --------------------------------------------------------------------------

    /// @inheritdoc IStakeRegistry
    function accountOf(address who) external view returns (Account memory) {
        return _accounts[who];
    }

    /// @inheritdoc IStakeRegistry
    function activeStake(address who) public view returns (uint256) {
        Account storage a = _accounts[who];
        return a.stake - a.unbonding;
    }

    /// @inheritdoc IStakeRegistry
    function freeStake(address who) public view returns (uint256) {
        Account storage a = _accounts[who];
        return a.stake > a.locked ? a.stake - a.locked : 0;
    }

    /// @inheritdoc IStakeRegistry
    function weightOf(address who) external view returns (uint256) {
        uint256 slot = _accounts[who].slot;
        return slot == 0 ? 0 : _latest(_leaf[slot]);
    }

    /// @inheritdoc IStakeRegistry
    function totalWeightAt(uint256 blk) external view returns (uint256) {
        return _at(_tree[MAX_VERIFIERS], blk);
    }

    /// @inheritdoc IStakeRegistry
    function slotAt(uint256 slot, uint256 blk) external view returns (address owner, uint256 weight) {
        return (_ownerAt(slot, blk), _at(_leaf[slot], blk));
    }

    /// @inheritdoc IStakeRegistry
    function isActiveOperator(address who) external view returns (bool) {
        Account storage a = _accounts[who];
        return a.role == Role.Operator && a.stake - a.unbonding >= minOperatorStake;
    }

    /// @inheritdoc IStakeRegistry
    function isOperator(address who) external view returns (bool) {
        return _accounts[who].role == Role.Operator;
    }

    /// @inheritdoc IStakeRegistry
    function isVerifier(address who) external view returns (bool) {
        return _accounts[who].role == Role.Verifier;
    }

    /// @inheritdoc IStakeRegistry
    function verifierStakes()
        external
        view
        returns (address[] memory accounts, uint256[] memory active, uint256[] memory free)
    {
        uint256 used = slotsUsed;
        accounts = new address[](verifierCount);
        active = new uint256[](accounts.length);
        free = new uint256[](accounts.length);
        uint256 n = 0;
        for (uint256 slot = 1; slot <= used; slot++) {
            if (_latest(_leaf[slot]) == 0) continue;
            address who = _owners[slot][_owners[slot].length - 1].owner;
            Account storage a = _accounts[who];
            accounts[n] = who;
            active[n] = a.stake - a.unbonding;
            free[n] = a.stake > a.locked ? a.stake - a.locked : 0;
            n++;
        }
    }
}
