// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {IProtocolConfig} from "./interfaces/IProtocolConfig.sol";
import {IStakeRegistry} from "./interfaces/IStakeRegistry.sol";
import {IProtocolConfigTypes} from "./types/ProtocolConfigTypes.sol";
import {PoolKey} from "./lib/PoolKey.sol";

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
///
///         There is one such tree ("pool") for all verifiers (key ALL_VERIFIERS, the views
///         `totalWeightAt`, `slotAt`, `verifierCount`, `verifierStakes`) and one per engine
///         fingerprint hash holding the verifiers declared for it: a challenge's committee is
///         drawn from the pool of its receipt's fingerprint. A stake change writes the path of the
///         account in every pool it is in (at most 1 + MAX_DECLARATIONS pools).
///
///         Coverage is kept by timestamp (receipts carry an issuedAt, not a block): per
///         fingerprint the count and summed weight of its counting declarations, and the sum of
///         all verifier weights. A fingerprint is covered at t iff its declared weight is > 0 and
///         at least minCoverageBps of the total at t (`isCoveredAt`).
contract StakeRegistry is Ownable, IStakeRegistry {
    using SafeCast for uint256;

    /// @notice A value as of the end of block `blockNumber` (until the next checkpoint).
    struct Checkpoint {
        uint48 blockNumber;
        uint208 value;
    }

    /// @notice A fingerprint's coverage from time `time` on (until the next checkpoint): how many
    ///         declarations count (declared, weight > 0, not leaving) and the sum of their weights.
    struct CoverageCheckpoint {
        uint48 time;
        uint32 count;
        uint176 weight;
    }

    /// @dev A fingerprint's coverage by time. The newest checkpoint has a slot of its own, so the
    ///      read of every challenge open (nothing changed since issuedAt - coverageNotice) is one
    ///      storage read; `older` holds the ones it replaced, oldest first.
    struct CoverageHistory {
        CoverageCheckpoint latest;
        CoverageCheckpoint[] older;
    }

    /// @dev A value by time, laid out like CoverageHistory (`Checkpoint.blockNumber` holds a
    ///      timestamp here).
    struct TimeHistory {
        Checkpoint latest;
        Checkpoint[] older;
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
    bytes32 public constant ALL_VERIFIERS = bytes32(0);
    /// @inheritdoc IStakeRegistry
    uint256 public constant MAX_DECLARATIONS = 4;
    /// @inheritdoc IStakeRegistry
    uint256 public constant BPS = 10_000;
    /// @inheritdoc IStakeRegistry
    uint64 public immutable coverageNotice;
    /// @inheritdoc IStakeRegistry
    /// @dev INVARIANT: immutable. Validity of a receipt is decided from checkpointed weights at
    ///      issuedAt - coverageNotice and this fraction; a fraction governance could raise later
    ///      would turn a receipt that was covered when an honest operator signed it into an
    ///      "uncovered" one and slash that operator retroactively. A new fraction needs a new
    ///      deployment.
    uint256 public immutable minCoverageBps;

    /// @dev One checkpointed Fenwick tree of draw weights (see the contract notes).
    struct Pool {
        uint256 slotsUsed; // highest slot ever assigned
        uint256 count; // slots held now (weight > 0)
        uint256[] freeSlots; // released slots, reused last in, first out
        mapping(uint256 => Checkpoint[]) tree; // node i = sum of leaf weights in (i - lowbit(i), i]
        mapping(uint256 => Checkpoint[]) leaf; // weight history of each slot
        mapping(uint256 => OwnerCheckpoint[]) owners; // holder history of each slot
    }

    /// @dev A verifier's declaration of one fingerprint: its slot in that pool (0 = none, weight
    ///      0) and when its undeclaration takes effect (0 = not leaving).
    struct Declaration {
        bytes32 fingerprint;
        uint24 slot;
        uint64 leaveAt;
    }

    /// @inheritdoc IStakeRegistry
    IProtocolConfig public immutable config;
    /// @inheritdoc IStakeRegistry
    address public challengeManager;
    /// @inheritdoc IStakeRegistry
    uint96 public minOperatorStake;
    /// @inheritdoc IStakeRegistry
    uint96 public pendingMinOperatorStake;
    /// @inheritdoc IStakeRegistry
    uint64 public pendingMinOperatorStakeAt;
    /// @inheritdoc IStakeRegistry
    uint256 public totalStake;
    /// @inheritdoc IStakeRegistry
    uint128 public minVerifierStake;
    /// @notice A raised verifier minimum waiting for its notice (0 = none), and when it applies.
    uint128 public pendingMinVerifierStake;
    uint64 public pendingMinVerifierStakeAt;

    mapping(address => Account) internal _accounts;
    /// @dev Draw pools: ALL_VERIFIERS (slot kept in Account.slot) and one per fingerprint hash.
    mapping(bytes32 => Pool) internal _pools;
    /// @dev Each verifier's declared fingerprints (at most MAX_DECLARATIONS).
    mapping(address => Declaration[]) internal _declarations;
    /// @dev Per fingerprint, by timestamp: the declarations that count (declared, weight > 0,
    ///      not leaving), how many and their summed weight.
    mapping(bytes32 => CoverageHistory) internal _coverage;
    /// @dev Sum of all verifiers' draw weights by timestamp (the ALL_VERIFIERS pool's root, which
    ///      is checkpointed by block, kept again by time for `isCoveredAt`).
    TimeHistory internal _verifierWeightByTime;

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
    /// @param coverageNotice_ Seconds between the coverage a receipt relies on and its issuedAt
    ///        (10 minutes in production; a devnet whose operator signs right after its
    ///        verifiers declared may use 0, accepting the race described in docs/contracts.md).
    /// @param minCoverageBps_ Share of all verifier weight (basis points, at most BPS) that a
    ///        fingerprint's declared weight must reach for its receipts to be valid (1000 = 10%
    ///        in production: an attacker needs 5% of all verifier stake to hold a majority of
    ///        any pool a valid receipt relies on; docs/contracts.md "Coverage in stake").
    constructor(address governance, IProtocolConfig config_, uint64 coverageNotice_, uint256 minCoverageBps_)
        Ownable(governance)
    {
        if (minCoverageBps_ > BPS) revert MinCoverageBpsTooLarge(minCoverageBps_, BPS);
        config = config_;
        coverageNotice = coverageNotice_;
        minCoverageBps = minCoverageBps_;
        _syncParams();
    }

    /// @inheritdoc IStakeRegistry
    function syncParams() external {
        _syncParams();
    }

    function _syncParams() internal {
        IProtocolConfigTypes.Params memory p = config.params();
        (uint256 op, uint256 opPending, uint64 opAt) =
            _nextMinimum(Role.Operator, minOperatorStake, pendingMinOperatorStake, pendingMinOperatorStakeAt, p);
        minOperatorStake = op.toUint96();
        pendingMinOperatorStake = opPending.toUint96();
        pendingMinOperatorStakeAt = opAt;
        (uint256 v, uint256 vPending, uint64 vAt) =
            _nextMinimum(Role.Verifier, minVerifierStake, pendingMinVerifierStake, pendingMinVerifierStakeAt, p);
        minVerifierStake = v.toUint128();
        pendingMinVerifierStake = vPending.toUint128();
        pendingMinVerifierStakeAt = vAt;
        emit ParamsSynced(op);
    }

    /// @dev The one home of the minimum-raise rule, for both roles: `current` is the minimum in
    ///      force, `pending`/`pendingAt` a raise waiting for its notice (0 = none). A lower (or
    ///      the first) minimum applies at once: it only lets more accounts in. A higher one is
    ///      recorded with effectiveAt = now + maxDisputeSpan + coverageNotice (as an
    ///      undeclaration; a different raise restarts the notice) and a sync from then on
    ///      applies it.
    ///      Verifiers: applied at once, anyone could `syncWeight` every honest verifier under
    ///      the new minimum to weight 0, so a receipt covered by their stake when it was signed
    ///      was judged by whoever stayed in its pool (a partner sybil above the new minimum
    ///      dismissed the fraud; AttackMinimumRaise.t.sol).
    ///      Operators: applied at once, an honest operator whose stake met the minimum a block
    ///      earlier was no longer an active operator: `commitBatch` reverted, the receipts it had
    ///      signed (under the old minimum) missed their publication deadline and every one was
    ///      slashed by `claimUnpublished` (AttackOperatorMinimumRaise.t.sol).
    ///      INVARIANT: an account that meets its role's minimum at time t keeps meeting it (its
    ///      draw weight, its `isActiveOperator`) until at least t + coverageNotice +
    ///      maxDisputeSpan unless its own stake moves (unbond, slash), whatever governance
    ///      sets: a verifier counted in coverage at t stays drawable through every dispute of
    ///      the receipts relying on it, and every receipt an operator signed by t can be
    ///      committed inside its publication deadline; MinimumRaisePending tells it when to
    ///      have bonded more (or left).
    function _nextMinimum(
        Role role,
        uint256 current,
        uint256 pending,
        uint64 pendingAt,
        IProtocolConfigTypes.Params memory p
    ) internal returns (uint256, uint256, uint64) {
        uint256 want = role == Role.Operator ? p.minOperatorStake : p.minVerifierStake;
        if (want <= current || current == 0) return (want, 0, 0);
        if (pending != want) {
            uint64 due = uint64(block.timestamp + config.maxDisputeSpan(p) + coverageNotice);
            emit MinimumRaisePending(role, current, want, due);
            return (current, want, due);
        }
        if (block.timestamp >= pendingAt) return (want, 0, 0);
        return (current, pending, pendingAt);
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
        // INVARIANT: a verifier counted in a fingerprint's coverage keeps a draw weight until its
        // undeclarations take effect (so the coverage an operator relied on at issuedAt holds
        // through the receipt's disputes): it cannot unbond below the minimum while declared.
        uint256 declared = _declarations[msg.sender].length;
        if (declared != 0 && a.stake - a.unbonding < minVerifierStake) {
            revert DeclaredVerifierBelowMinimum(msg.sender, declared, a.stake - a.unbonding, minVerifierStake);
        }
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

    /// @dev Brings `who`'s draw weight (active stake if >= the verifier minimum, else 0) into
    ///      every pool it belongs to (ALL_VERIFIERS and each declared fingerprint's pool), into
    ///      the total by time and into the coverage of each declaration that counts.
    function _syncWeight(address who, Account storage a) internal {
        if (a.role != Role.Verifier) return;
        uint256 active = uint256(a.stake) - a.unbonding;
        uint256 w = active >= minVerifierStake ? active : 0;
        (uint256 slot, uint256 old) = _setPoolWeight(ALL_VERIFIERS, who, a.slot, w);
        // casting to 'uint24' is safe because a slot is at most MAX_VERIFIERS = 2^14
        // forge-lint: disable-next-line(unsafe-typecast)
        a.slot = uint24(slot);
        if (w != old) {
            TimeHistory storage h = _verifierWeightByTime;
            Checkpoint memory last = h.latest;
            if (last.blockNumber != 0) h.older.push(last);
            uint256 total = last.value;
            // casting to 'uint208' is safe because the total is at most totalStake, a sum of
            // uint112 stakes held in this contract's balance
            // forge-lint: disable-next-line(unsafe-typecast)
            h.latest = Checkpoint(uint48(block.timestamp), uint208(w > old ? total + (w - old) : total - (old - w)));
        }
        Declaration[] storage ds = _declarations[who];
        for (uint256 i = 0; i < ds.length; i++) {
            Declaration storage d = ds[i];
            (slot, old) = _setPoolWeight(d.fingerprint, who, d.slot, w);
            // casting to 'uint24' is safe because a slot is at most MAX_VERIFIERS = 2^14
            // forge-lint: disable-next-line(unsafe-typecast)
            d.slot = uint24(slot);
            // A leaving declaration no longer counts for coverage (it was removed at the request).
            if (d.leaveAt == 0) _moveCoverage(d.fingerprint, old, w);
        }
    }

    /// @dev Sets `who`'s weight in pool `key` (current slot `slot`, 0 = none), taking a slot when
    ///      it becomes > 0 and releasing it when it becomes 0; returns the slot now held (0 = none)
    ///      and the weight it had before.
    function _setPoolWeight(bytes32 key, address who, uint256 slot, uint256 w)
        internal
        returns (uint256, uint256 old)
    {
        Pool storage p = _pools[key];
        if (slot == 0) {
            if (w == 0) return (0, 0);
            slot = _takeSlot(p, who);
        }
        old = _latest(p.leaf[slot]);
        if (w != old) {
            _write(p.leaf[slot], w);
            for (uint256 i = slot; i <= MAX_VERIFIERS; i += i & (~i + 1)) {
                Checkpoint[] storage node = p.tree[i];
                _write(node, w > old ? _latest(node) + (w - old) : _latest(node) - (old - w));
            }
            if (key == ALL_VERIFIERS) emit WeightChanged(who, slot, w);
            else emit DeclaredWeightChanged(key, who, slot, w);
        }
        if (w != 0) return (slot, old);
        p.freeSlots.push(slot);
        p.count -= 1;
        return (0, old);
    }

    function _takeSlot(Pool storage p, address who) internal returns (uint256 slot) {
        uint256 n = p.freeSlots.length;
        if (n != 0) {
            slot = p.freeSlots[n - 1];
            p.freeSlots.pop();
        } else {
            slot = p.slotsUsed + 1;
            if (slot > MAX_VERIFIERS) revert TooManyVerifiers(MAX_VERIFIERS);
            p.slotsUsed = slot;
        }
        p.count += 1;
        p.owners[slot].push(OwnerCheckpoint(uint48(block.number), who));
    }

    /// @dev The one home of coverage bookkeeping: a declaration of `fp` that counted with weight
    ///      `oldW` (0 = did not count) counts with `newW` (0 = no longer counts) from now on (a
    ///      timestamp checkpoint, compared with issuedAt - coverageNotice). A counting declaration
    ///      always has weight > 0, so the count moves exactly when a weight crosses 0.
    function _moveCoverage(bytes32 fp, uint256 oldW, uint256 newW) internal {
        if (oldW == newW) return;
        CoverageHistory storage h = _coverage[fp];
        CoverageCheckpoint memory last = h.latest;
        if (last.time != 0) h.older.push(last); // always, even within one block (see _write)
        uint256 count = last.count;
        uint256 weight = last.weight;
        if (oldW == 0) count += 1;
        else if (newW == 0) count -= 1;
        weight = weight + newW - oldW;
        // casting is safe because count <= MAX_VERIFIERS and weight <= totalStake, a sum of
        // uint112 stakes held in this contract's balance
        // forge-lint: disable-next-line(unsafe-typecast)
        h.latest = CoverageCheckpoint(uint48(block.timestamp), uint32(count), uint176(weight));
        emit CoverageChanged(fp, count, weight);
    }

    // ---- fingerprint declarations ---------------------------------------------------------

    /// @inheritdoc IStakeRegistry
    function declareFingerprint(bytes32 fingerprint, bytes32 modelId) external {
        Account storage a = _accounts[msg.sender];
        if (a.role != Role.Verifier) revert NotVerifier(msg.sender);
        if (fingerprint == ALL_VERIFIERS) revert FingerprintNotApproved(fingerprint);
        bytes32 pool = PoolKey.key(fingerprint, modelId);
        Declaration[] storage ds = _declarations[msg.sender];
        (bool found, uint256 i) = _findDeclaration(ds, pool);
        if (found) {
            Declaration storage d = ds[i];
            if (d.leaveAt == 0) revert AlreadyDeclared(msg.sender, pool);
            // Cancels a pending undeclaration: the verifier never left the pool, it counts again.
            d.leaveAt = 0;
            if (d.slot != 0) _moveCoverage(pool, 0, _latest(_pools[pool].leaf[d.slot]));
            emit FingerprintDeclared(msg.sender, pool, fingerprint, modelId);
            return;
        }
        if (!config.isApproved(IProtocolConfigTypes.Kind.EngineFingerprint, fingerprint)) {
            revert FingerprintNotApproved(fingerprint);
        }
        if (!config.isApproved(IProtocolConfigTypes.Kind.Model, modelId)) revert ModelNotApproved(modelId);
        // INVARIANT: at most MAX_DECLARATIONS pool keys ((fingerprint, model) pairs) per verifier.
        if (ds.length >= MAX_DECLARATIONS) revert TooManyDeclarations(msg.sender, MAX_DECLARATIONS);
        uint256 active = uint256(a.stake) - a.unbonding;
        uint256 w = active >= minVerifierStake ? active : 0;
        (uint256 slot,) = _setPoolWeight(pool, msg.sender, 0, w);
        ds.push(Declaration(pool, uint24(slot), 0));
        _moveCoverage(pool, 0, w);
        emit FingerprintDeclared(msg.sender, pool, fingerprint, modelId);
    }

    /// @inheritdoc IStakeRegistry
    function undeclareFingerprint(bytes32 fingerprint, bytes32 modelId) external returns (uint64 leaveAt) {
        bytes32 pool = PoolKey.key(fingerprint, modelId);
        Declaration[] storage ds = _declarations[msg.sender];
        (bool found, uint256 i) = _findDeclaration(ds, pool);
        if (!found) revert NotDeclared(msg.sender, pool);
        Declaration storage d = ds[i];
        if (d.leaveAt != 0) revert AlreadyLeaving(msg.sender, pool, d.leaveAt);
        // INVARIANT: a verifier counted in a pool's coverage at time t stays drawable for
        // it until after t + coverageNotice + maxDisputeSpan: every challenge of a receipt
        // relying on that coverage (issued at t + coverageNotice, published in time) opens
        // before then. It stops counting now: receipts issued from now + coverageNotice on do
        // not rely on it, and an operator sees that coverageNotice ahead.
        leaveAt = uint64(block.timestamp + config.maxDisputeSpan(config.params()) + coverageNotice);
        d.leaveAt = leaveAt;
        if (d.slot != 0) _moveCoverage(pool, _latest(_pools[pool].leaf[d.slot]), 0);
        emit FingerprintUndeclareRequested(msg.sender, pool, leaveAt);
    }

    /// @inheritdoc IStakeRegistry
    function completeUndeclare(address account, bytes32 fingerprint, bytes32 modelId) external {
        bytes32 pool = PoolKey.key(fingerprint, modelId);
        Declaration[] storage ds = _declarations[account];
        (bool found, uint256 i) = _findDeclaration(ds, pool);
        if (!found) revert NotDeclared(account, pool);
        uint64 leaveAt = ds[i].leaveAt;
        if (leaveAt == 0 || block.timestamp < leaveAt) {
            revert UndeclareNotReady(account, pool, leaveAt, block.timestamp);
        }
        _setPoolWeight(pool, account, ds[i].slot, 0);
        ds[i] = ds[ds.length - 1];
        ds.pop();
        emit FingerprintUndeclared(account, pool);
    }

    function _findDeclaration(Declaration[] storage ds, bytes32 fp) internal view returns (bool, uint256) {
        for (uint256 i = 0; i < ds.length; i++) {
            if (ds[i].fingerprint == fp) return (true, i);
        }
        return (false, 0);
    }

    /// @dev Always appends, even within one block (lookups take the last checkpoint at or
    ///      before a block): a transaction's gas then does not depend on whether an earlier
    ///      transaction of the same block touched the node, so eth_estimateGas, run against
    ///      another block number, stays exact. (The timestamp-keyed histories, coverage and
    ///      total weight by time, append for the same reason.)
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

    function _ownerAt(Pool storage p, uint256 slot, uint256 blk) internal view returns (address) {
        OwnerCheckpoint[] storage h = p.owners[slot];
        uint256 n = h.length;
        while (n != 0 && h[n - 1].blockNumber > blk) n--;
        return n == 0 ? address(0) : h[n - 1].owner;
    }

    /// @inheritdoc IStakeRegistry
    function drawCommittee(bytes32 pool, bytes32 seed, uint256 snapshotBlock, uint256 size, address exclude)
        external
        view
        returns (address[] memory members, uint256[] memory weights, uint256 total)
    {
        if (snapshotBlock >= block.number) revert SnapshotNotFinal(snapshotBlock, block.number);
        // INVARIANT: every member held a slot in `pool` at the end of snapshotBlock (for a
        // fingerprint pool: was declared for it then), whatever happened since.
        members = new address[](size);
        weights = new uint256[](size);
        uint256 filled;
        (filled, total) = _drawInto(_pools[pool], seed, snapshotBlock, exclude, members, weights);
        assembly ("memory-safe") {
            mstore(members, filled)
            mstore(weights, filled)
        }
    }

    /// @dev Fills `members`/`weights` (their length = seats) from pool `p` at block `blk`.
    function _drawInto(
        Pool storage p,
        bytes32 seed,
        uint256 blk,
        address exclude,
        address[] memory members,
        uint256[] memory weights
    ) internal view returns (uint256 filled, uint256 total) {
        // Slots already taken out of the pool (chosen members and the excluded account).
        Removed memory out = Removed(new uint256[](members.length + 1), new uint256[](members.length + 1), 0);
        uint256 remaining = _at(p.tree[MAX_VERIFIERS], blk);
        for (uint256 nonce = 0; filled < members.length && remaining != 0; nonce++) {
            (address who, uint256 w) = _pick(p, uint256(keccak256(abi.encode(seed, nonce))) % remaining, blk, out);
            remaining -= w;
            if (who == exclude) continue;
            members[filled] = who;
            weights[filled] = w;
            total += w;
            filled++;
        }
    }

    /// @dev The holder and weight of the slot whose range holds `x`; takes it out of the pool.
    function _pick(Pool storage p, uint256 x, uint256 blk, Removed memory out)
        internal
        view
        returns (address who, uint256 w)
    {
        uint256 slot = _find(p, x, blk, out);
        w = _at(p.leaf[slot], blk);
        out.slots[out.n] = slot;
        out.weights[out.n] = w;
        out.n++;
        who = _ownerAt(p, slot, blk);
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
    function _find(Pool storage p, uint256 x, uint256 blk, Removed memory out) internal view returns (uint256) {
        uint256 used = p.slotsUsed;
        uint256 pos = 0;
        for (uint256 step = MAX_VERIFIERS >> 1; step != 0; step >>= 1) {
            uint256 next = pos + step;
            if (next > used) continue;
            uint256 v = _at(p.tree[next], blk);
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
        return slot == 0 ? 0 : _latest(_pools[ALL_VERIFIERS].leaf[slot]);
    }

    /// @inheritdoc IStakeRegistry
    function totalWeightAt(uint256 blk) external view returns (uint256) {
        return _at(_pools[ALL_VERIFIERS].tree[MAX_VERIFIERS], blk);
    }

    /// @inheritdoc IStakeRegistry
    function slotAt(uint256 slot, uint256 blk) external view returns (address owner, uint256 weight) {
        Pool storage p = _pools[ALL_VERIFIERS];
        return (_ownerAt(p, slot, blk), _at(p.leaf[slot], blk));
    }

    /// @inheritdoc IStakeRegistry
    function slotsUsed() external view returns (uint256) {
        return _pools[ALL_VERIFIERS].slotsUsed;
    }

    /// @inheritdoc IStakeRegistry
    function verifierCount() external view returns (uint256) {
        return _pools[ALL_VERIFIERS].count;
    }

    /// @inheritdoc IStakeRegistry
    function poolWeightAt(bytes32 pool, uint256 blk) external view returns (uint256) {
        return _at(_pools[pool].tree[MAX_VERIFIERS], blk);
    }

    /// @inheritdoc IStakeRegistry
    function poolSlotAt(bytes32 pool, uint256 slot, uint256 blk) external view returns (address owner, uint256 weight) {
        Pool storage p = _pools[pool];
        return (_ownerAt(p, slot, blk), _at(p.leaf[slot], blk));
    }

    /// @inheritdoc IStakeRegistry
    function poolSlotsUsed(bytes32 pool) external view returns (uint256) {
        return _pools[pool].slotsUsed;
    }

    /// @dev The coverage checkpoint in force at `time` (zeros before the first).
    function _coverageAt(bytes32 fp, uint256 time) internal view returns (uint256 count, uint256 weight) {
        CoverageHistory storage h = _coverage[fp];
        CoverageCheckpoint memory c = h.latest;
        if (c.time <= time) return (c.count, c.weight); // the common case (zeros if never written)
        CoverageCheckpoint[] storage older = h.older;
        // The last of `older` at or before `time`: older[lo - 1] after the search, none if lo == 0.
        uint256 lo = 0;
        uint256 hi = older.length;
        while (lo < hi) {
            uint256 mid = (lo + hi) / 2;
            if (older[mid].time <= time) lo = mid + 1;
            else hi = mid;
        }
        if (lo == 0) return (0, 0);
        c = older[lo - 1];
        return (c.count, c.weight);
    }

    /// @inheritdoc IStakeRegistry
    function coverageAt(bytes32 fingerprint, uint64 time) external view returns (uint256 count) {
        (count,) = _coverageAt(fingerprint, time);
    }

    /// @inheritdoc IStakeRegistry
    function coverageWeightAt(bytes32 fingerprint, uint64 time) public view returns (uint256 weight) {
        (, weight) = _coverageAt(fingerprint, time);
    }

    /// @inheritdoc IStakeRegistry
    function verifierWeightAtTime(uint64 time) public view returns (uint256) {
        TimeHistory storage h = _verifierWeightByTime;
        Checkpoint memory c = h.latest;
        if (c.blockNumber <= time) return c.value; // the common case (0 if never written)
        return _at(h.older, time);
    }

    /// @inheritdoc IStakeRegistry
    function isCoveredAt(bytes32 fingerprint, uint64 issuedAt) external view returns (bool) {
        // INVARIANT: validity reads coverage coverageNotice before issuedAt, a past and final
        // value when the operator signs: a verifier leaving (or a large bond raising the total)
        // cannot race the operator's check, and nothing later changes the answer.
        if (issuedAt < coverageNotice) return false;
        uint64 t = issuedAt - coverageNotice;
        uint256 covered = coverageWeightAt(fingerprint, t);
        // INVARIANT: covered * BPS >= minCoverageBps * total, where the total includes any
        // attacker's own stake: an attacker with less than minCoverageBps / 2 of all verifier
        // weight at t holds less than half of the declared weight this receipt relies on.
        return covered != 0 && covered * BPS >= minCoverageBps * verifierWeightAtTime(t);
    }

    /// @inheritdoc IStakeRegistry
    function declarationsOf(address who)
        external
        view
        returns (bytes32[] memory fingerprints, uint64[] memory leaveAt)
    {
        Declaration[] storage ds = _declarations[who];
        fingerprints = new bytes32[](ds.length);
        leaveAt = new uint64[](ds.length);
        for (uint256 i = 0; i < ds.length; i++) {
            fingerprints[i] = ds[i].fingerprint;
            leaveAt[i] = ds[i].leaveAt;
        }
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
        Account storage a = _accounts[who];
        // INVARIANT: only active bonded weight counts (the draw weight rule): a verifier that
        // unbonded below the minimum (or withdrew everything) keeps its role but no voice.
        return a.role == Role.Verifier && uint256(a.stake) - a.unbonding >= minVerifierStake;
    }

    /// @inheritdoc IStakeRegistry
    function verifierStakes()
        external
        view
        returns (address[] memory accounts, uint256[] memory active, uint256[] memory free)
    {
        Pool storage p = _pools[ALL_VERIFIERS];
        uint256 used = p.slotsUsed;
        accounts = new address[](p.count);
        active = new uint256[](accounts.length);
        free = new uint256[](accounts.length);
        uint256 n = 0;
        for (uint256 slot = 1; slot <= used; slot++) {
            if (_latest(p.leaf[slot]) == 0) continue;
            address who = p.owners[slot][p.owners[slot].length - 1].owner;
            Account storage a = _accounts[who];
            accounts[n] = who;
            active[n] = a.stake - a.unbonding;
            free[n] = a.stake > a.locked ? a.stake - a.locked : 0;
            n++;
        }
    }
}
