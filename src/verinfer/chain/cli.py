"""`verinfer chain ...`: deploy the contracts and manage operator/verifier stake."""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer
from web3 import Web3

from verinfer.chain.bindings import TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.keys import load_account
from verinfer.chain.stake import StakeAction, StakeResult, stake_action
from verinfer.chain.structs import ETHER, Role, default_params
from verinfer.cli_errors import fail
from verinfer.errors import VerinferError

app = typer.Typer(help="Contracts: deploy, stake, unbond.", no_args_is_help=True)
operator_app = typer.Typer(help="Operator stake.", no_args_is_help=True)
verifier_app = typer.Typer(help="Verifier stake.", no_args_is_help=True)
app.add_typer(operator_app, name="operator")
app.add_typer(verifier_app, name="verifier")

RpcOpt = Annotated[str, typer.Option(
    "--rpc", help="JSON-RPC URL (default $VERINFER_CHAIN_RPC or http://127.0.0.1:8545).")]
KeystoreOpt = Annotated[Path | None, typer.Option(
    "--keystore", help="Keystore JSON; password in $VERINFER_KEYSTORE_PASSWORD. "
    "Without it the key comes from $VERINFER_CHAIN_PRIVATE_KEY.")]
DeploymentOpt = Annotated[Path, typer.Option("--deployment", help="Deployment JSON file.")]


def _rpc(rpc: str) -> str:
    return rpc or os.environ.get("VERINFER_CHAIN_RPC", "http://127.0.0.1:8545")


def parse_ether(text: str) -> int:
    """'1.5' (ETH) -> wei; exact, no float rounding."""
    try:
        wei = Decimal(text) * ETHER
    except InvalidOperation as e:
        raise typer.BadParameter(f"not an ETH amount: {text!r}") from e
    if wei <= 0 or wei != wei.to_integral_value():
        raise typer.BadParameter(f"amount must be positive with at most 18 decimals: {text!r}")
    return int(wei)


def _sender(rpc: str, keystore: Path | None) -> TxSender:
    w3 = Web3(Web3.HTTPProvider(_rpc(rpc), request_kwargs={"timeout": 30}))
    return TxSender(w3, load_account(keystore))


@app.command()
def deploy(
    out: Annotated[Path, typer.Option("--out", help="Where to write the deployment JSON.")],
    rpc: RpcOpt = "",
    keystore: KeystoreOpt = None,
    governance: Annotated[str | None, typer.Option(help="Owner of config/registry.")] = None,
) -> None:
    """Deploy all contracts with the devnet default parameters."""
    try:
        s = _sender(rpc, keystore)
        d = deploy_all(s.w3, s.account, default_params(), governance)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    d.save(out)
    typer.echo(f"deployed on chain {d.chain_id}: ChallengeManager {d.challenge_manager} -> {out}")


def _stake(action: StakeAction, amount: str, deployment: Path, rpc: str,
           keystore: Path | None, role: Role = Role.OPERATOR) -> StakeResult:
    try:
        s = _sender(rpc, keystore)
        d = Deployment.load(deployment)
        return stake_action(d, s, action, parse_ether(amount), role=role)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e


def _register(role: Role, stake: str, deployment: Path, rpc: str, keystore: Path | None) -> None:
    r = _stake(StakeAction.REGISTER, stake, deployment, rpc, keystore, role)
    typer.echo(f"{r.address} registered as {role.name.lower()} with stake {r.account.stake} wei")


@operator_app.command("register")
def operator_register(stake: Annotated[str, typer.Option(help="ETH to bond.")],
                      deployment: DeploymentOpt, rpc: RpcOpt = "",
                      keystore: KeystoreOpt = None) -> None:
    """Register the key as an operator, bonding --stake ETH."""
    _register(Role.OPERATOR, stake, deployment, rpc, keystore)


@verifier_app.command("register")
def verifier_register(stake: Annotated[str, typer.Option(help="ETH to bond.")],
                      deployment: DeploymentOpt, rpc: RpcOpt = "",
                      keystore: KeystoreOpt = None) -> None:
    """Register the key as a verifier, bonding --stake ETH."""
    _register(Role.VERIFIER, stake, deployment, rpc, keystore)


@operator_app.command("stake")
def operator_stake(amount: Annotated[str, typer.Option(help="ETH to add.")],
                   deployment: DeploymentOpt, rpc: RpcOpt = "",
                   keystore: KeystoreOpt = None) -> None:
    """Add --amount ETH to the operator's stake."""
    r = _stake(StakeAction.STAKE, amount, deployment, rpc, keystore)
    typer.echo(f"{r.address} stake now {r.account.stake} wei")


@operator_app.command("unbond")
def operator_unbond(amount: Annotated[str, typer.Option(help="ETH to unbond.")],
                    deployment: DeploymentOpt, rpc: RpcOpt = "",
                    keystore: KeystoreOpt = None) -> None:
    """Start unbonding --amount ETH (withdrawable after the unbonding period)."""
    r = _stake(StakeAction.UNBOND, amount, deployment, rpc, keystore)
    typer.echo(f"{r.address} unbonding {r.account.unbonding} wei, ready at "
               f"{r.account.unbond_ready_at}")
