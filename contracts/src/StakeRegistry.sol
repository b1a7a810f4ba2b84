// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ProtocolConfig} from "./ProtocolConfig.sol";

/// @title StakeRegistry
/// @notice Operators and verifiers bond native ETH here. Stake leaves only through
///         requestUnbond -> (unbondingPeriod) -> withdraw, and never while live disputes hold
///         liabilities against it. Only the ChallengeManager locks, unlocks and slashes.
///
///         Disputes add *liabilities* (`locked`): every dispute records its full amount, whatever
///         other disputes exist, so opening a dispute can never be blocked and never shrinks the
///         amount another dispute can take. A slash takes min(liability, stake) at resolution:
///         a dispute that ends without a slash (answered, dismissed, inconclusive) takes nothing
///         from anyone. Stake above the liabilities may be withdrawn after unbonding.
///
///         Verifier draw weights (active stake, or 0 below the minimum) live in a Fenwick (binary
///         indexed) tree over at most MAX_VERIFIERS slots whose every node keeps a checkpoint per
///         block, so a committee is drawn from the weights as they were at the end of a past
///         block (the challenge's open block) in O(log MAX_VERIFIERS) reads per seat, whatever the
///         number of verifiers. A verifier holds a slot only while its weight is > 0; slots freed
///         by leaving verifiers are reused.
contract StakeRegistry is Ownable {
    using SafeCast for uint256;

    error AmountTooLarge(uint256 amount);

    /// @notice What an address is registered as (one role per address).
    enum Role {
        None,
        Operator,
        Verifier
    }

    /// @notice One staker. `stake` includes `unbonding`; `locked` is the sum of the liabilities of
    ///         live disputes (it may exceed `stake`; a slash takes at most `stake`). Active
    ///         (voting / serving) stake = stake - unbonding. `slot` is the verifier's draw-tree
    ///         slot (0 = none).
    struct Account {
        uint112 stake;
        uint112 unbonding;
        Role role; // same slot as stake: one read answers isActiveOperator
        uint128 locked;
        uint64 unbondReadyAt;
        uint24 slot;
    }

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

    ProtocolConfig public immutable config;
    /// @notice The only address allowed to lock, unlock and slash (set once by governance).
    address public challengeManager;
    /// @notice ProtocolConfig.minOperatorStake, cached next to `challengeManager` so that a batch
    ///         commit does not call the config. Refreshed by `syncParams` (anyone may call it).
    uint96 public minOperatorStake;
    /// @notice Sum of all accounts' stake; equals this contract's balance.
    uint256 public totalStake;
    /// @notice ProtocolConfig.minVerifierStake as cached by `syncParams`: a verifier's draw
    ///         weight is its active stake if at least this, else 0. After changing the minimum,
    ///         call `syncParams` and `syncWeight(account)` for the accounts it affects.
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

    /// @notice `account` registered as `role` with an initial bond.
    event Registered(address indexed account, Role role, uint256 amount);
    /// @notice Stake added.
    event Bonded(address indexed account, uint256 amount, uint256 newStake);
    /// @notice Unbonding requested; withdrawable from `readyAt`.
    event UnbondRequested(address indexed account, uint256 amount, uint256 totalUnbonding, uint64 readyAt);
    /// @notice Unbonded stake paid out.
    event Withdrawn(address indexed account, uint256 amount);
    /// @notice A dispute added a liability.
    event Locked(address indexed account, uint256 amount, uint256 totalLocked);
    /// @notice A dispute released its liability.
    event Unlocked(address indexed account, uint256 amount, uint256 totalLocked);
    /// @notice Stake was slashed and sent to the ChallengeManager for distribution.
    event Slashed(address indexed account, uint256 amount, uint256 newStake);
    /// @notice The cached minimum stakes were refreshed.
    event ParamsSynced(uint256 minOperatorStake);
    /// @notice The ChallengeManager address was fixed.
    event ChallengeManagerSet(address challengeManager);
    /// @notice A verifier's draw weight changed (from the end of this block).
    event WeightChanged(address indexed account, uint256 slot, uint256 weight);

    /// @notice The address is already registered.
    error AlreadyRegistered(address account, Role role);
    /// @notice Role None cannot be registered.
    error InvalidRole(Role role);
    /// @notice The bond is below the role's minimum.
    error StakeBelowMinimum(Role role, uint256 amount, uint256 minimum);
    /// @notice The address is not registered.
    error NotRegistered(address account);
    /// @notice Zero amount.
    error ZeroAmount();
    /// @notice More than the bonded, not yet unbonding stake was asked for.
    error UnbondExceedsStake(address account, uint256 requested, uint256 available);
    /// @notice Unbonding has not matured.
    error UnbondingNotReady(address account, uint64 readyAt, uint256 nowTs);
    /// @notice Nothing can be withdrawn (nothing unbonding, or all of it held by liabilities).
    error NothingToWithdraw(address account, uint256 unbonding, uint256 locked);
    /// @notice Caller is not the ChallengeManager.
    error NotChallengeManager(address caller);
    /// @notice The ChallengeManager is already set.
    error ChallengeManagerAlreadySet(address current);
    /// @notice Unlock or slash of more than is locked.
    error ExceedsLocked(address account, uint256 amount, uint256 locked);
    /// @notice Every draw-tree slot is held by a verifier with weight > 0.
    error TooManyVerifiers(uint256 max);
    /// @notice A draw may only read a block that is already final (before the current one).
    error SnapshotNotFinal(uint256 snapshotBlock, uint256 blockNumber);
    /// @notice An ETH transfer failed.
    error TransferFailed(address to, uint256 amount);

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
    constructor(address governance, ProtocolConfig config_) Ownable(governance) {
        config = config_;
        _syncParams();
    }

    /// @notice Copies the minimum stakes from the ProtocolConfig (call after setParams).
    function syncParams() external {
        _syncParams();
    }

    function _syncParams() internal {
        ProtocolConfig.Params memory p = config.params();
        minOperatorStake = uint256(p.minOperatorStake).toUint96();
        minVerifierStake = p.minVerifierStake;
        emit ParamsSynced(p.minOperatorStake);
    }

    /// @notice Re-evaluates `account`'s draw weight against the cached minimum (anyone may call;
    ///         needed only after governance changed minVerifierStake).
    function syncWeight(address account) external {
        _syncWeight(account, _accounts[account]);
    }

    /// @notice Fixes the ChallengeManager (once).
    /// @param cm The ChallengeManager contract.
    function setChallengeManager(address cm) external onlyOwner {
        if (challengeManager != address(0)) revert ChallengeManagerAlreadySet(challengeManager);
        challengeManager = cm;
        emit ChallengeManagerSet(cm);
    }

    // ---- stakers ------------------------------------------------------------------------

    /// @notice Registers the caller as operator or verifier, bonding msg.value.
    /// @param role Operator or Verifier.
    function register(Role role) external payable {
        Account storage a = _accounts[msg.sender];
        if (a.role != Role.None) revert AlreadyRegistered(msg.sender, a.role);
        if (role == Role.None) revert InvalidRole(role);
        ProtocolConfig.Params memory p = config.params();
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

    /// @notice Adds msg.value to the caller's stake.
    function bond() external payable {
        Account storage a = _accounts[msg.sender];
        if (a.role == Role.None) revert NotRegistered(msg.sender);
        if (msg.value == 0) revert ZeroAmount();
        a.stake += _u112(msg.value);
        totalStake += msg.value;
        emit Bonded(msg.sender, msg.value, a.stake);
        _syncWeight(msg.sender, a);
    }

    /// @notice Starts unbonding `amount`; the whole unbonding amount matures unbondingPeriod from
    ///         now (a new request restarts the clock). Unbonding stake no longer counts as active
    ///         (from the end of this block for committee draws: draws read the weights of the
    ///         challenge's open block, so this never moves a committee of an open challenge).
    /// @param amount Wei to unbond.
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

    /// @notice Pays out matured unbonding stake not held by the liabilities of live disputes.
    /// @return amount Wei sent to the caller.
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

    /// @notice Records a dispute's liability of `amount` on `account`, in full, whatever other
    ///         disputes hold: opening a dispute never fails for lack of free stake and never
    ///         reduces what another dispute can take.
    function lock(address account, uint256 amount) external onlyChallengeManager {
        if (amount == 0) return;
        Account storage a = _accounts[account];
        a.locked += amount.toUint128();
        emit Locked(account, amount, a.locked);
    }

    /// @notice Releases a liability recorded by `lock`.
    function unlock(address account, uint256 amount) external onlyChallengeManager {
        if (amount == 0) return;
        Account storage a = _accounts[account];
        if (amount > a.locked) revert ExceedsLocked(account, amount, a.locked);
        a.locked -= amount.toUint128();
        emit Unlocked(account, amount, a.locked);
    }

    /// @notice Settles a liability of `amount` as a slash: takes min(amount, stake) and sends it
    ///         to the ChallengeManager. Less than `amount` is taken only when the account's whole
    ///         stake is gone (earlier slashes); answered, dismissed or inconclusive disputes never
    ///         take anything.
    /// @return taken Wei actually taken.
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

    /// @notice Draws up to `size` distinct verifiers by their draw weights as of the end of block
    ///         `snapshotBlock` (which must be final), without replacement, skipping `exclude`.
    ///         Seat j uses keccak256(seed, j') for successive j'; x = that % remaining weight picks
    ///         the slot whose weight range (slots in order) holds x. Independent of anything that
    ///         happened after `snapshotBlock`. Cost O(size * TREE_DEPTH) storage reads.
    /// @return members Chosen verifiers (fewer than `size` if fewer had weight).
    /// @return weights Their draw weights at the snapshot.
    /// @return total Sum of `weights`.
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

    /// @notice The full account record.
    function accountOf(address who) external view returns (Account memory) {
        return _accounts[who];
    }

    /// @notice Stake that counts for serving and voting: stake - unbonding.
    function activeStake(address who) public view returns (uint256) {
        Account storage a = _accounts[who];
        return a.stake - a.unbonding;
    }

    /// @notice Stake not held by live liabilities: max(stake - locked, 0).
    function freeStake(address who) public view returns (uint256) {
        Account storage a = _accounts[who];
        return a.stake > a.locked ? a.stake - a.locked : 0;
    }

    /// @notice `who`'s draw weight now (0 if not a verifier or below the minimum).
    function weightOf(address who) external view returns (uint256) {
        uint256 slot = _accounts[who].slot;
        return slot == 0 ? 0 : _latest(_leaf[slot]);
    }

    /// @notice Sum of all draw weights as of the end of block `blk` (the current state if
    ///         `blk` >= block.number).
    function totalWeightAt(uint256 blk) external view returns (uint256) {
        return _at(_tree[MAX_VERIFIERS], blk);
    }

    /// @notice Holder and weight of draw-tree `slot` as of the end of block `blk`.
    function slotAt(uint256 slot, uint256 blk) external view returns (address owner, uint256 weight) {
        return (_ownerAt(slot, blk), _at(_leaf[slot], blk));
    }

    /// @notice True iff `who` is an operator with at least the minimum active stake.
    function isActiveOperator(address who) external view returns (bool) {
        Account storage a = _accounts[who];
        return a.role == Role.Operator && a.stake - a.unbonding >= minOperatorStake;
    }

    /// @notice True iff `who` is registered as an operator (whatever its stake).
    function isOperator(address who) external view returns (bool) {
        return _accounts[who].role == Role.Operator;
    }

    /// @notice True iff `who` is registered as a verifier.
    function isVerifier(address who) external view returns (bool) {
        return _accounts[who].role == Role.Verifier;
    }

    /// @notice Every verifier holding a draw slot now, with its active and free stake (off-chain
    ///         tooling; walks all slots ever used).
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
