"""Attack on the batch committer through the size of the stream's entries.

The committer promises to hold at most ``max_buffer_bytes`` of ciphertext, but it read the
stream with ``XREADGROUP COUNT <room in the batch>`` (up to ``batch_max_entries``, 1,024): one
reply carried every entry up to that count whatever their size, checked against the byte
budget only before the read. Each entry is a DA blob of up to 32 MiB, and one request makes many
big ones (each choice's blob seals the request body and the whole response: a 4 MiB body with
16 prompts and n = 8 is 128 entries of 4 MiB each, for 128 tokens of compute). A user who sends
a few such requests puts gigabytes in the stream; the committer's next read asks Redis for all
of it in one reply under a 2 s call deadline: it runs out of memory, or the read times out, the
step fails, and the retry reads the same entries again — the committer is wedged, no batch is
committed, and every receipt the operator signs meanwhile misses its deadline (a claim each
against the operator).

Here (a real Redis, real signed receipts, the real committer): 16 entries of 256 KiB against a
1 MiB budget. Now a read asks for no more entries than the budget left holds at the largest
entry size (at least one), and its deadline grows with the bytes it may carry: the buffer never
holds more than the budget plus one entry."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.sinks import JsonlBatchSink
from verinfer.operator.committer import BatchCommitter, Lease
from verinfer.operator.evidence import ReceiptIssuer
from verinfer.operator.stream import BoundedRedis, ReceiptStream, StreamKeys
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair

pytestmark = [pytest.mark.redis, pytest.mark.loopback]

SHARED = "redis://127.0.0.1:6379/0"
VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "exec_requests.json"
SIGNER = ReceiptSigner(hashlib.sha256(b"committer read budget operator").digest())
DOMAIN = Domain(31337, "0x" + "11" * 20)
ENTRY = 256 * 1024
BUDGET = 1024 * 1024


@pytest.fixture
def keys() -> Iterator[StreamKeys]:
    k = StreamKeys(f"verinfer:test:{uuid.uuid4().hex}:", SIGNER.address)
    yield k
    r = redis.Redis.from_url(SHARED)
    found = list(r.scan_iter(match=k.prefix + "*"))
    if found:
        r.delete(*found)
    r.close()


def test_committer_reads_past_its_byte_budget_in_one_call(keys: StreamKeys,
                                                          tmp_path: Path) -> None:
    v = json.loads(VECTORS.read_text(encoding="utf-8"))
    request = ExecRequest.from_json(v["exec_requests"][0]["json"])
    result = ExecResult.from_json(v["exec_results"][0]["json"])
    _, pk = derive_epoch_keypair(hashlib.sha256(b"read budget epoch").digest(),
                                 EnvelopeSuite.X25519)
    issuer = ReceiptIssuer(SIGNER, DOMAIN, 1, pk)
    items = []
    for _ in range(16):  # each blob ~256 KiB (the response body), each receipt its own digest
        signed, blob = issuer.issue(request, result, b'{"prompt": "hi"}', b"x" * ENTRY)
        items.append((signed.to_bytes(), blob))
    rds = BoundedRedis(SHARED, deadline_s=2.0)
    try:
        ReceiptStream(rds, keys, replica="r1").publish(items)
        # the largest entry this DA takes: 512 KiB, so the 1 MiB budget holds two
        da = LocalDAClient(tmp_path / "da", max_blob_bytes=2 * ENTRY)
        c = BatchCommitter(rds, keys, da, JsonlBatchSink(tmp_path / "batches.jsonl"),
                           Lease(rds, keys, "A", ttl_s=10.0), domain=DOMAIN, consumer="A",
                           batch_max_entries=1024, batch_max_age_s=3600,
                           max_buffer_bytes=BUDGET)
        # a step reads until the buffer holds its budget (then the batch is due): before, one
        # read took all 16 entries (4 MiB against the 1 MiB budget) into one batch
        most = BUDGET // ENTRY + 2  # the budget, plus at most one read of the largest entries
        reads = []
        for _ in range(20):
            rep = c.step()
            assert rep.leader and rep.rejected == 0
            reads.append(rep.read)
            if not rep.progressed:
                break
        assert max(reads) <= most, reads
        while c.step(flush=True).progressed:  # the young rest
            pass
        committed = [json.loads(line) for line in
                     (tmp_path / "batches.jsonl").read_text().splitlines()]
        assert max(b["leafCount"] for b in committed) <= most
        assert sum(b["leafCount"] for b in committed) == 16  # every receipt, once
    finally:
        rds.close()


def test_a_standby_takes_over_a_dead_committers_big_pending_entries(keys: StreamKeys,
                                                                     tmp_path: Path) -> None:
    """A committer that dies holding a buffer of big entries leaves them pending under its
    consumer name. The standby's take-over claimed them with XAUTOCLAIM 100 at a time, which
    answers with every claimed entry's fields: the whole dead buffer (up to its budget, 256 MiB
    by default, and more before reads were bounded) in one reply under the call deadline, only
    to count them. A reply that cannot arrive in time fails the step, and every retry asks for
    the same reply: the standby never takes over, and no batch is committed. Now it lists the
    pending ids (XPENDING) and claims them by id (XCLAIM JUSTID): no entry's bytes move until
    the bounded reads of the buffer fetch them. Here: 96 entries of 1 MiB pending, a standby
    whose call deadline (and socket timeout) is 0.3 s."""
    v = json.loads(VECTORS.read_text(encoding="utf-8"))
    request = ExecRequest.from_json(v["exec_requests"][0]["json"])
    result = ExecResult.from_json(v["exec_results"][0]["json"])
    _, pk = derive_epoch_keypair(hashlib.sha256(b"read budget epoch").digest(),
                                 EnvelopeSuite.X25519)
    issuer = ReceiptIssuer(SIGNER, DOMAIN, 1, pk)
    big = 1024 * 1024
    items = []
    for _ in range(96):  # 96 MiB pending for the dead committer, 1 MiB an entry
        signed, blob = issuer.issue(request, result, b'{"prompt": "hi"}', b"x" * big)
        items.append((signed.to_bytes(), blob))
    slow = BoundedRedis(SHARED, deadline_s=10.0)
    fast = BoundedRedis(SHARED, deadline_s=0.3)  # the standby's deadline: 96 MiB won't fit
    try:
        ReceiptStream(slow, keys, replica="r1").publish(items)
        da = LocalDAClient(tmp_path / "da", max_blob_bytes=big + (1 << 20))
        dead = BatchCommitter(slow, keys, da, JsonlBatchSink(tmp_path / "batches.jsonl"),
                              Lease(slow, keys, "A", ttl_s=31.0), domain=DOMAIN, consumer="A",
                              batch_max_entries=1024, batch_max_age_s=3600,
                              max_buffer_bytes=1 << 30)
        assert dead.step().read == 96  # read, not due: pending for A, then A is killed
        redis.Redis.from_url(SHARED).delete(keys.lease)  # its lease lapses
        standby = BatchCommitter(fast, keys, da, JsonlBatchSink(tmp_path / "batches.jsonl"),
                                 Lease(fast, keys, "B", ttl_s=5.0), domain=DOMAIN,
                                 consumer="B", batch_max_entries=1024, batch_max_age_s=3600,
                                 max_buffer_bytes=2 * big)
        for _ in range(200):
            if not standby.step(flush=True).progressed:
                break
        committed = [json.loads(line) for line in
                     (tmp_path / "batches.jsonl").read_text().splitlines()]
        assert sum(b["leafCount"] for b in committed) == 96  # every receipt, once
    finally:
        slow.close()
        fast.close()
