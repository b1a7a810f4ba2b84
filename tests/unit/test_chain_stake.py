"""verinfer.chain.stake: the one stake-action helper behind both stake CLIs (no node: the
StakeRegistry binding is replaced by a recorder)."""

from __future__ import annotations

from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from verinfer.chain.bindings import TxSender
from verinfer.chain.deploy import Deployment
from verinfer.chain.errors import ContractRevertError, StakeActionError
from verinfer.chain.stake import StakeAction, stake_action
from verinfer.chain.structs import Role, StakeAccount

DEPLOYMENT = Deployment(31337, *("0x" + f"{i:02x}" * 20 for i in range(1, 6)), 0)
SENDER = TxSender(Web3(), Account.create())
AFTER = StakeAccount(stake=7, unbonding=3, role=Role.OPERATOR, locked=0, unbond_ready_at=99)


class RecordingStakes:
    def __init__(self, revert: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.bound: list[tuple[Deployment, TxSender | None]] = []  # Deployment.bind calls
        self.revert = revert

    def _tx(self, *call: Any) -> dict[str, bytes]:
        if self.revert:
            raise ContractRevertError("register reverted: AlreadyRegistered()",
                                      error_name="AlreadyRegistered", error_args=(), data=b"")
        self.calls.append(call)
        return {"transactionHash": bytes([len(self.calls)]) * 32}

    def register(self, role: Role, stake_wei: int) -> dict[str, bytes]:
        return self._tx("register", role, stake_wei)

    def bond(self, amount_wei: int) -> dict[str, bytes]:
        return self._tx("bond", amount_wei)

    def request_unbond(self, amount_wei: int) -> dict[str, bytes]:
        return self._tx("request_unbond", amount_wei)

    def withdraw(self) -> dict[str, bytes]:
        return self._tx("withdraw")

    def account_of(self, who: str) -> StakeAccount:
        self.calls.append(("account_of", who))
        return AFTER


@pytest.fixture
def stakes(monkeypatch: pytest.MonkeyPatch) -> RecordingStakes:
    rec = RecordingStakes()

    class Bound:
        stakes = rec

    def bind(self: Deployment, w3: Web3, sender: TxSender | None = None) -> Bound:
        rec.bound.append((self, sender))
        return Bound()

    monkeypatch.setattr(Deployment, "bind", bind)
    return rec


@pytest.mark.parametrize("action, amount, call", [
    (StakeAction.REGISTER, 5, ("register", Role.OPERATOR, 5)),
    (StakeAction.STAKE, 2, ("bond", 2)),
    (StakeAction.UNBOND, 1, ("request_unbond", 1)),
    (StakeAction.WITHDRAW, None, ("withdraw",)),
])
def test_each_action_sends_its_call_from_the_sender_then_reads_the_account(
        stakes: RecordingStakes, action: StakeAction, amount: int | None,
        call: tuple[Any, ...]) -> None:
    r = stake_action(DEPLOYMENT, SENDER, action, amount)
    assert stakes.calls == [call, ("account_of", SENDER.address)]
    assert stakes.bound == [(DEPLOYMENT, SENDER)]
    assert (r.address, r.action, r.amount_wei, r.account, r.tx_hash) == \
        (SENDER.address, action, amount, AFTER, b"\x01" * 32)


def test_register_uses_the_given_role(stakes: RecordingStakes) -> None:
    stake_action(DEPLOYMENT, SENDER, StakeAction.REGISTER, 10, role=Role.VERIFIER)
    assert stakes.calls[0] == ("register", Role.VERIFIER, 10)


@pytest.mark.parametrize("action, amount, role", [
    (StakeAction.REGISTER, None, Role.OPERATOR),
    (StakeAction.STAKE, 0, Role.OPERATOR),
    (StakeAction.UNBOND, -1, Role.OPERATOR),
    (StakeAction.STAKE, True, Role.OPERATOR),
    (StakeAction.WITHDRAW, 1, Role.OPERATOR),
    (StakeAction.REGISTER, 1, Role.NONE),
])
def test_bad_amount_or_role_is_refused_before_anything_is_sent(
        stakes: RecordingStakes, action: StakeAction, amount: Any, role: Role) -> None:
    with pytest.raises(StakeActionError) as e:
        stake_action(DEPLOYMENT, SENDER, action, amount, role=role)
    assert e.value.caller_fault
    assert stakes.calls == []


def test_a_revert_reaches_the_caller_as_the_typed_chain_error(stakes: RecordingStakes) -> None:
    stakes.revert = True
    with pytest.raises(ContractRevertError) as e:
        stake_action(DEPLOYMENT, SENDER, StakeAction.REGISTER, 1)
    assert e.value.error_name == "AlreadyRegistered"
