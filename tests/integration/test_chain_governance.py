"""Issue 31 on anvil, through the Python bindings: governance acts with notice and keeps history
(a revocation takes effect ProtocolConfig.governanceNotice after it is sent, a re-approval
opens a new interval without rewriting the old one), parameters that let one seat block a
quorum or leave claims unbounded are refused, a draw delay that cannot fit the draw period is
refused with its numbers, and isVerifier counts only active stake."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace

import pytest
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import TxSender
from verinfer.chain.deploy import deploy_all
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.structs import GOVERNANCE_NOTICE, Kind, Role, default_params

MODEL = hashlib.sha256(b"governance model").digest()


@pytest.fixture(scope="module")
def node() -> Iterator[Anvil]:
    with Anvil() as a:
        yield a


def _now(w3: Web3) -> int:
    return int(w3.eth.get_block("latest")["timestamp"])


def test_revoke_takes_effect_after_notice_and_history_is_kept(node: Anvil) -> None:
    gov, = dev_accounts(1)
    w3 = node.web3()
    d = deploy_all(w3, gov, default_params())
    cfg = d.bind(w3, TxSender(w3, gov)).config
    assert cfg.governance_notice() == GOVERNANCE_NOTICE
    cfg.approve(Kind.MODEL, MODEL)
    first = cfg.approval_history(Kind.MODEL, MODEL)
    assert len(first) == 1 and first[0][1] == 0
    cfg.revoke(Kind.MODEL, MODEL)
    until = cfg.approval_history(Kind.MODEL, MODEL)[0][1]
    assert until == _now(w3) + GOVERNANCE_NOTICE
    assert cfg.is_approved(Kind.MODEL, MODEL), "still approved during the notice"
    increase_time(w3, GOVERNANCE_NOTICE + 5)
    assert not cfg.is_approved(Kind.MODEL, MODEL)
    cfg.approve(Kind.MODEL, MODEL)
    history = cfg.approval_history(Kind.MODEL, MODEL)
    assert history[0] == (first[0][0], until), "the first interval is kept as it was"
    assert history[1] == (_now(w3), 0)


def test_params_one_seat_blocking_or_claim_window_over_challenge_window_refused(
        node: Anvil) -> None:
    gov, = dev_accounts(1)
    w3 = node.web3()
    d = deploy_all(w3, gov, default_params())
    cfg = d.bind(w3, TxSender(w3, gov)).config
    p = cfg.params()
    assert (p.quorum_bps, p.claim_window) == (6666, 3600)
    for bad, why in ((replace(p, quorum_bps=6667),
                      "quorumBps > (committeeSize - 1) / committeeSize"),
                     (replace(p, claim_window=p.challenge_window + 1),
                      "claimWindow not in [1, challengeWindow]"),
                     (replace(p, committee_size=7), "committeeSize not in [1, MAX_COMMITTEE_SIZE]"),
                     (replace(p, min_operator_stake=p.slash_amount),
                      "minOperatorStake < MIN_OPERATOR_STAKE_SLASHES * slashAmount")):
        with pytest.raises(ContractRevertError) as e:
            cfg.set_params(bad)
        assert (e.value.error_name, e.value.error_args) == ("InvalidParams", (why,))


def test_a_draw_delay_that_cannot_fit_the_draw_period_is_refused(node: Anvil) -> None:
    """drawDelayBlocks 200 at 12 s a block is 40 minutes before a challenge's seed exists: a
    10-minute drawPeriod would end every challenge undrawn. The revert carries the numbers."""
    gov, = dev_accounts(1)
    w3 = node.web3()
    d = deploy_all(w3, gov, default_params())
    cfg = d.bind(w3, TxSender(w3, gov)).config
    p = cfg.params()
    need = cfg.min_draw_period(200)
    assert need == 2 * 201 * 12 and p.draw_period < need
    with pytest.raises(ContractRevertError) as e:
        cfg.set_params(replace(p, draw_delay_blocks=200))
    assert (e.value.error_name, e.value.error_args) == ("DrawPeriodTooShort",
                                                        (200, 12, need, p.draw_period))
    cfg.set_params(replace(p, draw_delay_blocks=200, draw_period=need))  # room made: accepted
    assert (cfg.params().draw_delay_blocks, cfg.params().draw_period) == (200, need)


def test_is_verifier_needs_active_stake(node: Anvil) -> None:
    gov, ver = dev_accounts(2)
    w3 = node.web3()
    p = default_params()
    d = deploy_all(w3, gov, p)
    stakes = d.bind(w3, TxSender(w3, ver)).stakes
    stakes.register(Role.VERIFIER, p.min_verifier_stake)
    assert stakes.is_verifier(ver.address)
    stakes.request_unbond(p.min_verifier_stake)
    assert not stakes.is_verifier(ver.address), "unbonding stake does not count"
    increase_time(w3, p.unbonding_period + 1)
    stakes.withdraw()
    assert not stakes.is_verifier(ver.address)
    assert stakes.account_of(ver.address).role is Role.VERIFIER, "the role stays"
