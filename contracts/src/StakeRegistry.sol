// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ProtocolConfig} from "./ProtocolConfig.sol";

/// @title StakeRegistry
/// @notice Operators and verifiers bond native ETH here. Stake leaves only through
///         requestUnbond -> (unbondingPeriod) -> withdraw, and never the part that live disputes
///         have locked. Only the ChallengeManager locks, unlocks and slashes.
contract StakeRegistry is Ownable {
    using SafeCast for uint256;

    error AmountTooLarge(uint256 amount);

    /// @notice What an address is registered as (one role per address).
    enum Role {
        None,
        Operator,
        Verifier
    }

    /// @notice One staker. `stake` includes `unbonding`; `locked` is reserved by live disputes
    ///         and may be taken by slashing. Active (voting / serving) stake = stake - unbonding.
    struct Account {
        uint112 stake;
        uint112 unbonding;
        Role role; // same slot as stake: one read answers isActiveOperator
        uint128 locked;
        uint64 unbondReadyAt;
    }

    /// @notice Upper bound on registered verifiers: the committee draw walks the whole list.
    uint256 public constant MAX_VERIFIERS = 256;

    ProtocolConfig public immutable config;
    /// @notice The only address allowed to lock, unlock and slash (set once by governance).
    address public challengeManager;
    /// @notice ProtocolConfig.minOperatorStake, cached next to `challengeManager` so that a batch
    ///         commit does not call the config. Refreshed by `syncParams` (anyone may call it).
    uint96 public minOperatorStake;
    /// @notice Sum of all accounts' stake; equals this contract's balance.
    uint256 public totalStake;

    mapping(address => Account) internal _accounts;
    address[] internal _verifiers;

    /// @notice `account` registered as `role` with an initial bond.
    event Registered(address indexed account, Role role, uint256 amount);
    /// @notice Stake added.
    event Bonded(address indexed account, uint256 amount, uint256 newStake);
    /// @notice Unbonding requested; withdrawable from `readyAt`.
    event UnbondRequested(address indexed account, uint256 amount, uint256 totalUnbonding, uint64 readyAt);
    /// @notice Unbonded stake paid out.
    event Withdrawn(address indexed account, uint256 amount);
    /// @notice A dispute reserved stake.
    event Locked(address indexed account, uint256 amount, uint256 totalLocked);
    /// @notice A dispute released its reservation.
    event Unlocked(address indexed account, uint256 amount, uint256 totalLocked);
    /// @notice Locked stake was slashed and sent to the ChallengeManager for distribution.
    event Slashed(address indexed account, uint256 amount, uint256 newStake);
    /// @notice The cached operator minimum stake was refreshed.
    event ParamsSynced(uint256 minOperatorStake);
    /// @notice The ChallengeManager address was fixed.
    event ChallengeManagerSet(address challengeManager);

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
    /// @notice Nothing can be withdrawn (nothing unbonding, or all of it locked).
    error NothingToWithdraw(address account, uint256 unbonding, uint256 locked);
    /// @notice Caller is not the ChallengeManager.
    error NotChallengeManager(address caller);
    /// @notice The ChallengeManager is already set.
    error ChallengeManagerAlreadySet(address current);
    /// @notice Unlock or slash of more than is locked.
    error ExceedsLocked(address account, uint256 amount, uint256 locked);
    /// @notice The verifier list is full.
    error TooManyVerifiers(uint256 max);
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

    /// @notice Copies the operator minimum stake from the ProtocolConfig (call after setParams).
    function syncParams() external {
        _syncParams();
    }

    function _syncParams() internal {
        uint256 m = config.minOperatorStake();
        minOperatorStake = m.toUint96();
        emit ParamsSynced(m);
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
        if (role == Role.Verifier) {
            if (_verifiers.length >= MAX_VERIFIERS) revert TooManyVerifiers(MAX_VERIFIERS);
            _verifiers.push(msg.sender);
        }
        a.role = role;
        a.stake = _u112(msg.value);
        // Pre-warm the second slot (locked, unbondReadyAt): a dispute's first lock then rewrites
        // a live slot (~3k gas) instead of creating one (~20k) inside openChallenge. A ready time
        // of 1 is in the past, so it allows nothing: withdraw still needs unbonding > 0.
        a.unbondReadyAt = 1;
        totalStake += msg.value;
        emit Registered(msg.sender, role, msg.value);
    }

    /// @notice Adds msg.value to the caller's stake.
    function bond() external payable {
        Account storage a = _accounts[msg.sender];
        if (a.role == Role.None) revert NotRegistered(msg.sender);
        if (msg.value == 0) revert ZeroAmount();
        a.stake += _u112(msg.value);
        totalStake += msg.value;
        emit Bonded(msg.sender, msg.value, a.stake);
    }

    /// @notice Starts unbonding `amount`; the whole unbonding amount matures unbondingPeriod from
    ///         now (a new request restarts the clock). Unbonding stake no longer counts as active.
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
    }

    /// @notice Pays out matured unbonding stake that no live dispute has locked.
    /// @return amount Wei sent to the caller.
    function withdraw() external returns (uint256 amount) {
        Account storage a = _accounts[msg.sender];
        if (a.unbonding == 0) revert NothingToWithdraw(msg.sender, 0, a.locked);
        if (block.timestamp < a.unbondReadyAt) {
            revert UnbondingNotReady(msg.sender, a.unbondReadyAt, block.timestamp);
        }
        // INVARIANT: locked stake never leaves: payout <= stake - locked.
        uint256 free = a.stake - a.locked;
        amount = a.unbonding < free ? a.unbonding : free;
        if (amount == 0) revert NothingToWithdraw(msg.sender, a.unbonding, a.locked);
        a.stake -= _u112(amount);
        a.unbonding -= _u112(amount);
        totalStake -= amount;
        emit Withdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    // ---- ChallengeManager hooks ---------------------------------------------------------

    /// @notice Reserves up to `amount` of the account's unlocked stake for a dispute.
    /// @return locked The amount actually reserved (less when less is free).
    function lock(address account, uint256 amount) external onlyChallengeManager returns (uint128 locked) {
        Account storage a = _accounts[account];
        uint256 free = a.stake - a.locked;
        locked = (amount < free ? amount : free).toUint128();
        if (locked != 0) {
            a.locked += locked;
            emit Locked(account, locked, a.locked);
        }
    }

    /// @notice Releases a reservation made by `lock`.
    function unlock(address account, uint256 amount) external onlyChallengeManager {
        if (amount == 0) return;
        Account storage a = _accounts[account];
        if (amount > a.locked) revert ExceedsLocked(account, amount, a.locked);
        a.locked -= amount.toUint128();
        emit Unlocked(account, amount, a.locked);
    }

    /// @notice Takes `amount` of locked stake and sends it to the ChallengeManager.
    function slashLocked(address account, uint256 amount) external onlyChallengeManager {
        if (amount == 0) return;
        Account storage a = _accounts[account];
        if (amount > a.locked) revert ExceedsLocked(account, amount, a.locked);
        a.locked -= amount.toUint128();
        a.stake -= _u112(amount);
        if (a.unbonding > a.stake) a.unbonding = a.stake;
        totalStake -= amount;
        emit Slashed(account, amount, a.stake);
        (bool ok,) = challengeManager.call{value: amount}("");
        if (!ok) revert TransferFailed(challengeManager, amount);
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

    /// @notice Stake not reserved by disputes: stake - locked.
    function freeStake(address who) public view returns (uint256) {
        Account storage a = _accounts[who];
        return a.stake - a.locked;
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

    /// @notice Every registered verifier with its active stake and free (unlocked) stake.
    function verifierStakes()
        external
        view
        returns (address[] memory accounts, uint256[] memory active, uint256[] memory free)
    {
        uint256 n = _verifiers.length;
        accounts = _verifiers;
        active = new uint256[](n);
        free = new uint256[](n);
        for (uint256 i = 0; i < n; i++) {
            Account storage a = _accounts[accounts[i]];
            active[i] = a.stake - a.unbonding;
            free[i] = a.stake - a.locked;
        }
    }

    /// @notice Number of registered verifiers.
    function verifierCount() external view returns (uint256) {
        return _verifiers.length;
    }
}
