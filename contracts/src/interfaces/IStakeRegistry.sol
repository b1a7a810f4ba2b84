// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IStakeRegistryTypes} from "../types/StakeRegistryTypes.sol";
import {IStakeRegistryErrors} from "../errors/StakeRegistryErrors.sol";
import {IProtocolConfig} from "./IProtocolConfig.sol";

/// @title IStakeRegistry
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
///         Verifiers are drawn into committees by their draw weight (active stake, or 0 below
///         the minimum) as it was at the end of a past block, from the pool of verifiers declared
///         for the receipt's (engine fingerprint, model) pair, keyed PoolKey.key(fingerprint,
///         modelId) (a verifier re-executes only under its own fingerprint and with a model it
///         holds, and abstains otherwise; an abstention is a non-reveal, penalised). The
///         own-engine fingerprint is the same for every model, so pools and coverage are per pair:
///         below, "fingerprint" in coverage and pool arguments means that pool key.
///
///         Fingerprint declarations: `declareFingerprint` adds the caller to the fingerprint's pool
///         from the end of this block and to its coverage from now. `undeclareFingerprint` takes
///         it out of the coverage at once but keeps it drawable (and liable) until
///         now + maxDisputeSpan, when `completeUndeclare` (anyone) removes it. While declared a
///         verifier cannot unbond below the minimum. A fingerprint is covered at a time when the
///         weight of its counting declarations (declared, weight > 0, not leaving) is > 0 and
///         at least `minCoverageBps` of all verifier weight then; a receipt whose fingerprint was
///         not covered at issuedAt - coverageNotice is invalid on its face (ChallengeManager).
interface IStakeRegistry is IStakeRegistryTypes, IStakeRegistryErrors {
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
    /// @notice The cached minimum stakes were refreshed; `minOperatorStake` is the one in force.
    event ParamsSynced(uint256 minOperatorStake);
    /// @notice A raised minimum stake of `role` was seen by `syncParams`: `current` stays in force
    ///         until `effectiveAt` (chain time), then the next `syncParams` applies `pending`. An
    ///         account of that role below `pending` has until then to bond more or to leave.
    event MinimumRaisePending(Role indexed role, uint256 current, uint256 pending, uint64 effectiveAt);
    /// @notice The ChallengeManager address was fixed.
    event ChallengeManagerSet(address challengeManager);
    /// @notice A verifier's draw weight changed (from the end of this block).
    event WeightChanged(address indexed account, uint256 slot, uint256 weight);
    /// @notice A verifier's draw weight in a fingerprint's pool changed (from the end of this block).
    event DeclaredWeightChanged(bytes32 indexed fingerprint, address indexed account, uint256 slot, uint256 weight);
    /// @notice `account` declared that it re-executes receipts of `modelId` under `fingerprint`
    ///         (pool key `pool` = PoolKey.key(fingerprint, modelId)), or cancelled its pending
    ///         undeclaration.
    event FingerprintDeclared(
        address indexed account, bytes32 indexed pool, bytes32 indexed fingerprint, bytes32 modelId
    );
    /// @notice `account` stops counting for `fingerprint`'s coverage now and leaves its pool at
    ///         `leaveAt` (by `completeUndeclare`).
    event FingerprintUndeclareRequested(address indexed account, bytes32 indexed fingerprint, uint64 leaveAt);
    /// @notice `account` left `fingerprint`'s pool.
    event FingerprintUndeclared(address indexed account, bytes32 indexed fingerprint);
    /// @notice `fingerprint`'s coverage from now on: `count` counting declarations (declared,
    ///         weight > 0, not leaving) with summed weight `weight`.
    event CoverageChanged(bytes32 indexed fingerprint, uint256 count, uint256 weight);

    /// @notice Source of the minimum stakes and the unbonding period.
    function config() external view returns (IProtocolConfig);

    /// @notice The only address allowed to lock, unlock and slash (set once by governance).
    function challengeManager() external view returns (address);

    /// @notice ProtocolConfig.minOperatorStake, cached next to `challengeManager` so that a batch
    ///         commit does not call the config. Refreshed by `syncParams` (anyone may call it).
    function minOperatorStake() external view returns (uint96);

    /// @notice A raised operator minimum waiting for its notice (0 = none): `syncParams` applies
    ///         it from `pendingMinOperatorStakeAt` on.
    function pendingMinOperatorStake() external view returns (uint96);

    /// @notice When `pendingMinOperatorStake` may be applied (chain time; 0 = nothing pending).
    function pendingMinOperatorStakeAt() external view returns (uint64);

    /// @notice ProtocolConfig.minVerifierStake as cached by `syncParams`: a verifier's draw
    ///         weight is its active stake if at least this, else 0. After changing the minimum,
    ///         call `syncParams` and `syncWeight(account)` for the accounts it affects.
    function minVerifierStake() external view returns (uint128);

    /// @notice Sum of all accounts' stake; equals this contract's balance.
    function totalStake() external view returns (uint256);

    /// @notice Copies the minimum stakes from the ProtocolConfig (call after setParams). A
    ///         raised minVerifierStake or minOperatorStake applies only maxDisputeSpan +
    ///         coverageNotice after the first sync that sees it (MinimumRaisePending; call again
    ///         then): draw weights relied on by receipts already covered stay until their
    ///         disputes are over, and an operator can commit every receipt it signed under the
    ///         old minimum, then bond more or leave. A lower minimum applies at once.
    function syncParams() external;

    /// @notice Re-evaluates `account`'s draw weight against the cached minimum (anyone may call;
    ///         needed only after governance changed minVerifierStake).
    function syncWeight(address account) external;

    /// @notice Fixes the ChallengeManager (once).
    /// @param cm The ChallengeManager contract.
    function setChallengeManager(address cm) external;

    // ---- stakers ------------------------------------------------------------------------

    /// @notice Registers the caller as operator or verifier, bonding msg.value.
    /// @param role Operator or Verifier.
    function register(Role role) external payable;

    /// @notice Adds msg.value to the caller's stake.
    function bond() external payable;

    /// @notice Starts unbonding `amount` (a verifier with declarations, even leaving ones, cannot
    ///         go below the verifier minimum: DeclaredVerifierBelowMinimum); the whole unbonding amount matures unbondingPeriod from
    ///         now (a new request restarts the clock). Unbonding stake no longer counts as active
    ///         (from the end of this block for committee draws: draws read the weights of the
    ///         challenge's open block, so this never moves a committee of an open challenge).
    /// @param amount Wei to unbond.
    function requestUnbond(uint128 amount) external;

    /// @notice Pays out matured unbonding stake not held by the liabilities of live disputes.
    /// @return amount Wei sent to the caller.
    function withdraw() external returns (uint256 amount);

    // ---- fingerprint declarations -------------------------------------------------------

    /// @notice The caller (a verifier) declares that it re-executes receipts of `fingerprint`,
    ///         which must be an approved engine fingerprint now; at most MAX_DECLARATIONS. It
    ///         enters the fingerprint's draw pool from the end of this block and its coverage from
    ///         now. On a declaration with a pending undeclaration it cancels that undeclaration.
    ///         Pools and coverage are per (fingerprint, model): the pool key is
    ///         PoolKey.key(fingerprint, modelId), and `modelId` must be an approved model now. The
    ///         MAX_DECLARATIONS bound counts pool keys.
    function declareFingerprint(bytes32 fingerprint, bytes32 modelId) external;

    /// @notice Starts leaving `fingerprint`: the caller stops counting for its coverage now, and
    ///         stays in its draw pool (drawn, so penalised for not revealing) until `leaveAt` =
    ///         now + ProtocolConfig.maxDisputeSpan + coverageNotice.
    /// @return leaveAt When `completeUndeclare` may remove the caller from the pool.
    function undeclareFingerprint(bytes32 fingerprint, bytes32 modelId) external returns (uint64 leaveAt);

    /// @notice Removes `account` from `fingerprint`'s pool once its undeclaration is due (anyone).
    function completeUndeclare(address account, bytes32 fingerprint, bytes32 modelId) external;

    // ---- ChallengeManager hooks ---------------------------------------------------------

    /// @notice Records a dispute's liability of `amount` on `account`, in full, whatever other
    ///         disputes hold: opening a dispute never fails for lack of free stake and never
    ///         reduces what another dispute can take.
    function lock(address account, uint256 amount) external;

    /// @notice Releases a liability recorded by `lock`.
    function unlock(address account, uint256 amount) external;

    /// @notice Settles a liability of `amount` as a slash: takes min(amount, stake) and sends it
    ///         to the ChallengeManager. Less than `amount` is taken only when the account's whole
    ///         stake is gone (earlier slashes); answered, dismissed or inconclusive disputes never
    ///         take anything.
    /// @return taken Wei actually taken.
    function slashLocked(address account, uint256 amount) external returns (uint256 taken);

    // ---- committee draw -----------------------------------------------------------------

    /// @notice Draws up to `size` distinct verifiers of `pool` (a fingerprint hash: the verifiers
    ///         declared for it; ALL_VERIFIERS: every verifier) by their draw weights as of the end
    ///         of block `snapshotBlock` (which must be final), without replacement, skipping `exclude`.
    ///         Seat j uses keccak256(seed, j') for successive j'; x = that % remaining weight picks
    ///         the slot whose weight range (slots in order) holds x. Independent of anything that
    ///         happened after `snapshotBlock`. Cost O(size * TREE_DEPTH) storage reads.
    /// @return members Chosen verifiers (fewer than `size` if fewer had weight).
    /// @return weights Their draw weights at the snapshot.
    /// @return total Sum of `weights`.
    function drawCommittee(bytes32 pool, bytes32 seed, uint256 snapshotBlock, uint256 size, address exclude)
        external
        view
        returns (address[] memory members, uint256[] memory weights, uint256 total);

    // ---- views --------------------------------------------------------------------------

    /// @notice The pool key of all verifiers (bytes32(0); never an approvable fingerprint).
    function ALL_VERIFIERS() external view returns (bytes32);

    /// @notice Most fingerprints one verifier may declare (bounds the gas of a stake change).
    function MAX_DECLARATIONS() external view returns (uint256);

    /// @notice The basis-point denominator of `minCoverageBps` (10,000).
    function BPS() external view returns (uint256);

    /// @notice Share of all verifier weight, in basis points, that a fingerprint's counting
    ///         declarations must hold (and > 0) at issuedAt - coverageNotice for a receipt to be
    ///         valid. Immutable (a constructor argument): a later change would decide the
    ///         validity of receipts already signed. An attacker with less than half of it (of all
    ///         verifier weight) never holds a majority of the declared weight a valid receipt
    ///         relies on (docs/contracts.md "Coverage in stake").
    function minCoverageBps() external view returns (uint256);

    /// @notice Highest ALL_VERIFIERS slot ever assigned.
    function slotsUsed() external view returns (uint256);

    /// @notice Verifiers with weight > 0 now (ALL_VERIFIERS slots held).
    function verifierCount() external view returns (uint256);

    /// @notice Sum of the draw weights in `pool` as of the end of block `blk`.
    function poolWeightAt(bytes32 pool, uint256 blk) external view returns (uint256);

    /// @notice Holder and weight of `slot` of `pool` as of the end of block `blk`.
    function poolSlotAt(bytes32 pool, uint256 slot, uint256 blk) external view returns (address owner, uint256 weight);

    /// @notice Highest slot of `pool` ever assigned.
    function poolSlotsUsed(bytes32 pool) external view returns (uint256);

    /// @notice How many verifiers are declared for `fingerprint`, with weight > 0 and not
    ///         leaving, at `time` (unix seconds; the latest value for a future time). Informative:
    ///         validity is decided by weight (`isCoveredAt`).
    function coverageAt(bytes32 fingerprint, uint64 time) external view returns (uint256 count);

    /// @notice Sum of the draw weights of the verifiers declared for `fingerprint`, with weight
    ///         > 0 and not leaving, at `time` (unix seconds; the latest value for a future time).
    function coverageWeightAt(bytes32 fingerprint, uint64 time) external view returns (uint256 weight);

    /// @notice Sum of all verifiers' draw weights at `time` (unix seconds; the latest value for
    ///         a future time): the denominator of the coverage rule.
    function verifierWeightAtTime(uint64 time) external view returns (uint256);

    /// @notice With t = issuedAt - coverageNotice: coverageWeightAt(fingerprint, t) > 0 and
    ///         coverageWeightAt(fingerprint, t) * BPS >= minCoverageBps * verifierWeightAtTime(t).
    ///         A receipt of this fingerprint issued at `issuedAt` can be judged by a committee
    ///         no minority of the stake controls (else it is invalid on its face). Reads a time
    ///         coverageNotice in the past, so the operator's check before signing sees a final
    ///         value; false when issuedAt < coverageNotice.
    function isCoveredAt(bytes32 fingerprint, uint64 issuedAt) external view returns (bool);

    /// @notice How long before a receipt's issuedAt its fingerprint's coverage is read (and how
    ///         much notice an operator gets of a verifier leaving or joining).
    function coverageNotice() external view returns (uint64);

    /// @notice `who`'s declared fingerprints and, for each, when it leaves the pool (0 = staying).
    function declarationsOf(address who) external view returns (bytes32[] memory fingerprints, uint64[] memory leaveAt);

    /// @notice The full account record.
    function accountOf(address who) external view returns (Account memory);

    /// @notice Stake that counts for serving and voting: stake - unbonding.
    function activeStake(address who) external view returns (uint256);

    /// @notice Stake not held by live liabilities: max(stake - locked, 0).
    function freeStake(address who) external view returns (uint256);

    /// @notice `who`'s draw weight now (0 if not a verifier or below the minimum).
    function weightOf(address who) external view returns (uint256);

    /// @notice Sum of all draw weights as of the end of block `blk` (the current state if
    ///         `blk` >= block.number).
    function totalWeightAt(uint256 blk) external view returns (uint256);

    /// @notice Holder and weight of draw-tree `slot` as of the end of block `blk`.
    function slotAt(uint256 slot, uint256 blk) external view returns (address owner, uint256 weight);

    /// @notice True iff `who` is an operator with at least the minimum active stake.
    function isActiveOperator(address who) external view returns (bool);

    /// @notice True iff `who` is registered as an operator (whatever its stake).
    function isOperator(address who) external view returns (bool);

    /// @notice True iff `who` is registered as a verifier with active stake (stake - unbonding)
    ///         of at least minVerifierStake: the verifiers whose reports and audits count (a
    ///         verifier that unbonded or withdrew is not one, though its role stays).
    function isVerifier(address who) external view returns (bool);

    /// @notice Every verifier holding a draw slot now, with its active and free stake (off-chain
    ///         tooling; walks all slots ever used).
    function verifierStakes()
        external
        view
        returns (address[] memory accounts, uint256[] memory active, uint256[] memory free);
}
