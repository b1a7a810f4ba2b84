"""Options and wiring shared by `verinfer verifier`, `verinfer audit` and `verinfer challenge`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment
from verinfer.chain.keys import load_account
from verinfer.chain.rpc import LOG_CHUNK_BLOCKS, bounded_web3
from verinfer.da_client.factory import DAConfig, DARouter, open_client
from verinfer.errors import VerinferError
from verinfer.verifier.chain_view import ChainView

RPC_OPT = typer.Option("--rpc-url", envvar="VERINFER_CHAIN_RPC", help="Chain JSON-RPC URL.")
DEPLOYMENT_OPT = typer.Option("--deployment", help="deployment.json of the contracts.")
KEYSTORE_OPT = typer.Option("--keystore", help="Keystore file (password in "
                            "$VERINFER_KEYSTORE_PASSWORD); default: $VERINFER_CHAIN_PRIVATE_KEY.")
DA_STORE_OPT = typer.Option("--da-store", help="Local DA store directory.")
REDIS_DA_OPT = typer.Option("--da-redis-url", help="Redis DA backend URL.")
LOG_CHUNK_OPT = typer.Option(
    "--log-chunk-blocks", envvar="VERINFER_LOG_CHUNK_BLOCKS", min=1,
    help="Widest eth_getLogs block range sent to the RPC (set it to your provider's limit).")


@dataclass
class Wiring:
    w3: Web3
    deployment: Deployment
    contracts: Contracts
    view: ChainView
    da: DARouter
    account: LocalAccount | None


def wire(rpc_url: str, deployment: Path, keystore: Path | None, da_store: Path | None,
         da_redis_url: str | None, *, need_account: bool = True,
         log_chunk_blocks: int = LOG_CHUNK_BLOCKS) -> Wiring:
    d = Deployment.load(deployment)
    w3 = bounded_web3(rpc_url)
    account = None
    try:
        account = load_account(keystore)
    except VerinferError:
        if need_account:
            raise
    contracts = d.bind(w3, TxSender(w3, account) if account is not None else None)
    cfg = DAConfig(local_store=str(da_store) if da_store else None, redis_url=da_redis_url)
    clients = [open_client(b, cfg) for b, on in (("local", da_store), ("redis", da_redis_url))
               if on]
    view = ChainView(w3, d, d.bind(w3), log_chunk_blocks=log_chunk_blocks)
    return Wiring(w3, d, contracts, view, DARouter(clients), account)

