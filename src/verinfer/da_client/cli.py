"""``verinfer da``: fetch and verify blobs, publish files, inspect and run the outbox."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from verinfer.cli_errors import fail
from verinfer.da_client.base import DAClient
from verinfer.da_client.factory import DAConfig, DARouter, open_client
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import parse_hex_lenient, to_hex

app = typer.Typer(help="Data availability: get/put blobs, batch proofs, the publication outbox.",
                  no_args_is_help=True)

StoreOpt = Annotated[str | None, typer.Option(
    "--store", help="Directory of the local content-addressed store.")]
RedisOpt = Annotated[str | None, typer.Option(
    "--redis-url", help="Redis URL, e.g. redis://127.0.0.1:6379/0.")]
PrefixOpt = Annotated[str, typer.Option("--redis-prefix", help="Redis key prefix.")]
RetentionOpt = Annotated[int, typer.Option(
    "--retention-s", help="Redis key retention in seconds (0 = never expire).")]
EigenOpt = Annotated[str | None, typer.Option(
    "--eigenda-url", help="EigenDA proxy base URL, e.g. http://127.0.0.1:3100.")]
DbOpt = Annotated[Path, typer.Option("--db", help="Outbox SQLite file.")]


def _config(store: str | None, redis_url: str | None, prefix: str, retention_s: int,
            eigenda_url: str | None) -> DAConfig:
    return DAConfig(local_store=store, redis_url=redis_url, redis_prefix=prefix,
                    redis_retention_s=retention_s or None, eigenda_url=eigenda_url)


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except VerinferError as e:
        raise fail(e) from e  # exit 2 for the caller's fault, 1 for a backend's


@app.command()
def get(pointer: Annotated[str, typer.Argument(help="da://<backend>/0x<hex>")],
        out: Annotated[Path | None, typer.Option("--out", help="Write here, not stdout.")] = None,
        store: StoreOpt = None, redis_url: RedisOpt = None,
        redis_prefix: PrefixOpt = "verinfer:da:", eigenda_url: EigenOpt = None) -> None:
    """Fetch a blob, verify it against the pointer, write it to stdout or --out."""
    from verinfer.da_client.pointer import Pointer

    with _errors():
        p = Pointer.parse(pointer)
        client = open_client(p.backend, _config(store, redis_url, redis_prefix, 0, eigenda_url))
        try:
            blob = client.get(p)
        finally:
            client.close()
    if out is None:
        sys.stdout.buffer.write(blob)
        sys.stdout.buffer.flush()
    else:
        out.write_bytes(blob)
        typer.echo(f"{len(blob)} bytes verified -> {out}", err=True)


@app.command()
def check(pointers: Annotated[list[str], typer.Argument(help="Pointers to check.")],
          store: StoreOpt = None, redis_url: RedisOpt = None,
          redis_prefix: PrefixOpt = "verinfer:da:", eigenda_url: EigenOpt = None) -> None:
    """Availability: fetch and verify each pointer; print one JSON line each (size, seconds of
    retention left where the backend expires blobs). Exit 1 if any is missing or bad."""
    from verinfer.da_client.pointer import Pointer
    from verinfer.da_client.redis_backend import RedisDAClient

    cfg = _config(store, redis_url, redis_prefix, 0, eigenda_url)
    clients: dict[str, DAClient] = {}
    bad = 0
    for text in pointers:
        row: dict[str, object] = {"pointer": text}
        try:
            p = Pointer.parse(text)
            client = clients.get(p.backend) or open_client(p.backend, cfg)
            clients[p.backend] = client
            row.update(ok=True, bytes=len(client.get(p)))
            if isinstance(client, RedisDAClient):
                row["retention_left_s"] = client.ttl_s(p)
        except VerinferError as e:
            bad += 1
            row.update(ok=False, error=type(e).__name__, message=e.message)
        typer.echo(json.dumps(row, sort_keys=True))
    for c in clients.values():
        c.close()
    if bad:
        raise typer.Exit(1)


@app.command()
def put(file: Annotated[Path, typer.Argument(help="File to publish.")],
        backend: Annotated[str, typer.Option(help="local | redis | eigenda")] = "local",
        store: StoreOpt = None, redis_url: RedisOpt = None,
        redis_prefix: PrefixOpt = "verinfer:da:", retention_s: RetentionOpt = 14 * 24 * 3600,
        eigenda_url: EigenOpt = None) -> None:
    """Publish a file; prints its pointer."""
    with _errors():
        client = open_client(backend, _config(store, redis_url, redis_prefix, retention_s,
                                              eigenda_url))
        try:
            typer.echo(str(client.put(file.read_bytes())))
        finally:
            client.close()


@app.command()
def status(db: DbOpt, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Outbox counts per state, age of the oldest unpublished entry, the last batch."""
    from verinfer.da_client.outbox import Outbox

    if not db.exists():
        raise fail(f"no outbox at {db}", exit_code=2)
    with _errors(), Outbox(db) as ob:
        st = ob.status()
    if as_json:
        typer.echo(json.dumps(st.to_json(), sort_keys=True))
        return
    typer.echo("entries: " + ", ".join(f"{k}={v}" for k, v in st.entries.items()))
    typer.echo("batches: " + ", ".join(f"{k}={v}" for k, v in st.batches.items()))
    age = st.oldest_unpublished_age_s
    typer.echo("oldest unpublished: " + ("none" if age is None else f"{age:.1f}s"))
    b = st.last_batch
    typer.echo("last batch: " + ("none" if b is None else
                                 f"#{b.id} root 0x{b.root.hex()} leaves={b.leaf_count} "
                                 f"state={b.state} manifest={b.manifest_pointer}"))
    if st.last_error:
        typer.echo(f"last error: {st.last_error}")


@app.command()
def publish(db: DbOpt,
            backend: Annotated[str, typer.Option(help="local | redis | eigenda")] = "local",
            sink_file: Annotated[Path, typer.Option(
                "--sink-file", help="Committed batches are appended here (JSON lines).")
            ] = Path("batches.jsonl"),
            batch_max_entries: Annotated[int, typer.Option()] = 256,
            batch_max_age_s: Annotated[float, typer.Option()] = 2.0,
            timeout_s: Annotated[float, typer.Option(help="Give up after this long.")] = 300.0,
            store: StoreOpt = None, redis_url: RedisOpt = None,
            redis_prefix: PrefixOpt = "verinfer:da:", retention_s: RetentionOpt = 14 * 24 * 3600,
            eigenda_url: EigenOpt = None) -> None:
    """Drain the outbox once: publish, batch, commit to a JSON-lines sink (logging sink)."""
    from verinfer.da_client.outbox import Outbox
    from verinfer.da_client.publisher import Publisher
    from verinfer.da_client.sinks import JsonlBatchSink

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not db.exists():
        raise fail(f"no outbox at {db}", exit_code=2)
    with _errors(), Outbox(db) as ob:
        client = open_client(backend, _config(store, redis_url, redis_prefix, retention_s,
                                              eigenda_url))
        pub = Publisher(ob, client, JsonlBatchSink(sink_file),
                        batch_max_entries=batch_max_entries, batch_max_age_s=batch_max_age_s)
        try:
            ok = pub.drain(timeout_s)
        finally:
            pub.close()
            client.close()
        st = ob.status()
    typer.echo(json.dumps(st.to_json(), sort_keys=True))
    if not ok:
        raise fail(f"outbox not drained within {timeout_s}s: {st.last_error}", exit_code=1)


@app.command()
def proof(manifest: Annotated[str, typer.Argument(help="DA pointer of the batch manifest.")],
          receipt_digest: Annotated[str, typer.Argument(help="0x + 64 hex digits.")],
          store: StoreOpt = None, redis_url: RedisOpt = None,
          redis_prefix: PrefixOpt = "verinfer:da:", eigenda_url: EigenOpt = None) -> None:
    """Fetch a manifest, check it, print one receipt's Merkle inclusion proof as JSON."""
    from verinfer.da_client.manifest import parse_manifest
    from verinfer.da_client.pointer import Pointer

    with _errors():
        p = Pointer.parse(manifest)
        cfg = _config(store, redis_url, redis_prefix, 0, eigenda_url)
        router = DARouter([open_client(p.backend, cfg)])
        try:
            m = parse_manifest(router.get(p))
        finally:
            router.close()
        digest = parse_hex_lenient(receipt_digest, 32, "receipt digest")
        pr = m.proof(digest)
        entry = m.entries[pr.index]
    typer.echo(json.dumps({"batchRoot": to_hex(m.root), "proof": pr.to_json(),
                           "ciphertext": str(entry.ciphertext),
                           "receipt": entry.signed.receipt.to_json(),
                           "signature": to_hex(entry.signed.signature)}, sort_keys=True))
