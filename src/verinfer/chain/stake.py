"""Stake actions against the StakeRegistry: register, stake (bond more), unbond, withdraw;
and a verifier's fingerprint declarations (:func:`ensure_declared`).

The one implementation behind `verinfer chain operator|verifier …` and `verinfer operator
register|stake|unbond|withdraw`: send the action's transaction from the sender's key, then read
the account back. Reverts raise :class:`~verinfer.chain.errors.ContractRevertError` (with the
contract's custom error), node failures :class:`~verinfer.chain.errors.ChainError`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment
from verinfer.chain.errors import StakeActionError
from verinfer.chain.structs import Kind, Role, StakeAccount, pool_key


class StakeAction(enum.StrEnum):
    REGISTER = "register"  # register with a role, bonding the amount
    STAKE = "stake"  # add the amount to the bond
    UNBOND = "unbond"  # start unbonding the amount
    WITHDRAW = "withdraw"  # withdraw what finished unbonding (no amount)


@dataclass(frozen=True)
class StakeResult:
    address: str  # the sender's
    action: StakeAction
    amount_wei: int | None
    account: StakeAccount  # read after the transaction was mined
    tx_hash: bytes


def stake_action(deployment: Deployment, sender: TxSender, action: StakeAction,
                 amount_wei: int | None = None, *, role: Role = Role.OPERATOR) -> StakeResult:
    """Perform ``action`` for ``sender``'s account. ``amount_wei`` (positive) is required for
    register, stake and unbond and refused for withdraw; ``role`` is what register registers
    as. Arguments are checked before anything is sent."""
    action = StakeAction(action)
    if action is StakeAction.WITHDRAW:
        if amount_wei is not None:
            raise StakeActionError("withdraw takes no amount (it withdraws what finished "
                                   "unbonding)", param="amount")
    elif isinstance(amount_wei, bool) or not isinstance(amount_wei, int) or amount_wei <= 0:
        raise StakeActionError(f"{action} needs a positive amount in wei, got {amount_wei!r}",
                               param="amount")
    if role not in (Role.OPERATOR, Role.VERIFIER):
        raise StakeActionError(f"one registers as operator or verifier, not {role.name}",
                               param="role")
    stakes = deployment.bind(sender.w3, sender).stakes
    amount = amount_wei or 0
    if action is StakeAction.REGISTER:
        tx = stakes.register(role, amount)
    elif action is StakeAction.STAKE:
        tx = stakes.bond(amount)
    elif action is StakeAction.UNBOND:
        tx = stakes.request_unbond(amount)
    else:
        tx = stakes.withdraw()
    return StakeResult(sender.address, action, amount_wei, stakes.account_of(sender.address),
                       bytes(tx["transactionHash"]))


#: One declaration: (engine fingerprint hash, model id), 32 bytes each. Its pool is
#: structs.pool_key(fingerprint, model).
Pair = tuple[bytes, bytes]


@dataclass(frozen=True)
class Declared:
    """What :func:`ensure_declared` did: (fingerprint hash, model id) pairs newly declared (or
    whose pending undeclaration it cancelled), already declared, and skipped because governance
    has not approved the fingerprint or the model (the contract refuses those: nobody can be
    drawn for them); with ``keep_leaving``, the pairs left leaving (pair, leaveAt). ``others``:
    pools (pool key, leaveAt; 0 = staying) ``me`` is declared for that ``pairs`` does not name:
    it is drawn for their receipts and penalised if it does not reveal."""

    declared: tuple[Pair, ...]
    already: tuple[Pair, ...]
    unapproved: tuple[Pair, ...]
    leaving: tuple[tuple[Pair, int], ...] = ()
    others: tuple[tuple[bytes, int], ...] = ()


def ensure_declared(contracts: Contracts, me: str, pairs: Iterable[Pair], *,
                    keep_leaving: bool = False) -> Declared:
    """Declare ``me`` (a registered verifier; ``contracts`` bound to its key) for every approved
    (engine fingerprint hash, model id) pair in ``pairs`` it does not cover yet, so that it is
    drawn into the committees of receipts of that model under that fingerprint
    (StakeRegistry.declareFingerprint; pools are per pair: the own engine's fingerprint is the
    same for every model). Declaring is a promise: a drawn member that does not reveal is
    penalised. The one implementation behind ``verinfer chain verifier register|declare``, the
    verifier node's start and the devnet.

    Declaring a pair whose undeclaration is pending cancels the undeclaration. That is what an
    explicit ``declare`` means; a node that merely restarts passes ``keep_leaving=True`` so a
    restart never silently undoes its operator's decision to leave (the pair is reported in
    ``leaving`` instead)."""
    wanted = list(dict.fromkeys((bytes(f), bytes(m)) for f, m in pairs))
    for f, m in wanted:
        if len(f) != 32:
            raise StakeActionError(f"a fingerprint hash is 32 bytes, got {len(f)}",
                                   param="fingerprint")
        if len(m) != 32:
            raise StakeActionError(f"a model id is 32 bytes, got {len(m)}", param="model")
    have = contracts.stakes.declarations_of(me)
    new, already, unapproved, leaving = [], [], [], []
    for f, m in wanted:
        leave_at = have.get(pool_key(f, m), None)
        if leave_at == 0:
            already.append((f, m))
        elif leave_at is not None and keep_leaving:
            leaving.append(((f, m), leave_at))
        elif not (contracts.config.is_approved(Kind.ENGINE_FINGERPRINT, f)
                  and contracts.config.is_approved(Kind.MODEL, m)):
            unapproved.append((f, m))
        else:
            contracts.stakes.declare_fingerprint(f, m)  # also cancels a pending undeclaration
            new.append((f, m))
    named = {pool_key(f, m) for f, m in wanted}
    others = tuple((k, t) for k, t in have.items() if k not in named)
    return Declared(tuple(new), tuple(already), tuple(unapproved), tuple(leaving), others)
