"""A waiting request holds no KV cache (issue 32.2): the engine allocates a job's cache when the
scheduler starts it, so memory follows ``max_seqs`` running jobs, never the queue. It used to
allocate prompt + max_tokens positions at ``submit``: 128 queued jobs of one body committed
their caches up front (RSS 882 -> 3,205 MB at --max-context 2048)."""

from __future__ import annotations

from pathlib import Path

from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel
from verinfer.protocol.sampling_params import SamplingParams

JOBS = 300
WINDOW = 2048


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_queued_jobs_allocate_nothing_until_they_run(tiny_loaded: LoadedModel) -> None:
    eng = Engine(tiny_loaded, "invariant", max_seqs=2, max_batch_tokens=48)
    per_job = eng.kv_bytes_per_token() * WINDOW  # 1 MiB for the tiny model
    params = SamplingParams(temperature=0.0, max_tokens=WINDOW - 1, seed=1)
    try:
        eng._lock.acquire()  # the worker blocks in its first forward pass: nothing finishes
        try:
            before = _rss_mb()
            futs = [eng.submit([1], params) for _ in range(JOBS)]
            grown = _rss_mb() - before
            held = eng.kv_bytes
        finally:
            eng._lock.release()
        for f in futs:
            eng.cancel(f)
    finally:
        eng.close()
    # at most max_seqs caches exist (the old engine: all 300, ~300 MiB)
    assert held <= 2 * per_job, held
    assert grown < 0.25 * JOBS * per_job / 2**20, f"RSS grew {grown:.0f} MB for {JOBS} jobs"
