"""The operator daemon sees a raised operator minimum coming (issue 31), against a real anvil.

Governance raises ``minOperatorStake`` above the honest operator's stake and a stranger calls
``StakeRegistry.syncParams``: the raise is pending (``MinimumRaisePending``) for
``maxDisputeSpan + coverageNotice``, the operator stays active meanwhile, and the operator's
chain watcher (the claim responder as ``verinfer operator serve`` builds it,
``ClaimResponder.connect``) logs a warning naming the new minimum, the effective chain time and
block and the shortfall in wei. Once the operator has bonded the shortfall the raise applies
without ever making it inactive; an operator that did not bond is told it is below the minimum.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.structs import COVERAGE_NOTICE, Role, default_params
from verinfer.da_client.outbox import Outbox
from verinfer.operator.claims import ClaimResponder

pytestmark = [pytest.mark.anvil]

WATCH_LOG = "verinfer.operator.stake_watch"


@dataclass
class Net:
    node: Anvil
    w3: Web3
    d: Deployment
    gov: LocalAccount
    operator: LocalAccount
    stranger: LocalAccount
    deployment_file: Path

    def as_(self, who: LocalAccount) -> Contracts:
        return self.d.bind(self.w3, TxSender(self.w3, who))

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    with Anvil() as node:
        w3 = node.web3()
        gov, operator, stranger = dev_accounts(3)
        d = deploy_all(w3, gov, default_params())
        path = tmp_path / "deployment.json"
        d.save(path)
        n = Net(node, w3, d, gov, operator, stranger, path)
        n.as_(operator).stakes.register(Role.OPERATOR, default_params().min_operator_stake)
        yield n


def _responder(net: Net, tmp_path: Path, who: LocalAccount) -> tuple[ClaimResponder, Outbox]:
    outbox = Outbox(tmp_path / f"outbox-{who.address}.sqlite")
    r = ClaimResponder.connect(net.node.url, net.deployment_file, private_key=bytes(who.key),
                               outbox=outbox, state_dir=tmp_path, stake_watch_interval_s=0.0)
    return r, outbox


def _raise_minimum(net: Net, minimum: int) -> int:
    """Governance raises the operator minimum; a stranger syncs it at once. Returns the sync's
    chain time."""
    cfg = net.as_(net.gov).config
    cfg.set_params(replace(cfg.params(), min_operator_stake=minimum))
    net.as_(net.stranger).stakes.sync_params()
    return net.now()


def _watch_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == WATCH_LOG]


def test_the_daemon_sees_a_pending_raise_with_its_date_and_shortfall(
        net: Net, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOG)
    p = default_params()
    responder, outbox = _responder(net, tmp_path, net.operator)
    try:
        assert responder.stake_watch is not None, "serve's claim responder watches the stake"
        responder.step()
        assert not [r for r in _watch_records(caplog) if r.levelno >= logging.WARNING]

        synced_at = _raise_minimum(net, 2 * p.min_operator_stake)
        due = synced_at + p.max_dispute_span() + COVERAGE_NOTICE
        stakes = net.d.bind(net.w3).stakes
        assert stakes.pending_min_operator_stake() == (2 * p.min_operator_stake, due)
        assert stakes.min_operator_stake() == p.min_operator_stake, "not applied yet"
        assert stakes.is_active_operator(net.operator.address), "active through the notice"

        caplog.clear()
        responder.step()
        st = responder.stake_watch.status
        assert st is not None
        assert (st.minimum, st.pending, st.effective_at) == (p.min_operator_stake,
                                                             2 * p.min_operator_stake, due)
        assert st.shortfall == p.min_operator_stake and not st.below_minimum
        warned = [r.getMessage() for r in _watch_records(caplog) if r.levelno == logging.WARNING]
        assert len(warned) == 1, warned
        block = responder.stake_watch.effective_block(st)
        assert block > st.head_block
        assert f"effective at chain time {due} (about block {block}" in warned[0]
        assert f"shortfall {p.min_operator_stake} wei" in warned[0]
        assert net.operator.address in warned[0]

        caplog.clear()
        responder.step()  # nothing changed: said once, not at every poll
        assert not _watch_records(caplog)

        # the operator bonds the shortfall; the raise then applies without a gap
        net.as_(net.operator).stakes.bond(p.min_operator_stake)
        caplog.clear()
        responder.step()
        assert responder.stake_watch.status is not None
        assert responder.stake_watch.status.shortfall == 0
        assert not [r for r in _watch_records(caplog) if r.levelno >= logging.WARNING]
        increase_time(net.w3, due - net.now())
        net.as_(net.stranger).stakes.sync_params()
        assert stakes.min_operator_stake() == 2 * p.min_operator_stake
        assert stakes.pending_min_operator_stake() == (0, 0)
        assert stakes.is_active_operator(net.operator.address)
    finally:
        outbox.close()


def test_an_operator_that_did_not_bond_is_told_it_is_below_the_minimum(
        net: Net, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOG)
    p = default_params()
    responder, outbox = _responder(net, tmp_path, net.operator)
    try:
        synced_at = _raise_minimum(net, 3 * p.min_operator_stake)
        increase_time(net.w3, synced_at + p.max_dispute_span() + COVERAGE_NOTICE - net.now())
        net.as_(net.stranger).stakes.sync_params()
        stakes = net.d.bind(net.w3).stakes
        assert not stakes.is_active_operator(net.operator.address)
        caplog.clear()
        responder.step()
        errors = [r.getMessage() for r in _watch_records(caplog) if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        assert "NOT an active operator" in errors[0]
        assert f"bond {2 * p.min_operator_stake} wei more" in errors[0]
    finally:
        outbox.close()


def test_a_raise_not_yet_synced_is_announced_too(
        net: Net, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOG)
    p = default_params()
    responder, outbox = _responder(net, tmp_path, net.operator)
    try:
        cfg = net.as_(net.gov).config
        cfg.set_params(replace(cfg.params(), min_operator_stake=2 * p.min_operator_stake))
        caplog.clear()
        responder.step()
        warned = [r.getMessage() for r in _watch_records(caplog) if r.levelno == logging.WARNING]
        assert len(warned) == 1, warned
        assert "not yet synced" in warned[0]
        assert f"shortfall {p.min_operator_stake} wei" in warned[0]
    finally:
        outbox.close()
