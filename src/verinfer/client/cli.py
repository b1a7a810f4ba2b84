"""`verinfer client watch` (follow the kept receipts: batch, DA, window; claim a missed
deadline), `verinfer client add` (keep receipts from files) and `verinfer client status`
(progress from the store, no chain needed)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from verinfer.chain.deploy import Deployment
from verinfer.chain.keys import load_account
from verinfer.cli_errors import fail
from verinfer.client.keeper import Keeper, KeeperPolicy, KeeperStatus, status_of
from verinfer.client.receipt_store import TERMINAL, ReceiptStore, State, default_path
from verinfer.da_client.factory import DAConfig, DARouter, open_client
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Domain
from verinfer.verifier.challenger import read_ref_file, signed_from_json

app = typer.Typer(help="Verified client: follow the receipts it kept (watch), keep more "
                  "(add), show their progress (status).", no_args_is_help=True)

RECEIPTS_OPT = typer.Option("--receipts", envvar="VERINFER_RECEIPTS",
                            help="The receipt store (SQLite); default: receipts.sqlite in the "
                            "user's data directory.")


@app.command("watch")
def watch(
    receipts: Annotated[Path | None, RECEIPTS_OPT] = None,
    rpc_url: Annotated[str, typer.Option("--rpc-url", envvar="VERINFER_CHAIN_RPC",
                                         help="Chain JSON-RPC URL.")] = "http://127.0.0.1:8545",
    deployment: Annotated[Path, typer.Option("--deployment", help="deployment.json of the "
                                             "contracts.")] = Path("deployment.json"),
    da_store: Annotated[Path | None, typer.Option("--da-store",
                                                  help="Local DA store directory.")] = None,
    da_redis_url: Annotated[str | None, typer.Option("--da-redis-url",
                                                     help="Redis DA backend URL.")] = None,
    eigenda_url: Annotated[str | None, typer.Option("--eigenda-url",
                                                    help="EigenDA proxy URL.")] = None,
    keystore: Annotated[Path | None, typer.Option(
        "--keystore", help="The account that files claims and pays their bond (password in "
        "$VERINFER_KEYSTORE_PASSWORD); default: $VERINFER_CHAIN_PRIVATE_KEY.")] = None,
    watch_only: Annotated[bool, typer.Option("--watch-only", help="File no claims: a missed "
                                             "deadline ends the receipt 'late'.")] = False,
    poll_s: Annotated[float, typer.Option(help="Seconds between steps.")] = 5.0,
    da_grace_s: Annotated[int, typer.Option(help="Seconds after the publication deadline "
                                            "the ciphertext may take to reach DA.")] = 600,
    rpc_deadline_s: Annotated[float, typer.Option(help="Whole-call deadline of a chain "
                                                  "read.")] = 20.0,
    once: Annotated[bool, typer.Option("--once", help="One step, then exit.")] = False,
    until_settled: Annotated[bool, typer.Option(
        "--until-settled", help="Exit once no receipt is in flight.")] = False,
    timeout_s: Annotated[float | None, typer.Option(help="Exit (code 1) after this long.")
                         ] = None,
) -> None:
    """Follow every kept receipt: pending -> batched -> available -> final; file the
    unpublished claim when a publication deadline passes unmet (the challenge bond is paid
    from the account) and resolve it after the response period."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        account = None if watch_only else load_account(keystore)
        cfg = DAConfig(local_store=str(da_store) if da_store else None, redis_url=da_redis_url,
                       eigenda_url=eigenda_url)
        clients = [open_client(b, cfg) for b, on in (("local", da_store),
                                                     ("redis", da_redis_url),
                                                     ("eigenda", eigenda_url)) if on]
        if not clients:
            raise typer.BadParameter("name the DA the operator publishes to (--da-store, "
                                     "--da-redis-url or --eigenda-url)")
        store = ReceiptStore(receipts or default_path())
        policy = KeeperPolicy(file_claims=not watch_only, poll_s=poll_s, da_grace_s=da_grace_s,
                              rpc_deadline_s=rpc_deadline_s)
        keeper = Keeper.connect(store, rpc_url, deployment, DARouter(clients), account=account,
                                policy=policy)
    except VerinferError as e:
        raise fail(e) from e
    start = time.monotonic()
    last: dict[str, int] = {}

    def settled() -> bool:
        counts = store.counts()
        shown = {str(s): n for s, n in counts.items() if n}
        nonlocal last
        if shown != last:
            typer.echo(json.dumps({"counts": shown}), err=True)
            last = shown
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return True
        return until_settled and not any(n for s, n in counts.items() if s not in TERMINAL)

    if once:
        try:
            rep = keeper.step()
        except VerinferError as e:
            raise fail(e) from e
        typer.echo(json.dumps(rep.__dict__))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            keeper.run(until=settled)
    _print(status_of(store), as_json=True)
    if timeout_s is not None and time.monotonic() - start > timeout_s and until_settled:
        raise typer.Exit(1)


@app.command("add")
def add(
    refs: Annotated[list[Path], typer.Argument(help="Files holding an API response, its "
                                               "verification object or a signed receipt.")],
    receipts: Annotated[Path | None, RECEIPTS_OPT] = None,
    deployment: Annotated[Path, typer.Option("--deployment", help="deployment.json of the "
                                             "contracts.")] = Path("deployment.json"),
) -> None:
    """Keep receipts obtained without the Python client (a saved response, a JS app's): each
    must be signed for this deployment by its operator; `watch` follows them."""
    try:
        dep = Deployment.load(deployment)
        domain = Domain(dep.chain_id, dep.challenge_manager)
        signed = [signed_from_json(read_ref_file(str(r)), domain) for r in refs]
        with ReceiptStore(receipts or default_path()) as store:
            store.bind_deployment(dep.chain_id, dep.challenge_manager)
            new = sum(store.add(s, note="added by 'verinfer client add'") for s in signed)
    except VerinferError as e:
        raise fail(e) from e
    typer.echo(json.dumps({"added": new, "already_kept": len(signed) - new,
                           "receipts": [to_hex(s.digest) for s in signed]}))


@app.command("status")
def status(
    receipts: Annotated[Path | None, RECEIPTS_OPT] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Progress of the kept receipts: how many in each state, the next deadline, failures."""
    path = receipts or default_path()
    if not path.exists():
        raise fail(f"no receipt store at {path}")
    try:
        with ReceiptStore(path) as store:
            _print(status_of(store), as_json=as_json)
    except VerinferError as e:
        raise fail(e) from e


def _print(st: KeeperStatus, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(st.to_json(), sort_keys=True))
        return
    typer.echo(f"receipts in {st.path}")
    for state, n in st.counts.items():
        typer.echo(f"  {state:<12} {n}")
    if st.next_deadline is not None:
        nd = st.next_deadline
        typer.echo(f"next deadline: {nd['deadline']} (chain time) for {nd['receipt']} "
                   f"({nd['state']})")
    elif any(n for state, n in st.counts.items() if State(state) not in TERMINAL):
        typer.echo("next deadline: not known yet (no keeper step since these were added)")
    else:
        typer.echo("next deadline: none (nothing in flight)")
    if st.failures:
        typer.echo("failures:")
        for f in st.failures:
            what = f.get("receipt") or f"batch {f.get('batch')}"
            typer.echo(f"  {what}: {f.get('state', '')} {f.get('note') or ''} "
                       f"{f.get('error') or ''}".rstrip())
