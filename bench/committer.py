"""Batch committer benchmark (issue 37): how many receipts per second `verinfer operator
commit` takes from the serving replicas' Redis receipt stream into committed batches.

Usage: .venv/bin/python bench/committer.py [--quick] [--receipts N] [--replicas 3]
           [--batch 1024] [--no-verify]

Needs Redis on 127.0.0.1:6379 (scripts/ensure-redis; a unique key prefix, deleted afterwards).
``--replicas`` publisher processes (the serving replicas; each signs its receipts before the
clock starts, 4 KB ciphertexts, one to three receipts per publish as a response's choices)
publish while the committer runs: the real BatchCommitter (lease, consumer group, per-entry
checks including the signature, ciphertexts and manifests to a local DA store, the decide
and finish scripts) with an in-memory batch sink in place of the chain (one transaction per
batch of ``--batch`` receipts: at 1,024 per batch the chain is not what limits it).

``committer_receipts_per_s`` = receipts / (first publish -> last receipt in a committed batch).
``committer_receipts_per_cpu_s`` = receipts / the committer process's CPU seconds over the
same span (its threads included; the replicas are other processes): what one core would
sustain, whatever else the machine runs.
``publish_per_s``: the replicas' publishes (one Lua call each) per second, all together.
``load_avg_1m``: the machine's load when it ended (a shared machine's numbers vary with it).
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from verinfer.da_client.local import LocalDAClient
from verinfer.operator.committer import BatchCommitter, Lease
from verinfer.operator.stream import BoundedRedis, ReceiptStream, StreamKeys
from verinfer.receipts.eip712 import Domain
from verinfer.testing.sample import UNSAFE_SAMPLE_KEY, sample_signed_receipt
from verinfer.testing.sinks import InMemoryBatchSink

URL = "redis://127.0.0.1:6379/0"
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
TARGET = 2000


def _signed(n: int, tag: str) -> list[list[tuple[bytes, bytes]]]:
    """n receipts in publishes of 1-3 (a response's choices), 4 KB ciphertexts."""
    out: list[list[tuple[bytes, bytes]]] = []
    i = 0
    while i < n:
        k = min(n - i, 1 + len(out) % 3)
        group = []
        for _ in range(k):
            blob = f"{tag}:{i}:".encode() + os.urandom(4096 - 32)
            s = sample_signed_receipt(blob, key=UNSAFE_SAMPLE_KEY, domain=DOMAIN)
            group.append((s.to_bytes(), blob))
            i += 1
        out.append(group)
    return out


def _replica(i: int, n: int, keys: StreamKeys, max_backlog: int, ready: Any, go: Any,
             out: Any) -> None:
    """One serving replica (its own process): sign n receipts, wait for the start, publish."""
    groups = _signed(n, f"r{i}")
    stream = ReceiptStream(BoundedRedis(URL, deadline_s=5.0), keys, replica=f"r{i}",
                           max_backlog=max_backlog)
    ready.release()
    go.wait()
    t = time.perf_counter()
    for group in groups:
        stream.publish(group)
    out.put((len(groups), time.perf_counter() - t))


def run(receipts: int, replicas: int, batch: int, verify: bool) -> dict[str, Any]:
    operator = sample_signed_receipt(b"x", domain=DOMAIN).receipt.operator
    keys = StreamKeys(f"verinfer:bench:{uuid.uuid4().hex}:", operator)
    rds = BoundedRedis(URL, deadline_s=5.0)
    sink = InMemoryBatchSink()
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_replica, args=(
        i, receipts // replicas + (i < receipts % replicas), keys, 10 * receipts, ready, go,
        out)) for i in range(replicas)]
    with tempfile.TemporaryDirectory(prefix="verinfer-committer-bench-") as d:
        committer = BatchCommitter(
            rds, keys, LocalDAClient(Path(d) / "da"), sink, Lease(rds, keys, "bench", ttl_s=30),
            domain=DOMAIN, consumer="bench", batch_max_entries=batch, batch_max_age_s=0.5,
            verify_signatures=verify)
        assert committer.lease.ensure()
        committer.step()  # the group exists before anyone publishes
        for p in procs:
            p.start()
        for _ in procs:
            ready.acquire()  # every replica has signed its receipts
        t0, cpu0 = time.perf_counter(), time.process_time()
        go.set()
        done = batches = 0
        while done < receipts:
            rep = committer.step(flush=not any(p.is_alive() for p in procs))
            done += rep.receipts_committed
            batches += rep.batches_committed
            if time.perf_counter() - t0 > 600:
                raise SystemExit(f"only {done} of {receipts} committed in 600 s")
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        published = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        committer.lease.release()
    r = redis.Redis.from_url(URL)
    left = list(r.scan_iter(match=keys.prefix + "*"))
    if left:
        r.delete(*left)
    r.close()
    rds.close()
    assert len(sink.batches) == batches and sum(b.leaf_count for b in sink.batches) == receipts
    return {"committer_receipts_per_s": receipts / elapsed,
            "committer_receipts_per_cpu_s": receipts / cpu, "committer_cpu_s": cpu,
            "receipts": receipts,
            "replicas": replicas, "batches": batches, "batch_max_entries": batch,
            "verify_signatures": verify, "elapsed_s": elapsed,
            "publish_per_s": sum(n for n, _ in published) / max(s for _, s in published),
            "committer_target_receipts_per_s": TARGET, "machine_cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--receipts", type=int, default=None)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()
    try:
        redis.Redis.from_url(URL, socket_connect_timeout=2).ping()
    except redis.RedisError as e:
        raise SystemExit(f"no Redis at {URL} (scripts/ensure-redis): {e}") from None
    n = args.receipts or (600 if args.quick else 10_000)
    result = run(n, args.replicas, min(args.batch, 256) if args.quick else args.batch,
                 not args.no_verify)
    print(json.dumps(result), file=sys.stderr)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
