"""`verinfer chain ...`: deploy the contracts and manage operator/verifier stake, and the
(engine fingerprint, model) pairs a verifier declares (it is drawn only for receipts of those)."""

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
from verinfer.chain.structs import ETHER, MIN_COVERAGE_BPS, Role, default_params, pool_key
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
    "its (fingerprint, model) pair; a drawn member that does not reveal is penalised.")]

ModelOpt = Annotated[list[str], typer.Option(
    "--model", help="Model id (0x + 64 hex: sha256 of the weights) this verifier holds, "
    "declared with each --fingerprint: one --model for every --fingerprint, or one per "
    "--fingerprint in the same order. Pools are per (fingerprint, model).")]

OptionalFingerprintOpt = Annotated[list[str] | None, typer.Option(
    "--fingerprint", help="Engine fingerprint hash (0x + 64 hex) to declare after registering; "
    "repeat for several, with --model (see `verinfer chain verifier declare`).")]

OptionalModelOpt = Annotated[list[str] | None, typer.Option(
    "--model", help="Model id (0x + 64 hex) declared with --fingerprint (see `verinfer chain "
    "verifier declare`).")]


def _parse_hash32(text: str, what: str) -> bytes:
    h = text[2:] if text.lower().startswith("0x") else text
    try:
        raw = bytes.fromhex(h)
    except ValueError as e:
        raise typer.BadParameter(f"not a hex {what}: {text!r}") from e
    if len(raw) != 32:
        raise typer.BadParameter(f"a {what} is 32 bytes, got {len(raw)}: {text!r}")
    return raw


def parse_fingerprint(text: str) -> bytes:
    """'0x' + 64 hex -> 32 bytes."""
    return _parse_hash32(text, "fingerprint hash")


def parse_model_id(text: str) -> bytes:
    """'0x' + 64 hex -> 32 bytes."""
    return _parse_hash32(text, "model id")


def parse_pairs(fingerprints: list[str], models: list[str]) -> list[tuple[bytes, bytes]]:
    """--fingerprint and --model values -> (fingerprint hash, model id) pairs: one model for
    every fingerprint, or one per fingerprint in order."""
    fps = [parse_fingerprint(f) for f in fingerprints]
    mids = [parse_model_id(m) for m in models]
    if len(mids) == 1:
        return [(f, mids[0]) for f in fps]
    if len(mids) != len(fps):
        raise typer.BadParameter(f"give one --model for every --fingerprint or one per "
                                 f"--fingerprint: got {len(fps)} fingerprints and "
                                 f"{len(mids)} models")
    return list(zip(fps, mids, strict=True))


def _declare(pairs: list[tuple[bytes, bytes]], deployment: Path, rpc: str,
             keystore: Path | None) -> None:
    try:
        s = _sender(rpc, keystore)
        d = Deployment.load(deployment)
        res = ensure_declared(d.bind(s.w3, s), s.address, pairs)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    for f, m in res.declared:
        typer.echo(f"{s.address} declared fingerprint {to_hex(f)} model {to_hex(m)}")
    for f, m in res.already:
        typer.echo(f"{s.address} already declared fingerprint {to_hex(f)} model {to_hex(m)}")
    if res.unapproved:
        bad = ", ".join(f"{to_hex(f)} model {to_hex(m)}" for f, m in res.unapproved)
        raise fail(StakeActionError(f"not approved engine fingerprints or models "
                                    f"(not declared): {bad}", param="fingerprint"), exit_code=2)


@verifier_app.command("register")
def verifier_register(stake: Annotated[str, typer.Option(help="ETH to bond.")],
                      deployment: DeploymentOpt, rpc: RpcOpt = "",
                      keystore: KeystoreOpt = None,
                      fingerprint: OptionalFingerprintOpt = None,
                      model: OptionalModelOpt = None) -> None:
    """Register the key as a verifier, bonding --stake ETH, and declare each (--fingerprint,
    --model) pair."""
    # refuse bad input before bonding anything
    pairs = parse_pairs(fingerprint or [], model or [])
    _register(Role.VERIFIER, stake, deployment, rpc, keystore)
    if pairs:
        _declare(pairs, deployment, rpc, keystore)


@verifier_app.command("declare")
def verifier_declare(fingerprint: FingerprintOpt, model: ModelOpt, deployment: DeploymentOpt,
                     rpc: RpcOpt = "", keystore: KeystoreOpt = None) -> None:
    """Declare (approved) (engine fingerprint, model) pairs this verifier re-executes."""
    _declare(parse_pairs(fingerprint, model), deployment, rpc, keystore)


@verifier_app.command("undeclare")
def verifier_undeclare(fingerprint: Annotated[str, typer.Option(
                           "--fingerprint", help="The fingerprint hash to stop covering.")],
                       model: Annotated[str, typer.Option(
                           "--model", help="The model id declared with it.")],
                       deployment: DeploymentOpt, rpc: RpcOpt = "",
                       keystore: KeystoreOpt = None) -> None:
    """Stop covering a (fingerprint, model) pair now; stay drawable for it until leaveAt (now
    + the longest dispute span), then `complete-undeclare` at once. Keep judging it (the node
    running with the model) until the printed "liable until": a challenge opened just before
    leaveAt (or before complete-undeclare) draws from the pool as it was at its open block, up
    to drawPeriod later, and its vote ends commitPeriod + revealPeriod after the draw. A member
    that stopped at leaveAt is drawn all the same and pays the non-reveal penalty."""
    fp, mid = parse_fingerprint(fingerprint), parse_model_id(model)
    try:
        s = _sender(rpc, keystore)
        contracts = Deployment.load(deployment).bind(s.w3, s)
        contracts.stakes.undeclare_fingerprint(fp, mid)
        leave_at = contracts.stakes.declarations_of(s.address)[pool_key(fp, mid)]
        p = contracts.config.params()
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    liable_until = leave_at + p.draw_period + p.commit_period + p.reveal_period
    typer.echo(f"{s.address} leaves fingerprint {to_hex(fp)} model {to_hex(mid)} at "
               f"{leave_at} (then at once: verinfer chain verifier complete-undeclare); "
               f"liable until {liable_until}: keep judging this model until then (a challenge "
               f"opened before you leave still draws you after leaveAt)")


@verifier_app.command("complete-undeclare")
def verifier_complete_undeclare(fingerprint: Annotated[str, typer.Option(
                                    "--fingerprint", help="The fingerprint hash to leave.")],
                                model: Annotated[str, typer.Option(
                                    "--model", help="The model id declared with it.")],
                                deployment: DeploymentOpt, rpc: RpcOpt = "",
                                keystore: KeystoreOpt = None) -> None:
    """Leave a (fingerprint, model) draw pool once the undeclaration is due."""
    fp, mid = parse_fingerprint(fingerprint), parse_model_id(model)
    try:
        s = _sender(rpc, keystore)
        Deployment.load(deployment).bind(s.w3, s).stakes.complete_undeclare(s.address, fp, mid)
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(f"{s.address} left fingerprint {to_hex(fp)} model {to_hex(mid)}")


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
