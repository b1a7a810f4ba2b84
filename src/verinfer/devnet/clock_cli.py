"""`verinfer devnet challenge` and `verinfer devnet mine-draws`: the commands that move anvil's
clock (verinfer.testing.chain_clock), which no service carries. devnet/cli.py hands them their
arguments; they live apart because what they import (the challenger, web3) is heavy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from verinfer.testing.chain_clock import TimeTravelChallenger, run_draw_miner
from verinfer.verifier.challenge_cli import open_command
from verinfer.verifier.cli_common import DEPLOYMENT_OPT, RPC_OPT, wire

app = typer.Typer(no_args_is_help=True)

app.command("challenge", help=(
    "`verinfer challenge` on the devnet's anvil: mines to the draw block, passes a claim's "
    "deadline at once and skips a voting phase that stalls (anvil only; the service's "
    "`verinfer challenge` waits for a real chain)."))(open_command(TimeTravelChallenger))


@app.command("mine-draws")
def mine_draws(
    rpc_url: Annotated[str, RPC_OPT] = "http://127.0.0.1:8545",
    deployment: Annotated[Path, DEPLOYMENT_OPT] = Path("deployment.json"),
    interval_s: Annotated[float, typer.Option()] = 0.25,
) -> None:
    """Mine anvil past each challenge's draw block, until stopped (`devnet up` runs it: its
    verifiers only wait for blocks, and anvil mines only on transactions)."""
    w = wire(rpc_url, deployment, None, None, None, need_account=False)
    run_draw_miner(w.view, w.contracts, interval_s=interval_s)
