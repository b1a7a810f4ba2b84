"""`verinfer chain verifier register --fingerprint | declare | undeclare | complete-undeclare`
against a real anvil: a verifier declares the engine fingerprints it re-executes (committees
are drawn only from verifiers declared for a receipt's fingerprint), bad input is refused
before anything is sent, an unapproved fingerprint is reported, leaving takes maxDisputeSpan."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import TxSender
from verinfer.chain.cli import app
from verinfer.chain.deploy import deploy_all
from verinfer.chain.structs import COVERAGE_NOTICE, Kind, default_params, pool_key

FP = hashlib.sha256(b"cli engine fingerprint").digest()
UNAPPROVED = hashlib.sha256(b"not approved").digest()
MODEL = hashlib.sha256(b"cli model").digest()
POOL = pool_key(FP, MODEL)  # pools are per (fingerprint, model)


@pytest.fixture(scope="module")
def node() -> Iterator[Anvil]:
    with Anvil() as a:
        yield a


def test_verifier_register_declares_and_leaves(node: Anvil, tmp_path: Path) -> None:
    runner = CliRunner()
    gov, ver = dev_accounts(2)
    w3 = Web3(Web3.HTTPProvider(node.url))
    d = deploy_all(w3, gov, default_params())
    dep = tmp_path / "deployment.json"
    d.save(dep)
    d.bind(w3, TxSender(w3, gov)).config.approve(Kind.ENGINE_FINGERPRINT, FP)
    d.bind(w3, TxSender(w3, gov)).config.approve(Kind.MODEL, MODEL)
    view = d.bind(w3)
    env = {"VERINFER_CHAIN_RPC": node.url, "VERINFER_CHAIN_PRIVATE_KEY": ver.key.hex()}
    base = ["--deployment", str(dep)]

    # a malformed hash is refused before the stake is bonded
    r = runner.invoke(app, ["verifier", "register", "--stake", "0.2", *base,
                            "--fingerprint", "0x1234", "--model", MODEL.hex()], env=env)
    assert r.exit_code != 0 and "32 bytes" in r.output
    assert not view.stakes.is_verifier(ver.address)
    # a fingerprint without its model is refused before the stake is bonded too
    r = runner.invoke(app, ["verifier", "register", "--stake", "0.2", *base,
                            "--fingerprint", "0x" + FP.hex()], env=env)
    assert r.exit_code != 0 and "--model" in r.output
    assert not view.stakes.is_verifier(ver.address)

    r = runner.invoke(app, ["verifier", "register", "--stake", "0.2", *base,
                            "--fingerprint", "0x" + FP.hex(), "--model", "0x" + MODEL.hex()],
                      env=env)
    assert r.exit_code == 0, r.output
    assert f"declared fingerprint 0x{FP.hex()} model 0x{MODEL.hex()}" in r.output
    assert view.stakes.declarations_of(ver.address) == {POOL: 0}
    now = int(w3.eth.get_block("latest")["timestamp"])
    assert view.stakes.coverage_at(POOL, now) == 1
    assert view.stakes.coverage_at(FP, now) == 0  # the fingerprint alone is no pool
    notice = view.stakes.coverage_notice()
    assert notice == COVERAGE_NOTICE  # `verinfer chain deploy`'s default
    assert not view.stakes.is_covered_at(POOL, now)
    assert view.stakes.is_covered_at(POOL, now + notice)

    r = runner.invoke(app, ["verifier", "declare", *base, "--fingerprint", "0x" + FP.hex(),
                            "--fingerprint", "0x" + UNAPPROVED.hex(), "--model", MODEL.hex()],
                      env=env)
    assert r.exit_code == 2
    assert "already declared" in r.output and UNAPPROVED.hex() in r.output
    # an unapproved model is reported too (nobody can be drawn for it)
    r = runner.invoke(app, ["verifier", "declare", *base, "--fingerprint", FP.hex(),
                            "--model", UNAPPROVED.hex()], env=env)
    assert r.exit_code == 2 and f"model 0x{UNAPPROVED.hex()}" in r.output
    assert view.stakes.declarations_of(ver.address) == {POOL: 0}

    r = runner.invoke(app, ["verifier", "undeclare", *base, "--fingerprint", FP.hex(),
                            "--model", MODEL.hex()], env=env)
    assert r.exit_code == 0, r.output
    leave_at = view.stakes.declarations_of(ver.address)[POOL]
    now = int(w3.eth.get_block("latest")["timestamp"])
    assert leave_at == now + default_params().max_dispute_span() + notice
    # a challenge opened just before leave_at draws from its open block's pool up to
    # drawPeriod later and votes commit + reveal after that: the CLI says so
    p = default_params()
    assert f"liable until {leave_at + p.draw_period + p.commit_period + p.reveal_period}" \
        in r.output, r.output
    assert view.stakes.coverage_at(POOL, now) == 0  # stops covering at once

    r = runner.invoke(app, ["verifier", "complete-undeclare", *base, "--fingerprint",
                            FP.hex(), "--model", MODEL.hex()], env=env)
    assert r.exit_code == 2 and "UndeclareNotReady" in r.output  # still drawable
    increase_time(w3, default_params().max_dispute_span() + notice)
    r = runner.invoke(app, ["verifier", "complete-undeclare", *base, "--fingerprint",
                            FP.hex(), "--model", MODEL.hex()], env=env)
    assert r.exit_code == 0, r.output
    assert view.stakes.declarations_of(ver.address) == {}
