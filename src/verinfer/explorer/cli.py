"""`verinfer explorer`: the web UI over a deployment (read-only: it holds no key)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The explorer: receipts, batches, challenges, votes and slashes in the "
                  "browser.")


@app.command()
def explorer(
    rpc_url: Annotated[str, typer.Option("--rpc-url", envvar="VERINFER_CHAIN_RPC",
                                         help="Chain JSON-RPC URL.")] = "http://127.0.0.1:8545",
    deployment: Annotated[Path, typer.Option(help="deployment.json of the contracts.")]
    = Path("deployment.json"),
    da_store: Annotated[Path | None, typer.Option(help="Local DA store directory.")] = None,
    da_redis_url: Annotated[str | None, typer.Option(help="Redis DA backend URL.")] = None,
    redis_url: Annotated[str | None, typer.Option(
        help="Redis holding the light-audit report stream.")] = None,
    audit_prefix: Annotated[str, typer.Option(
        help="Key prefix of the audit streams (the devnet's `redis_prefix`).")] = "",
    kms: Annotated[list[str] | None, typer.Option(
        help="A KMS shard URL (repeat for each shard).")] = None,
    operator: Annotated[list[str] | None, typer.Option(
        help="An operator's API URL to watch (repeat).")] = None,
    model_names: Annotated[Path | None, typer.Option(
        help="The deployment's model list: a JSON object name -> 0x model id (names for the "
        "model ids approved on chain; without it, names come from the --operator endpoints)."
    )] = None,
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port.")] = 8600,
) -> None:
    """Serve the explorer (pages, /api/..., live updates) until interrupted."""
    from verinfer.cli_errors import fail
    from verinfer.errors import VerinferError
    from verinfer.explorer.server import Explorer, ExplorerConfig
    from verinfer.httpserve import ServeLimits, serve_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe otherwise
    try:
        ex = Explorer(ExplorerConfig(rpc_url, deployment, da_store, da_redis_url, redis_url,
                                     audit_prefix, list(kms or []), list(operator or []),
                                     model_names))
    except VerinferError as e:  # documented as exit 2: the explorer's options cannot be used
        raise fail(e, exit_code=2) from e
    ex.start()
    try:
        # verinfer.httpserve: header deadline, keep-alive, connections in total and per client
        # address (the explorer reads no request body: GET only)
        serve_app(ex.app, host, port, ServeLimits(max_body_bytes=64 * 1024), access_log=False)
    finally:
        ex.stop()
