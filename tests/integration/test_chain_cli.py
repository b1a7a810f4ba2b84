"""`verinfer chain ...` against a real anvil: deploy, operator register/stake/unbond, verifier
register, with keys from the environment and from a keystore file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from typer.testing import CliRunner
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import TxSender
from verinfer.chain.cli import app
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.stake import StakeAction, stake_action
from verinfer.chain.structs import ETHER, MIN_COVERAGE_BPS, Role, default_params


@pytest.fixture(scope="module")
def node() -> Iterator[Anvil]:
    with Anvil() as a:
        yield a


def test_chain_cli_deploy_register_stake_unbond(node: Anvil, tmp_path: Path) -> None:
    runner = CliRunner()
    gov, op, ver = dev_accounts(3)
    dep = tmp_path / "deployment.json"
    env = {"VERINFER_CHAIN_RPC": node.url, "VERINFER_CHAIN_PRIVATE_KEY": gov.key.hex()}
    r = runner.invoke(app, ["deploy", "--out", str(dep)], env=env)
    assert r.exit_code == 0, r.output
    d = Deployment.load(dep)
    op_env = {**env, "VERINFER_CHAIN_PRIVATE_KEY": op.key.hex()}
    r = runner.invoke(app, ["operator", "register", "--stake", "2", "--deployment", str(dep)],
                      env=op_env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["operator", "stake", "--amount", "0.5", "--deployment", str(dep)],
                      env=op_env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["operator", "unbond", "--amount", "1", "--deployment", str(dep)],
                      env=op_env)
    assert r.exit_code == 0, r.output
    view = d.bind(Web3(Web3.HTTPProvider(node.url)))
    acct = view.stakes.account_of(op.address)
    assert (acct.role, acct.stake, acct.unbonding) == (Role.OPERATOR, 5 * ETHER // 2, ETHER)

    ks = tmp_path / "verifier.json"
    ks.write_text(json.dumps(Account.encrypt(ver.key, "pw", iterations=2)))
    ver_env = {"VERINFER_CHAIN_RPC": node.url, "VERINFER_KEYSTORE_PASSWORD": "pw"}
    r = runner.invoke(app, ["verifier", "register", "--stake", "0.2", "--deployment", str(dep),
                            "--keystore", str(ks)], env=ver_env)
    assert r.exit_code == 0, r.output
    assert view.stakes.is_verifier(ver.address)

    # Bad input: a second registration reverts with the contract's typed error.
    r = runner.invoke(app, ["verifier", "register", "--stake", "0.2", "--deployment", str(dep),
                            "--keystore", str(ks)], env=ver_env)
    assert r.exit_code == 2
    assert "AlreadyRegistered" in r.output


def test_stake_action_withdraws_only_after_the_unbonding_period(node: Anvil) -> None:
    w3 = node.web3()
    gov, op = dev_accounts(4)[0], dev_accounts(4)[3]
    d = deploy_all(w3, gov, default_params())
    sender = TxSender(w3, op)
    stake_action(d, sender, StakeAction.REGISTER, 2 * ETHER)
    r = stake_action(d, sender, StakeAction.UNBOND, ETHER)
    assert (r.account.stake, r.account.unbonding) == (2 * ETHER, ETHER)
    with pytest.raises(ContractRevertError) as e:
        stake_action(d, sender, StakeAction.WITHDRAW)
    assert e.value.error_name == "UnbondingNotReady"
    increase_time(w3, default_params().unbonding_period)
    balance = w3.eth.get_balance(op.address)
    r = stake_action(d, sender, StakeAction.WITHDRAW)
    assert (r.account.stake, r.account.unbonding) == (ETHER, 0)
    assert w3.eth.get_transaction_receipt(r.tx_hash)["status"] == 1
    assert w3.eth.get_balance(op.address) > balance


def test_chain_cli_deploy_min_coverage_bps(node: Anvil, tmp_path: Path) -> None:
    """--min-coverage-bps reaches StakeRegistry.minCoverageBps (the default is the production
    share); a share above 100% or below 0 is refused before anything is sent."""
    runner = CliRunner()
    gov = dev_accounts(1)[0]
    env = {"VERINFER_CHAIN_RPC": node.url, "VERINFER_CHAIN_PRIVATE_KEY": gov.key.hex()}
    view = Web3(Web3.HTTPProvider(node.url))
    for args, want in (([], MIN_COVERAGE_BPS), (["--min-coverage-bps", "2500"], 2500),
                       (["--min-coverage-bps", "0"], 0)):
        dep = tmp_path / f"deployment-{want}.json"
        r = runner.invoke(app, ["deploy", "--out", str(dep), *args], env=env)
        assert r.exit_code == 0, r.output
        assert Deployment.load(dep).bind(view).stakes.min_coverage_bps() == want
    nonce = view.eth.get_transaction_count(gov.address)
    for bad in ("10001", "-1"):
        r = runner.invoke(app, ["deploy", "--out", str(tmp_path / "bad.json"),
                                "--min-coverage-bps", bad], env=env)
        assert r.exit_code == 2, r.output
        assert "--min-coverage-bps" in r.output
        assert not (tmp_path / "bad.json").exists()
    assert view.eth.get_transaction_count(gov.address) == nonce
