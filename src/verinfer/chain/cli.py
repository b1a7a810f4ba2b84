"""`verinfer chain ...`: deploy the contracts and manage operator/verifier stake, and the
engine fingerprints a verifier declares (it is drawn only for receipts under those)."""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer

from verinfer.chain.bindings import TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.errors import StakeActionError
from verinfer.chain.keys import load_account
from verinfer.chain.rpc import bounded_web3
from verinfer.chain.stake import StakeAction, StakeResult, ensure_declared, stake_action
from verinfer.chain.structs import ETHER, MIN_COVERAGE_BPS, Role, default_params
from verinfer.cli_errors import fail
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import to_hex

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
#: StakeRegistry.BPS: the constructor refuses a larger minCoverageBps (MinCoverageBpsTooLarge);
#: checked here too so that the CLI says so before sending anything.
_BPS = 10_000
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
    w3 = bounded_web3(_rpc(rpc))
    return TxSender(w3, load_account(keystore))


@app.command()
def deploy(
    out: Annotated[Path, typer.Option("--out", help="Where to write the deployment JSON.")],
    rpc: RpcOpt = "",
    keystore: KeystoreOpt = None,
    governance: Annotated[str | None, typer.Option(help="Owner of config/registry.")] = None,
    min_coverage_bps: Annotated[int, typer.Option(
        "--min-coverage-bps", min=0, max=_BPS,
        help="StakeRegistry.minCoverageBps: the share of all verifier weight (basis points) "
        "a fingerprint's declared verifiers must hold for its receipts to be valid. "
        "Immutable once deployed.")] = MIN_COVERAGE_BPS,
) -> None:
    """Deploy all contracts with the devnet default parameters."""
    try:
        s = _sender(rpc, keystore)
        d = deploy_all(s.w3, s.account, default_params(), governance,
                       min_coverage_bps=min_coverage_bps)
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


FingerprintOpt = Annotated[list[str], typer.Option(
    "--fingerprint", help="Engine fingerprint hash (0x + 64 hex) this verifier re-executes; "
    "repeat for several. Committees of a receipt are drawn only from verifiers declared for "
    "its fingerprint; a drawn member that does not reveal is penalised.")]


OptionalFingerprintOpt = Annotated[list[str] | None, typer.Option(
    "--fingerprint", help="Engine fingerprint hash (0x + 64 hex) to declare after registering; "
    "repeat for several (see `verinfer chain verifier declare`).")]


def parse_fingerprint(text: str) -> bytes:
    """'0x' + 64 hex -> 32 bytes."""
    h = text[2:] if text.lower().startswith("0x") else text
    try:
        raw = bytes.fromhex(h)
    except ValueError as e:
        raise typer.BadParameter(f"not a hex fingerprint hash: {text!r}") from e
    if len(raw) != 32:
        raise typer.BadParameter(f"a fingerprint hash is 32 bytes, got {len(raw)}: {text!r}")
    return raw


def _declare(fingerprints: list[str], deployment: Path, rpc: str, keystore: Path | None) -> None:
    fps = [parse_fingerprint(f) for f in fingerprints]
    try:
        s = _sender(rpc, keystore)
        d = Deployment.load(deployment)
        res = ensure_declared(d.bind(s.w3, s), s.address, fps)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    for f in res.declared:
        typer.echo(f"{s.address} declared fingerprint {to_hex(f)}")
    for f in res.already:
        typer.echo(f"{s.address} already declared fingerprint {to_hex(f)}")
    if res.unapproved:
        bad = ", ".join(to_hex(f) for f in res.unapproved)
        raise fail(StakeActionError(f"not approved engine fingerprints (not declared): {bad}",
                                    param="fingerprint"), exit_code=2)


@verifier_app.command("register")
def verifier_register(stake: Annotated[str, typer.Option(help="ETH to bond.")],
                      deployment: DeploymentOpt, rpc: RpcOpt = "",
                      keystore: KeystoreOpt = None,
                      fingerprint: OptionalFingerprintOpt = None) -> None:
    """Register the key as a verifier, bonding --stake ETH, and declare each --fingerprint."""
    for f in fingerprint or []:
        parse_fingerprint(f)  # refuse a bad one before bonding anything
    _register(Role.VERIFIER, stake, deployment, rpc, keystore)
    if fingerprint:
        _declare(fingerprint, deployment, rpc, keystore)


@verifier_app.command("declare")
def verifier_declare(fingerprint: FingerprintOpt, deployment: DeploymentOpt, rpc: RpcOpt = "",
                     keystore: KeystoreOpt = None) -> None:
    """Declare (approved) engine fingerprints this verifier re-executes."""
    _declare(fingerprint, deployment, rpc, keystore)


@verifier_app.command("undeclare")
def verifier_undeclare(fingerprint: Annotated[str, typer.Option(
                           "--fingerprint", help="The fingerprint hash to stop covering.")],
                       deployment: DeploymentOpt, rpc: RpcOpt = "",
                       keystore: KeystoreOpt = None) -> None:
    """Stop covering a fingerprint now; stay drawable (and liable) for it until the printed
    time (now + the longest dispute span), then `complete-undeclare`."""
    fp = parse_fingerprint(fingerprint)
    try:
        s = _sender(rpc, keystore)
        stakes = Deployment.load(deployment).bind(s.w3, s).stakes
        stakes.undeclare_fingerprint(fp)
        leave_at = stakes.declarations_of(s.address)[fp]
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(f"{s.address} leaves fingerprint {to_hex(fp)} at {leave_at} "
               f"(then: verinfer chain verifier complete-undeclare)")


@verifier_app.command("complete-undeclare")
def verifier_complete_undeclare(fingerprint: Annotated[str, typer.Option(
                                    "--fingerprint", help="The fingerprint hash to leave.")],
                                deployment: DeploymentOpt, rpc: RpcOpt = "",
                                keystore: KeystoreOpt = None) -> None:
    """Leave a fingerprint's draw pool once the undeclaration is due."""
    fp = parse_fingerprint(fingerprint)
    try:
        s = _sender(rpc, keystore)
        Deployment.load(deployment).bind(s.w3, s).stakes.complete_undeclare(s.address, fp)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(f"{s.address} left fingerprint {to_hex(fp)}")


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
