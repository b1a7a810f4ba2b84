"""Outbox + publisher with a fake clock: states, batching triggers, retries, idempotence."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import rfc8785

from verinfer.da_client.eigenda import EigenDAProxyClient
from verinfer.da_client.errors import OutboxConflictError, OutboxError, PublisherBusyError
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.publisher import Backoff, Publisher
from verinfer.da_client.sinks import BatchCommitment
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.merkle import verify_proof
from verinfer.testing.eigenda_fake_proxy import FakeEigenDAProxy
from verinfer.testing.sample import SAMPLE_DOMAIN, sample_entry
from verinfer.testing.sinks import InMemoryBatchSink


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def outbox(tmp_path: Path, clock: FakeClock) -> Iterator[Outbox]:
    ob = Outbox(tmp_path / "outbox.db", now=clock.now)
    yield ob
    ob.close()


@pytest.fixture
def da(tmp_path: Path) -> LocalDAClient:
    return LocalDAClient(tmp_path / "da")


NO_JITTER = Backoff(base_s=1.0, factor=2.0, max_s=8.0, jitter=0.0)


def _publisher(outbox: Outbox, da: object, sink: object, clock: FakeClock,
               **kw: object) -> Publisher:
    args: dict[str, object] = {"batch_max_entries": 2, "batch_max_age_s": 5.0,
                               "backoff": NO_JITTER, "put_workers": 1, "sleep": clock.sleep}
    args.update(kw)
    return Publisher(outbox, da, sink, now=clock.now, **args)  # type: ignore[arg-type]


def _entries(n: int, tag: bytes = b"") -> list[tuple[bytes, bytes, bytes]]:
    return [sample_entry(tag + os.urandom(32) + i.to_bytes(4, "big")) for i in range(n)]


def _check_published_exactly_once(entries: list[tuple[bytes, bytes, bytes]],
                                  batches: list[BatchCommitment], da: LocalDAClient) -> None:
    seen: dict[bytes, int] = {}
    for b in batches:
        m = parse_manifest(da.get(b.manifest))
        assert m.root == b.root and m.leaf_count == b.leaf_count
        for e in m.entries:
            seen[e.signed.digest] = seen.get(e.signed.digest, 0) + 1
            assert verify_proof(e.signed.digest, m.proof(e.signed.digest), m.root)
    for digest, _, _ in entries:
        assert seen.get(digest) == 1
    assert sum(seen.values()) == len(entries)
    by_digest = {d: p for d, _, p in entries}
    for b in batches:
        for e in parse_manifest(da.get(b.manifest)).entries:
            assert da.get(e.ciphertext) == by_digest[e.signed.digest]


def test_states_and_batch_triggers(outbox: Outbox, da: LocalDAClient, clock: FakeClock) -> None:
    sink = InMemoryBatchSink()
    pub = _publisher(outbox, da, sink, clock)
    entries = _entries(5)
    for e in entries:
        outbox.enqueue(*e)
    st = outbox.status()
    assert st.entries == {"queued": 5, "published": 0, "batched": 0, "committed": 0}
    clock.t += 3
    assert st.oldest_unpublished_age_s == 0 and outbox.status().oldest_unpublished_age_s == 3

    r = pub.run_once()
    assert (r.published, r.batches_formed, r.manifests_published, r.batches_committed) == \
        (5, 2, 2, 2)  # two full batches; the fifth waits for the age trigger
    assert outbox.status().entries == {"queued": 0, "published": 1, "batched": 0,
                                       "committed": 4}
    assert pub.run_once().batches_formed == 0
    clock.t += 5
    assert pub.run_once().batches_committed == 1
    st = outbox.status()
    assert st.entries["committed"] == 5 and st.pending == 0
    assert st.oldest_unpublished_age_s is None
    assert st.last_batch is not None and st.last_batch.leaf_count == 1
    assert st.last_batch.state == "committed"
    assert [b.leaf_count for b in sink.batches] == [2, 2, 1]
    _check_published_exactly_once(entries, sink.batches, da)
    state = outbox.entry_state(entries[0][0])
    assert state is not None and state[0] == "committed"
    assert Pointer.parse(state[1] or "") == Pointer.for_blob("local", entries[0][2])


def test_enqueue_is_idempotent_and_detects_conflicts(outbox: Outbox) -> None:
    digest, receipt, payload = _entries(1)[0]
    first = outbox.enqueue(digest, receipt, payload)
    assert outbox.enqueue(digest, receipt, payload) == first
    forged = receipt.replace(b'"signature":"0x', b'"signature":"0x00', 1)[:-4] + b'"}'
    assert forged != receipt
    with pytest.raises(OutboxConflictError, match="already queued"):
        outbox.enqueue(digest, forged, payload)
    assert outbox.status().entries["queued"] == 1


def test_enqueue_many_is_all_or_nothing(outbox: Outbox) -> None:
    good = _entries(3)
    bad = (good[0][0], good[1][1], good[0][2])  # receipt of another entry
    with pytest.raises(OutboxError):
        outbox.enqueue_many([*good, bad])
    assert outbox.status().entries["queued"] == 0
    assert len(outbox.enqueue_many(good)) == 3


@pytest.mark.parametrize("mutate, match", [
    (lambda d, r, p: (d[:31], r, p), "32 bytes"),
    (lambda d, r, p: (d, b"not json", p), "does not decode"),
    (lambda d, r, p: (bytes(32), r, p), "carry digest"),
    (lambda d, r, p: (d, r, p + b"x"), "ciphertextHash"),
    (lambda d, r, p: (d, r.decode(), p), "must be bytes"),
])
def test_enqueue_rejects_bad_entries(outbox: Outbox, mutate: object, match: str) -> None:
    entry = mutate(*_entries(1)[0])  # type: ignore[operator]
    with pytest.raises(OutboxError, match=match):
        outbox.enqueue(*entry)
    assert outbox.status().entries["queued"] == 0


def test_oversized_payload_refused_at_enqueue(tmp_path: Path) -> None:
    with (Outbox(tmp_path / "o.db", max_payload_bytes=100) as ob,
          pytest.raises(OutboxError, match="exceeds")):
        ob.enqueue(*sample_entry(bytes(101)))


def test_503_backs_off_exponentially_then_publishes(outbox: Outbox, clock: FakeClock) -> None:
    sink = InMemoryBatchSink()
    with FakeEigenDAProxy() as proxy:
        client = EigenDAProxyClient(proxy.url, timeout_s=5)
        pub = _publisher(outbox, client, sink, clock)
        entries = _entries(2)
        outbox.enqueue_many(entries)
        proxy.fail_next_puts = 6  # three steps of two failing puts each
        attempts_at = []
        for _ in range(40):
            before = proxy.puts
            pub.run_once()
            if proxy.puts != before:
                attempts_at.append(clock.t)
            if sink.batches:
                break
            clock.t += 0.25
        # tries at t0 (2 puts: both fail), +1 s, +2 s, then +4 s succeeds
        t0 = attempts_at[0]
        assert [a - t0 for a in attempts_at] == [0, 1.0, 3.0, 7.0]
        assert outbox.status().entries["committed"] == 2
        for b in sink.batches:
            m = parse_manifest(client.get(b.manifest))
            assert {e.signed.digest for e in m.entries} == {e[0] for e in entries}
        client.close()


def test_unavailable_backend_error_is_visible_in_status(outbox: Outbox,
                                                        clock: FakeClock) -> None:
    with FakeEigenDAProxy() as proxy:
        url = proxy.url
    client = EigenDAProxyClient(url, timeout_s=1)
    pub = _publisher(outbox, client, InMemoryBatchSink(), clock)
    outbox.enqueue(*_entries(1)[0])
    pub.run_once()
    st = outbox.status()
    assert st.entries["queued"] == 1
    assert st.last_error is not None and "DAUnavailableError" in st.last_error
    client.close()


def test_permanent_error_backs_off_only_that_entry(outbox: Outbox, tmp_path: Path,
                                                   clock: FakeClock) -> None:
    small_da = LocalDAClient(tmp_path / "small", max_blob_bytes=1000)
    sink = InMemoryBatchSink()
    pub = _publisher(outbox, small_da, sink, clock, batch_max_entries=10,
                     manifest_da=LocalDAClient(tmp_path / "manifests"))
    big, ok = sample_entry(os.urandom(2000)), sample_entry(os.urandom(10))
    outbox.enqueue(*big)
    outbox.enqueue(*ok)
    pub.run_once(flush=True)
    st = outbox.status()
    assert st.entries == {"queued": 1, "published": 0, "batched": 0, "committed": 1}
    assert st.last_error is not None and "BlobTooLargeError" in st.last_error
    puts_before = outbox.due_queued(10)
    assert puts_before == []  # backed off: not due until the retry time
    clock.t += 1.0
    assert len(outbox.due_queued(10)) == 1  # never dropped


def test_restart_after_crash_points_is_exactly_once(tmp_path: Path, da: LocalDAClient,
                                                    clock: FakeClock) -> None:
    db = tmp_path / "crash.db"
    entries = _entries(6)
    sink = InMemoryBatchSink()
    with Outbox(db, now=clock.now) as ob:
        ob.enqueue_many(entries)
        # crash after the DA put but before the state update: the blob is on DA, entry queued
        da.put(entries[0][2])
    with Outbox(db, now=clock.now) as ob:
        pub = _publisher(ob, da, sink, clock, batch_max_entries=3)
        # publish and form batches, but "crash" before manifests are uploaded
        assert pub._publish_entries() == (6, 0)
        assert pub._form_batches(flush=False) == 2
        assert ob.status().batches == {"built": 2, "published": 0, "committed": 0}
    with Outbox(db, now=clock.now) as ob:
        pub = _publisher(ob, da, sink, clock, batch_max_entries=3)
        assert pub._publish_manifests() == 2
        # crash after the sink took batch 1 but before the outbox recorded it
        first = ob.batches_in("published")[0]
        sink.commit(BatchCommitment(first.id, first.root, first.leaf_count,
                                    Pointer.parse(first.manifest_pointer or "")))
    with Outbox(db, now=clock.now) as ob:
        pub = _publisher(ob, da, sink, clock, batch_max_entries=3)
        assert pub.drain(timeout_s=10)
        assert ob.status().entries["committed"] == 6
    assert sink.calls == 3 and len(sink.batches) == 2  # repeated call deduplicated by root
    _check_published_exactly_once(entries, sink.batches, da)


class FlakySink(InMemoryBatchSink):
    """A sink whose backend (think: RPC node) refuses the first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def commit(self, batch: BatchCommitment) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("rpc node unreachable")
        super().commit(batch)


def test_sink_failure_is_retried_in_order(outbox: Outbox, da: LocalDAClient,
                                          clock: FakeClock) -> None:
    sink = FlakySink(failures=2)
    pub = _publisher(outbox, da, sink, clock)
    outbox.enqueue_many(_entries(4))
    pub.run_once()
    st = outbox.status()
    assert st.batches == {"built": 0, "published": 2, "committed": 0}
    assert st.last_error is not None and "rpc node unreachable" in st.last_error
    assert pub.drain(timeout_s=30)
    assert [b.batch_id for b in sink.batches] == [1, 2]


def test_one_publisher_per_outbox(outbox: Outbox, da: LocalDAClient) -> None:
    a = Publisher(outbox, da, InMemoryBatchSink()).start()
    try:
        with Outbox(outbox.path) as other, pytest.raises(PublisherBusyError):
            Publisher(other, da, InMemoryBatchSink()).start()
    finally:
        a.close()
    b = Publisher(outbox, da, InMemoryBatchSink()).start()  # released on stop
    b.close()


def test_background_thread_publishes_everything(tmp_path: Path, da: LocalDAClient) -> None:
    sink = InMemoryBatchSink()
    entries = _entries(60)
    with Outbox(tmp_path / "bg.db") as ob:
        pub = Publisher(ob, da, sink, batch_max_entries=16, batch_max_age_s=0.05).start()
        try:
            for e in entries:
                ob.enqueue(*e)
            pub.stop(drain_timeout_s=20)
        finally:
            pub.close()
        assert ob.status().entries["committed"] == 60
    _check_published_exactly_once(entries, sink.batches, da)


def test_prune_keeps_rows_drops_local_ciphertext(outbox: Outbox, da: LocalDAClient,
                                                 clock: FakeClock) -> None:
    entries = _entries(3)
    outbox.enqueue_many(entries)
    outbox.enqueue(*sample_entry(b"late"))
    pub = _publisher(outbox, da, InMemoryBatchSink(), clock, batch_max_entries=3)
    pub.run_once()
    clock.t += 1
    assert outbox.prune_committed_payloads(committed_before=clock.t) == 3
    assert outbox.status().entries["committed"] == 3
    with sqlite3.connect(outbox.path) as db:
        rows = db.execute("SELECT state, length(payload) FROM entries ORDER BY id").fetchall()
    assert rows == [("committed", 0)] * 3 + [("published", 4)]


def test_group_commit_under_concurrency(tmp_path: Path) -> None:
    """Many threads enqueue at once; each gets its own id or its own conflict, nothing else."""
    entries = _entries(200)
    digest, receipt, payload = entries[0]
    forged = receipt.replace(b'"signature":"0x', b'"signature":"0x00', 1)[:-4] + b'"}'
    results: dict[int, object] = {}
    lock = threading.Lock()
    with Outbox(tmp_path / "g.db") as ob:
        ob.enqueue(digest, receipt, payload)

        def worker(k: int) -> None:
            for i in range(k, len(entries), 8):
                try:
                    r: object = ob.enqueue(*entries[i])
                except OutboxConflictError as e:
                    r = e
                with lock:
                    results[i] = r
            if k == 0:
                try:
                    ob.enqueue(digest, forged, payload)
                except OutboxConflictError as e:
                    with lock:
                        results[-1] = e

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert isinstance(results.pop(-1), OutboxConflictError)
        ids = [results[i] for i in range(len(entries))]
        assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(entries)
        assert ob.status().entries["queued"] == len(entries)
    with Outbox(tmp_path / "g.db") as again:  # durable, and ids match the rows
        for i, (d, _, _) in enumerate(entries):
            assert again.entry_state(d) == ("queued", None, None)
            assert again.enqueue(*entries[i]) == ids[i]


def test_a_step_loads_bounded_bytes(outbox: Outbox) -> None:
    outbox.enqueue_many([sample_entry(bytes([i]) * 1000) for i in range(10)])
    assert len(outbox.due_queued(100, max_bytes=3500)) == 4  # the one crossing the cap is in
    assert len(outbox.due_queued(100, max_bytes=1)) == 1  # never zero
    assert len(outbox.due_queued(3)) == 3
    assert outbox.pending_count() == outbox.status().pending == 10


def test_fails_over_to_fallback_while_primary_answers_503(outbox: Outbox, da: LocalDAClient,
                                                          clock: FakeClock) -> None:
    sink = InMemoryBatchSink()
    with FakeEigenDAProxy() as proxy:
        primary = EigenDAProxyClient(proxy.url, timeout_s=5)
        pub = _publisher(outbox, primary, sink, clock, fallback_da=da)
        proxy.fail_next_puts = 1000  # EigenDA dispersal is down
        outbox.enqueue_many(_entries(2, b"during outage"))
        pub.run_once()
        assert len(sink.batches) == 1 and sink.batches[0].manifest.backend == "local"
        m = parse_manifest(da.get(sink.batches[0].manifest))
        assert {e.ciphertext.backend for e in m.entries} == {"local"}
        puts_during_pause = proxy.puts
        outbox.enqueue_many(_entries(2, b"still paused"))
        pub.run_once()  # primary paused: straight to the fallback, no put to the proxy
        assert proxy.puts == puts_during_pause and len(sink.batches) == 2
        proxy.fail_next_puts = 0  # EigenDA is back
        clock.t += 60
        outbox.enqueue_many(_entries(2, b"after"))
        pub.run_once()
        last = sink.batches[-1]
        assert last.manifest.backend == "eigenda"
        m = parse_manifest(primary.get(last.manifest))
        assert {e.ciphertext.backend for e in m.entries} == {"eigenda"}
        assert outbox.status().entries["committed"] == 6
        primary.close()


def test_receipt_bytes_outlive_pruning(outbox: Outbox, da: LocalDAClient,
                                       clock: FakeClock) -> None:
    digest, receipt, payload = sample_entry(b"kept receipt")
    outbox.enqueue(digest, receipt, payload)
    _publisher(outbox, da, InMemoryBatchSink(), clock).run_once(flush=True)
    clock.t += 1
    assert outbox.prune_committed_payloads(committed_before=clock.t) == 1
    assert outbox.receipt(digest) == receipt
    assert outbox.receipt(bytes(32)) is None


def test_jsonl_sink_appends_cleanly_after_a_torn_line(tmp_path: Path) -> None:
    from verinfer.da_client.pointer import Pointer
    from verinfer.da_client.sinks import BatchCommitment, JsonlBatchSink, read_jsonl_batches

    path = tmp_path / "batches.jsonl"
    first = BatchCommitment(1, b"\x01" * 32, 3, Pointer("local", b"\x0a" * 32))
    JsonlBatchSink(path).commit(first)
    with path.open("a") as f:
        f.write('{"batchId": 2, "batchR')  # the process died mid-append
    second = BatchCommitment(2, b"\x02" * 32, 5, Pointer("local", b"\x0b" * 32))
    JsonlBatchSink(path).commit(second)
    roots = [b["batchRoot"] for b in read_jsonl_batches(path)]
    assert roots == ["0x" + "01" * 32, "0x" + "02" * 32]


def test_a_batch_ends_where_the_receipts_domain_changes(outbox: Outbox, da: LocalDAClient,
                                                       clock: FakeClock) -> None:
    other = Domain(1, SAMPLE_DOMAIN.verifying_contract)
    entries = [*_entries(2, b"a"), sample_entry(b"other chain", domain=other), *_entries(1, b"b")]
    outbox.enqueue_many(entries)
    sink = InMemoryBatchSink()
    _publisher(outbox, da, sink, clock, batch_max_entries=10).run_once(flush=True)
    manifests = [parse_manifest(da.get(b.manifest)) for b in sink.batches]
    assert [(m.domain, m.leaf_count) for m in manifests] == \
        [(SAMPLE_DOMAIN, 2), (other, 1), (SAMPLE_DOMAIN, 1)]
    _check_published_exactly_once(entries, sink.batches, da)


def _without_domain(entry: tuple[bytes, bytes, bytes]) -> tuple[bytes, bytes, bytes]:
    """The entry with its receipt bytes in the outbox's older form (no domain)."""
    digest, receipt, payload = entry
    j = json.loads(receipt)
    old = {"receipt": j["receipt"], "receiptDigest": j["digest"], "signature": j["signature"]}
    return digest, bytes(rfc8785.dumps(old)), payload


def test_entries_without_domain_are_refused_at_enqueue(tmp_path: Path) -> None:
    """The outbox's older receipt form (no domain) never shipped: refused, not guessed."""
    old = _without_domain(_entries(1)[0])
    with Outbox(tmp_path / "plain.db") as ob, pytest.raises(OutboxError, match="domain"):
        ob.enqueue(*old)


def test_an_outbox_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with Outbox(path):
        pass
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=1")
    db.close()
    with pytest.raises(OutboxError, match="schema version 1"):
        Outbox(path)
