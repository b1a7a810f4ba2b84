"""`verinfer operator …`: serve the API; set up an operator's keys and evidence configuration."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from verinfer.cli_errors import fail
from verinfer.operator.commit_cli import commit
from verinfer.operator.config import (
    CONFIG_NAME,
    PASSWORD_ENV,
    ChainSink,
    OperatorConfig,
    create_keystore,
    write_config,
)
from verinfer.operator.serve_cli import serve
from verinfer.protocol.hexutil import parse_hex_lenient, to_hex

if TYPE_CHECKING:  # imported on use: `verinfer operator init` needs no web3
    from verinfer.chain.bindings import TxSender
    from verinfer.chain.deploy import Deployment

app = typer.Typer(help="Operator: serve the API, keystore, evidence configuration, stake, "
                  "publication status.", no_args_is_help=True)
# `verinfer operator serve`, also `verinfer serve` (verinfer.cli); its heavy imports are lazy
app.command("serve")(serve)
# `verinfer operator commit`: the batch committer of serving replicas (docs/deploy.md)
app.command("commit")(commit)

NO_CHAIN = "0x0000000000000000000000000000000000000000"


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Operator state directory.")],
    chain_id: Annotated[int, typer.Option(help="Chain id of the receipts' EIP-712 domain.")]
    = 31337,
    challenge_manager: Annotated[str, typer.Option(
        help="ChallengeManager address (the receipts' verifyingContract).")] = NO_CHAIN,
    epochs_file: Annotated[Path | None, typer.Option(
        help="KMS epoch registry (epochs.json). Default: provision a local 2-of-3 KMS in "
             "<dir>/kms.")] = None,
    key_epoch: Annotated[int, typer.Option(help="Key epoch envelopes are sealed to.")] = 1,
    da: Annotated[str, typer.Option(help="Primary DA backend: local | redis.")] = "local",
    redis_url: Annotated[str | None, typer.Option()] = None,
    batch_max_entries: Annotated[int, typer.Option()] = 1024,
    batch_max_age_s: Annotated[float, typer.Option()] = 5.0,
    private_key_env: Annotated[str | None, typer.Option(
        help="Import the operator key from this env var (0x hex) instead of generating one.")]
    = None,
    light_kdf: Annotated[bool, typer.Option(
        help="Cheap keystore KDF (tests, devnets only).")] = False,
    rpc_url: Annotated[str | None, typer.Option(
        help="Chain JSON-RPC URL: batches are committed on chain (needs --deployment).")] = None,
    deployment: Annotated[Path | None, typer.Option(
        help="deployment.json from `verinfer chain deploy` (sets chain id and the "
             "ChallengeManager).")] = None,
    unsafe_dev: Annotated[bool, typer.Option(
        help="Allow a demo set-up: no chain (receipts for chain 31337 with a zero "
             "verifyingContract, batches to a JSONL file) and/or a KMS provisioned in DIR.")]
    = False,
    approve_image_key_env: Annotated[str | None, typer.Option(
        help="Env var with the GOVERNANCE key (0x hex) of a devnet or test chain: approve the "
             "engine fingerprint of the image this command runs in (its digest from the "
             "container runtime, docs/deploy.md) on ProtocolConfig. Run init inside the image "
             "the operator will serve from. Needs --rpc-url and --deployment.")] = None,
) -> None:
    """Create the operator keystore and operator.json (and a local KMS epoch if none given)."""
    if (directory / CONFIG_NAME).exists():
        raise fail(f"{directory / CONFIG_NAME} already exists")
    if da not in ("local", "redis"):
        raise fail("--da must be local or redis")
    if (rpc_url is None) != (deployment is None):
        raise fail("--rpc-url and --deployment go together")
    if approve_image_key_env is not None and deployment is None:
        raise fail("--approve-image-key-env needs --rpc-url and --deployment")
    unsafe = ([] if deployment is not None else
              ["no --deployment: receipts for chain 31337 with a zero verifyingContract, "
               "batches to a JSONL file; nothing on chain can challenge them"]) + \
             ([] if epochs_file is not None else
              ["no --epochs-file: a KMS is provisioned in DIR/kms (seal keys, sealed shares "
               "and the attestation root key in one tree)"])
    if unsafe and not unsafe_dev:
        raise fail("production-unsafe set-up:\n  - " + "\n  - ".join(unsafe)
                   + "\npass --unsafe-dev for a demo or test")
    for reason in unsafe:
        typer.echo(f"WARNING: UNSAFE: {reason}", err=True)
    sink: dict[str, object] = {"kind": "jsonl", "path": "batches.jsonl"}
    if deployment is not None:
        from verinfer.chain.deploy import Deployment

        dep = Deployment.load(deployment)
        chain_id, challenge_manager = dep.chain_id, dep.challenge_manager
        sink = {"kind": "chain", "rpc_url": rpc_url, "deployment": str(deployment.resolve())}
    approved: dict[str, str] = {}
    if approve_image_key_env is not None:  # before anything is written: a refusal leaves none
        assert rpc_url is not None and deployment is not None  # checked above
        approved = _approve_own_image(rpc_url, deployment, approve_image_key_env)
    directory.mkdir(parents=True, exist_ok=True)
    key = (parse_hex_lenient(os.environ[private_key_env], 32, private_key_env) if private_key_env
           else secrets.token_bytes(32))
    password = os.environ.get(PASSWORD_ENV)
    password_file = None
    if password is None:
        password, password_file = secrets.token_urlsafe(24), "keystore.password"
        pw = directory / password_file
        pw.write_text(password + "\n")
        os.chmod(pw, 0o600)
    address = create_keystore(directory / "operator.keystore.json", key, password,
                              light=light_kdf)
    epochs_file_given = epochs_file is not None
    if epochs_file is None:
        from verinfer.kms.local_cluster import provision

        lay = provision(directory / "kms", epoch=key_epoch, threshold=2, shares=3,
                        measurements=[], unsafe_single_tree=True)
        epochs_file = lay.registry
        typer.echo(f"provisioned a local 2-of-3 KMS (epoch {key_epoch}) in {directory / 'kms'}",
                   err=True)
    write_config(directory, {
        "keystore": "operator.keystore.json", "password_file": password_file,
        "chain_id": chain_id, "challenge_manager": challenge_manager,
        "epochs_file": str(epochs_file.resolve()), "key_epoch": key_epoch,
        "outbox": "outbox.sqlite",
        "da": {"backend": da, "local_store": "da", "redis_url": redis_url,
               "redis_prefix": "verinfer:da:", "eigenda_url": None},
        "batch": {"max_entries": batch_max_entries, "max_age_s": batch_max_age_s},
        "sink": sink,
        "kms_provisioned_locally": epochs_file_given is False,
    })
    typer.echo(json.dumps({"operator": address, "config": str(directory / CONFIG_NAME),
                           **approved}))


def _approve_own_image(rpc_url: str, deployment: Path, key_env: str) -> dict[str, str]:
    """Governance approves the engine fingerprint of this process's image (issue 17)."""
    from eth_account import Account

    from verinfer.chain.bindings import TxSender
    from verinfer.chain.deploy import Deployment
    from verinfer.chain.rpc import bounded_web3
    from verinfer.chain.structs import Kind
    from verinfer.engine.fingerprint import local_fingerprint
    from verinfer.errors import VerinferError

    fp = local_fingerprint()
    try:
        key = parse_hex_lenient(os.environ.get(key_env, ""), 32, key_env)
        w3 = bounded_web3(rpc_url)
        gov = Deployment.load(deployment).bind(w3, TxSender(w3, Account.from_key(key)))
        if not gov.config.is_approved(Kind.ENGINE_FINGERPRINT, fp.hash):
            gov.config.approve(Kind.ENGINE_FINGERPRINT, fp.hash)
    except VerinferError as e:
        raise fail(f"approving engine fingerprint {to_hex(fp.hash)}: {e.message}") from e
    return {"engine_fingerprint_hash": to_hex(fp.hash), "container_digest": fp.container_digest}


@app.command()
def status(directory: Annotated[Path, typer.Argument(help="Operator state directory.")]) -> None:
    """Publication status of the operator's outbox (entries and batches per state) and, with
    replicas, of the receipt stream (backlog, lease holder, open and committed batches)."""
    from verinfer.da_client.outbox import Outbox

    cfg = OperatorConfig.load(directory)
    with Outbox(cfg.rel(cfg.outbox)) as ob:
        out = ob.status().to_json()
    if cfg.stream is not None:
        from verinfer.errors import VerinferError
        from verinfer.operator.stream import BoundedRedis, stream_keys, stream_status

        rds = BoundedRedis(cfg.stream.redis_url, deadline_s=cfg.stream.call_deadline_s)
        try:
            out["receipt_stream"] = stream_status(rds, stream_keys(cfg))
        except VerinferError as e:
            raise fail(e) from e
        finally:
            rds.close()
    typer.echo(json.dumps(out, indent=2))


def _chain(directory: Path) -> tuple[Deployment, TxSender]:
    """The operator's deployment and transaction sender (rpc and deployment from its chain
    sink config)."""
    from eth_account import Account

    from verinfer.chain.bindings import TxSender
    from verinfer.chain.deploy import Deployment
    from verinfer.chain.rpc import bounded_web3

    cfg = OperatorConfig.load(directory)
    sink = cfg.sink
    if not isinstance(sink, ChainSink):
        raise fail("this operator has no chain configured (operator init --rpc-url "
                   "--deployment)")
    w3 = bounded_web3(sink.rpc_url)
    sender = TxSender(w3, Account.from_key(cfg.private_key()))
    return Deployment.load(Path(sink.deployment)), sender


def _stake_call(directory: Path, action: str, amount: str | None) -> None:
    from verinfer.chain.cli import parse_ether
    from verinfer.chain.stake import StakeAction, stake_action
    from verinfer.errors import VerinferError

    try:
        deployment, sender = _chain(directory)
        r = stake_action(deployment, sender, StakeAction(action),
                         None if amount is None else parse_ether(amount))
    except VerinferError as e:
        raise fail(e, exit_code=2) from e
    typer.echo(json.dumps({"operator": r.address, "stake_wei": r.account.stake,
                           "unbonding_wei": r.account.unbonding,
                           "unbond_ready_at": r.account.unbond_ready_at}))


DirArg = Annotated[Path, typer.Argument(help="Operator state directory.")]
Amount = Annotated[str, typer.Option(help="ETH amount (exact decimal).")]


@app.command()
def register(directory: DirArg, stake: Amount) -> None:
    """Register this operator on chain, bonding --stake ETH."""
    _stake_call(directory, "register", stake)


@app.command()
def stake(directory: DirArg, amount: Amount) -> None:
    """Add --amount ETH to the operator's bond."""
    _stake_call(directory, "stake", amount)


@app.command()
def unbond(directory: DirArg, amount: Amount) -> None:
    """Start unbonding --amount ETH (withdrawable after the unbonding delay)."""
    _stake_call(directory, "unbond", amount)


@app.command()
def withdraw(directory: DirArg) -> None:
    """Withdraw stake whose unbonding delay has passed."""
    _stake_call(directory, "withdraw", None)
