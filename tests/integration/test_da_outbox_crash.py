"""SIGKILL the process writing to the outbox at a random moment; after a restart every entry it
acknowledged is published exactly once (one manifest, one leaf, ciphertext on DA)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.sinks import read_jsonl_batches
from verinfer.receipts.merkle import verify_proof

N = 500

WRITER = r'''
import hashlib, sys
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Publisher
from verinfer.testing.sample import sample_entry
from verinfer.da_client.sinks import JsonlBatchSink

db, store, sink_file, n, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
ob = Outbox(db)
pub = Publisher(ob, LocalDAClient(store), JsonlBatchSink(sink_file), batch_max_entries=32,
                batch_max_age_s=0.02, put_workers=4).start()
for i in range(n if mode == "first" else 0):  # a restarted operator only publishes
    payload = hashlib.sha256(b"payload %d" % i).digest() * 32
    digest, receipt, payload = sample_entry(payload, issued_at=1_700_000_000 + i)
    ob.enqueue(digest, receipt, payload)   # returns once durable: only then is it acked
    sys.stdout.write(f"acked {i} {digest.hex()}\n")  # one write: a kill cannot split the line
    sys.stdout.flush()
if mode == "resume":
    pub.stop(drain_timeout_s=60)
    st = ob.status()
    print("status", st.pending, st.entries, flush=True)
    sys.exit(0 if st.pending == 0 else 3)
import time
while True:  # the first run never ends on its own: it is killed, perhaps mid-publish
    time.sleep(1)
'''


def _writer(tmp: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp / "outbox.db"), str(tmp / "da"),
         str(tmp / "batches.jsonl"), str(N), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("run", range(2))
def test_sigkill_at_random_moment_loses_and_duplicates_nothing(tmp_path: Path, run: int) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    kill_after = rng.randrange(1, N)  # acks seen before the kill...
    extra_delay = rng.random() * 0.01  # ...plus a little, so the kill lands mid-operation
    ctx = f"seed={seed} kill_after={kill_after}"

    proc = _writer(tmp_path, "first")
    assert proc.stdout is not None
    acked: dict[int, str] = {}
    for line in proc.stdout:
        if line.startswith("acked"):
            _, i, digest = line.split()
            acked[int(i)] = digest
            if len(acked) >= kill_after:
                break
    time.sleep(extra_delay)
    proc.send_signal(signal.SIGKILL)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"{ctx}: writer ended early: {err[-2000:]}"
    # acks printed before the kill but not read yet; only whole lines count (a kill during the
    # print can leave a fragment: that record was durable, and the +1 bound below allows it)
    for line in rest.split("\n")[:-1]:
        if line.startswith("acked "):
            _, i, digest = line.split()
            acked[int(i)] = digest
    assert len(acked) >= kill_after

    resumed = _writer(tmp_path, "resume")  # restart: only the publisher runs, and drains
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, f"{ctx}: restart failed: {out[-1000:]} {err[-2000:]}"

    da = LocalDAClient(tmp_path / "da")
    with Outbox(tmp_path / "outbox.db") as ob:
        st = ob.status()
        stored = sum(st.entries.values())
        # the entry being written at the kill may have committed without its ack printed
        assert len(acked) <= stored <= len(acked) + 1, ctx
        assert st.entries["committed"] == stored and st.pending == 0, ctx
        db_batches = {b.root: b for b in ob.all_batches()}
    sink = read_jsonl_batches(tmp_path / "batches.jsonl")
    sink_roots = [s["batchRoot"] for s in sink]
    assert len(sink_roots) == len(set(sink_roots)) == len(db_batches), ctx  # each batch once
    leaves: dict[str, int] = {}
    for s in sink:
        m = parse_manifest(da.get(Pointer.parse(s["manifest"])))
        assert "0x" + m.root.hex() == s["batchRoot"] and m.leaf_count == s["leafCount"]
        assert m.root in db_batches
        for e in m.entries:
            d = e.signed.digest.hex()
            leaves[d] = leaves.get(d, 0) + 1
            assert verify_proof(e.signed.digest, m.proof(e.signed.digest), m.root)
            assert da.get(e.ciphertext)  # verified against its sha256 by get
    for i, digest in acked.items():
        assert leaves.get(digest) == 1, f"{ctx}: acked entry {i} published {leaves.get(digest)}x"
        payload = hashlib.sha256(b"payload %d" % i).digest() * 32
        assert da.exists(Pointer.for_blob("local", payload))
    assert len(leaves) == stored and set(leaves.values()) == {1}, ctx
