"""DA client and outbox benchmark.

Usage: .venv/bin/python bench/da.py [--quick] [--entries N]

Per backend and blob size (4 KB, 256 KB): put/get latency p50/p99 (ms) and throughput.
Backends: local (SQLite, synchronous=FULL, one fsync per put), redis (127.0.0.1:6379; skipped
if down; unique key prefix, deleted afterwards), eigenda against the LOOPBACK FAKE PROXY
(verinfer.testing.eigenda_fake_proxy: the proxy's HTTP routes, no EigenDA network, no KZG), so
its numbers measure only our client + HTTP on loopback, not EigenDA.
Outbox: 16 producer threads (the concurrent requests of `verinfer serve`) enqueue pre-signed 4 KB
entries (receipt signing excluded; reported separately) (SQLite WAL, synchronous=FULL) while
the publisher uploads to the local store, batches (256/batch) and commits to an in-memory sink;
``outbox_entries_per_s`` = entries / (first enqueue -> last entry committed). Target >= 1000/s.
``outbox_serial_*``: one producer alone, each enqueue its own fsync (group commit cannot help).
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verinfer.da_client.base import DAClient
from verinfer.da_client.eigenda import EigenDAProxyClient
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Publisher
from verinfer.testing.eigenda_fake_proxy import FakeEigenDAProxy
from verinfer.testing.sample import sample_entry
from verinfer.testing.sinks import InMemoryBatchSink

SIZES = {"4KB": 4096, "256KB": 256 * 1024}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def bench_backend(client: DAClient, ops: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, size in SIZES.items():
        n = ops[label]
        blobs = [os.urandom(size) for _ in range(n)]
        put_ms, get_ms = [], []
        pointers = []
        t0 = time.perf_counter()
        for b in blobs:
            t = time.perf_counter()
            pointers.append(client.put(b))
            put_ms.append((time.perf_counter() - t) * 1e3)
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for p in pointers:
            t = time.perf_counter()
            client.get(p)
            get_ms.append((time.perf_counter() - t) * 1e3)
        get_s = time.perf_counter() - t0
        out[label] = {
            "n": n,
            "put_p50_ms": round(statistics.median(put_ms), 3),
            "put_p99_ms": round(_pct(put_ms, 0.99), 3),
            "get_p50_ms": round(statistics.median(get_ms), 3),
            "get_p99_ms": round(_pct(get_ms, 0.99), 3),
            "put_per_s": round(n / put_s, 1),
            "get_per_s": round(n / get_s, 1),
            "put_MB_per_s": round(n * size / put_s / 1e6, 2),
            "get_MB_per_s": round(n * size / get_s / 1e6, 2),
        }
    # headline keys: the 4 KB numbers (the size of a typical ciphertext envelope)
    for k in ("put_p50_ms", "put_p99_ms", "get_p50_ms", "get_p99_ms"):
        out[k] = out["4KB"][k]
    out["headline_size"] = "4KB"
    return out


def bench_outbox(tmp: Path, entries: int, producers: int) -> dict[str, Any]:
    t = time.perf_counter()
    items = [sample_entry(os.urandom(4096)) for _ in range(entries)]
    sign_s = time.perf_counter() - t
    sink = InMemoryBatchSink()
    ob = Outbox(tmp / "outbox.db")
    pub = Publisher(ob, LocalDAClient(tmp / "outbox-da"), sink, batch_max_entries=256,
                    batch_max_age_s=0.05, put_workers=4, step_entries=1024).start()
    chunks = [items[i::producers] for i in range(producers)]
    enq_ms: list[float] = []
    lock = threading.Lock()

    def produce(chunk: list[tuple[bytes, bytes, bytes]]) -> None:
        local = []
        for e in chunk:
            t1 = time.perf_counter()
            ob.enqueue(*e)
            local.append((time.perf_counter() - t1) * 1e3)
        with lock:
            enq_ms.extend(local)

    threads = [threading.Thread(target=produce, args=(c,)) for c in chunks]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    enqueued_s = time.perf_counter() - t0
    while ob.pending_count():
        time.sleep(0.002)
    total_s = time.perf_counter() - t0
    pub.close()
    st = ob.status()
    ob.close()
    assert st.entries["committed"] == entries, st
    return {
        "outbox_entries_per_s": round(entries / total_s, 1),
        "outbox_enqueue_per_s": round(entries / enqueued_s, 1),
        "outbox_enqueue_p50_ms": round(statistics.median(enq_ms), 3),
        "outbox_enqueue_p99_ms": round(_pct(enq_ms, 0.99), 3),
        "outbox_entries": entries,
        "outbox_producers": producers,
        "outbox_batches": len(sink.batches),
        "outbox_entry_bytes": 4096,
        "receipt_signing_per_s_excluded": round(entries / sign_s, 1),
    }


def bench_serial_enqueue(tmp: Path, n: int) -> dict[str, Any]:
    """One producer, no publisher: every enqueue pays its own fsync (the worst case)."""
    items = [sample_entry(os.urandom(4096)) for _ in range(n)]
    with Outbox(tmp / "serial.db") as ob:
        t0 = time.perf_counter()
        for e in items:
            ob.enqueue(*e)
        dt = time.perf_counter() - t0
    return {"outbox_serial_enqueue_per_s": round(n / dt, 1),
            "outbox_serial_enqueue_mean_ms": round(dt / n * 1e3, 3)}


def _redis_client() -> tuple[DAClient | None, Callable[[], None]]:
    import redis

    from verinfer.da_client.redis_backend import RedisDAClient

    url = "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        return None, lambda: None
    prefix = f"verinfer:bench:{uuid.uuid4().hex}:"
    client = RedisDAClient(url, prefix=prefix, retention_s=600)

    def cleanup() -> None:
        r = redis.Redis.from_url(url)
        keys = list(r.scan_iter(match=prefix + "*"))
        if keys:
            r.delete(*keys)
        client.close()

    return client, cleanup


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--entries", type=int, default=None)
    # 16 concurrent producers = the in-flight requests of `verinfer serve` (--max-seqs 16)
    ap.add_argument("--producers", type=int, default=16)
    args = ap.parse_args()
    ops = {"4KB": 100, "256KB": 30} if args.quick else {"4KB": 500, "256KB": 100}
    entries = args.entries or (1000 if args.quick else 5000)
    result: dict[str, Any] = {"machine_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="verinfer-da-bench-") as d:
        tmp = Path(d)
        # first, before the other phases leave dirty pages that slow every fsync down
        result.update(bench_serial_enqueue(tmp, 200 if args.quick else 500))
        local = LocalDAClient(tmp / "local")
        result["local"] = bench_backend(local, ops)
        print("local", json.dumps(result["local"]), file=sys.stderr)
        rc, cleanup = _redis_client()
        try:
            result["redis"] = bench_backend(rc, ops) if rc else {"skipped": "no redis"}
        finally:
            cleanup()
        print("redis", json.dumps(result["redis"]), file=sys.stderr)
        with FakeEigenDAProxy() as proxy:
            ec = EigenDAProxyClient(proxy.url)
            result["eigenda"] = {
                **bench_backend(ec, ops),
                "measured_against": "LOOPBACK FAKE PROXY (eigenda-proxy routes on 127.0.0.1; "
                                    "no EigenDA dispersal, no KZG): client + HTTP cost only"}
            ec.close()
        print("eigenda", json.dumps(result["eigenda"]), file=sys.stderr)
        result.update(bench_outbox(tmp, entries, args.producers))
    result["outbox_target_entries_per_s"] = 1000
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
