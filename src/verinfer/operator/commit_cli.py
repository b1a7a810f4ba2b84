"""`verinfer operator commit`: the batch committer of serving replicas (issue 37).

Run it (and a standby, the same command elsewhere) next to N `verinfer operator serve`
replicas whose operator.json has a ``stream`` section: the one holding the lease commits every
replica's receipts; the other waits and takes over when the lease lapses. SIGTERM/SIGINT stop
it cleanly (the lease is released, so the standby takes over at once)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from verinfer.cli_errors import fail
from verinfer.errors import VerinferError

if TYPE_CHECKING:  # imported on use: `verinfer operator --help` stays light
    from verinfer.operator.committer import BatchCommitter
    from verinfer.operator.config import OperatorConfig


def commit(
    directory: Annotated[Path, typer.Argument(help="Operator state directory (operator.json "
                                              "with a \"stream\" section).")],
    name: Annotated[str | None, typer.Option(
        help="This committer's name (lease holder, consumer). Default: host name and pid.")]
    = None,
    once: Annotated[bool, typer.Option(
        help="Take the lease, commit everything in the stream now, release and exit.")]
    = False,
) -> None:
    """Commit the receipts every serving replica published, as the operator's one sender
    (a second instance stands by and takes over through the lease in Redis)."""
    from verinfer.operator.config import OperatorConfig

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        committer = build_committer(OperatorConfig.load(directory),
                                    name or f"{socket.gethostname()}:{os.getpid()}")
    except VerinferError as e:
        raise fail(e) from e
    if once:
        _once(committer)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    typer.echo(f"committer {committer.consumer}: operator {committer.operator}, stream "
               f"{committer.keys.stream}", err=True)
    committer.run(stop)


def _once(committer: BatchCommitter) -> None:
    try:
        if not committer.lease.ensure():
            raise fail("another committer holds the lease", exit_code=1)
        total = 0
        while True:
            rep = committer.step(flush=True)
            total += rep.receipts_committed
            if not rep.progressed:
                break
        typer.echo(f'{{"receipts_committed": {total}}}')
    except VerinferError as e:
        raise fail(e) from e
    finally:
        committer.lease.release()


def build_committer(cfg: OperatorConfig, name: str) -> BatchCommitter:
    """The committer of an operator config: its stream, lease, DA and sink."""
    from verinfer.operator.committer import BatchCommitter, Lease, StreamBatchIndex
    from verinfer.operator.config import ChainSink
    from verinfer.operator.publication import open_da, open_sink
    from verinfer.operator.stream import BoundedRedis, stream_keys
    from verinfer.receipts.eip712 import Domain

    keys = stream_keys(cfg)
    sc = cfg.stream
    assert sc is not None
    rds = BoundedRedis(sc.redis_url, deadline_s=sc.call_deadline_s)
    da = open_da(cfg)
    claims = None
    if isinstance(cfg.sink, ChainSink):  # the lease holder answers unpublished claims too
        from verinfer.operator.claims import ClaimResponder

        claims = ClaimResponder.connect(
            cfg.sink.rpc_url, Path(cfg.sink.deployment), private_key=cfg.private_key(),
            outbox=StreamBatchIndex(rds, keys, da),  # type: ignore[arg-type]  # duck-typed
            state_dir=cfg.root)
    return BatchCommitter(
        rds, keys, da, open_sink(cfg), Lease(rds, keys, name, ttl_s=sc.lease_ttl_s),
        domain=Domain(cfg.chain_id, cfg.challenge_manager), consumer=name,
        batch_max_entries=cfg.batch.max_entries, batch_max_age_s=cfg.batch.max_age_s,
        max_buffer_bytes=sc.max_buffer_bytes, claims=claims)
