"""`verinfer challenge <receipt-id | DA pointer | receipt file>` and
`verinfer challenge status <id>`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from verinfer.chain.structs import is_future_dated
from verinfer.cli_errors import fail
from verinfer.errors import VerinferError
from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S
from verinfer.verifier.challenger import Challenger, locate
from verinfer.verifier.cli_common import (
    DA_STORE_OPT,
    DEPLOYMENT_OPT,
    KEYSTORE_OPT,
    REDIS_DA_OPT,
    RPC_OPT,
    wire,
)


class _DefaultToOpen(TyperGroup):
    """`verinfer challenge <ref>` means `verinfer challenge open <ref>`."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands:
            args = ["open", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(help="Open a full challenge (or an unpublished claim) and follow it.",
                  cls=_DefaultToOpen, no_args_is_help=True)
console = Console(stderr=True)


def _when(unix_s: int) -> str:
    """A chain deadline as a person reads it: the date in UTC, then the unix seconds."""
    if not unix_s:
        return "not set yet (0)"
    return (datetime.fromtimestamp(unix_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            + f" ({unix_s})")


def _table(st: dict[str, Any]) -> Table:
    """A status whole: hashes and addresses are never cut (they fold), deadlines are dates."""
    t = Table(title=f"{st['kind']} {st['id']}", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in st.items():
        if k in ("kind", "id"):
            continue
        if k.endswith("Deadline") and isinstance(v, int):
            t.add_row(k, _when(v))
        else:
            t.add_row(k, ", ".join(v) if isinstance(v, list) else str(v))
    return t


@app.command("status")
def status(
    ident: Annotated[int, typer.Argument(help="Challenge (or, with --claim, claim) id.")],
    rpc_url: Annotated[str, RPC_OPT] = "http://127.0.0.1:8545",
    deployment: Annotated[Path, DEPLOYMENT_OPT] = Path("deployment.json"),
    claim: Annotated[bool, typer.Option(help="An unpublished claim id.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show a challenge's (or claim's) status."""
    try:
        w = wire(rpc_url, deployment, None, None, None, need_account=False)
        st = Challenger(w.view, w.contracts, w.da).status("claim" if claim else "challenge",
                                                         ident)
        typer.echo(json.dumps(st)) if as_json else console.print(_table(st))
    except VerinferError as e:
        raise fail(e) from e


def open_command(make_challenger: Callable[..., Challenger] = Challenger) -> Callable[..., None]:
    """The `open` command over challengers that ``make_challenger(view, contracts, da)``
    builds: this CLI's on a real chain; `verinfer devnet challenge` passes one that moves
    anvil's clock (verinfer.testing.chain_clock), which no service carries."""

    def challenge(
        ref: Annotated[str, typer.Argument(
            help="Receipt id (0x…32 bytes), DA pointer, or a JSON file: an API response, its "
                 "`verification` object, a signed receipt or a manifest entry.")],
        rpc_url: Annotated[str, RPC_OPT] = "http://127.0.0.1:8545",
        deployment: Annotated[Path, DEPLOYMENT_OPT] = Path("deployment.json"),
        keystore: Annotated[Path | None, KEYSTORE_OPT] = None,
        da_store: Annotated[Path | None, DA_STORE_OPT] = None,
        da_redis_url: Annotated[str | None, REDIS_DA_OPT] = None,
        wait: Annotated[bool, typer.Option(help="Follow the challenge to its resolution.")] = True,
        timeout_s: Annotated[float, typer.Option()] = 600.0,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Challenge a receipt, or show a challenge's status."""
        try:
            w = wire(rpc_url, deployment, keystore, da_store, da_redis_url)
            ch = make_challenger(w.view, w.contracts, w.da)
            with console.status("locating the receipt in committed batches…"):
                loc = locate(w.view, w.da, ref)
            _, chain_now = w.view.head()
            if is_future_dated(loc.signed.receipt.issued_at, chain_now):
                # what a client check refuses on receipt (issuedAt skew); the chain slashes it
                console.print(f"receipt issuedAt {loc.signed.receipt.issued_at} is more than "
                            f"{MAX_ISSUED_AT_SKEW_S} s after chain time {chain_now}: invalid on "
                            "its face, claimed at once (no publication deadline to wait for)")
            kind, cid = ch.open(loc)
            console.print(f"opened {kind} {cid} for receipt 0x{loc.signed.digest.hex()}")
            if kind == "claim":
                if wait:
                    with console.status("waiting for the operator's response period…"):
                        console.print(f"claim {cid}: {ch.settle_claim(cid).name.lower()}")
                st = ch.status("claim", cid)
            else:
                if wait:
                    seen: list[str] = []

                    def progress(s: dict[str, Any]) -> None:
                        # a line per change: a spinner shows nothing in a log or a pipe
                        line = (f"challenge {cid}: {s['status']}, {s['commits']}/"
                                f"{s['members']} committed, {s['reveals']}/{s['members']} "
                                "revealed")
                        if not seen or seen[-1] != line:
                            seen.append(line)
                            console.print(line)

                    ch.wait(cid, timeout_s=timeout_s, on_update=progress)
                st = ch.status("challenge", cid)
            typer.echo(json.dumps(st)) if as_json else console.print(_table(st))
        except VerinferError as e:
            raise fail(e) from e

    return challenge


app.command("open")(open_command())
