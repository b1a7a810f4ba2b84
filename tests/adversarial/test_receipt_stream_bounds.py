"""The receipt stream's bounds (issue 37): a Redis that answers a byte at a time cannot hold a
replica's publish (or the committer's read) past the call's whole deadline — the per-read
socket timeout alone never fires while bytes keep coming — and the stream refuses a response's
receipts once it holds its backlog budget (503, nothing added), so a committer that is down
cannot make the replicas fill Redis without end."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from verinfer.operator.readiness import Readiness
from verinfer.operator.stream import (
    BoundedRedis,
    ReceiptStream,
    ReceiptStreamError,
    ReceiptStreamFullError,
    StreamKeys,
    StreamMonitor,
    StreamRecorder,
)

pytestmark = [pytest.mark.redis, pytest.mark.loopback]

SHARED = "redis://127.0.0.1:6379/0"
OPERATOR = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"


@pytest.fixture
def drip() -> Iterator[int]:
    """A server that reads a command, then answers one byte every 50 ms, for ever."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                while not stop.is_set():
                    conn.sendall(b"$")
                    time.sleep(0.05)
            except OSError:
                pass

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    srv.close()
    t.join(timeout=5)


def test_a_dripping_redis_cannot_hold_a_publish_past_its_deadline(drip: int) -> None:
    rds = BoundedRedis(f"redis://127.0.0.1:{drip}/0", deadline_s=0.5)
    stream = ReceiptStream(rds, StreamKeys("verinfer:test:", OPERATOR), replica="r1")
    readiness = Readiness()
    rec = StreamRecorder(stream, readiness)
    t0 = time.monotonic()
    with pytest.raises(ReceiptStreamError) as e:
        rec.record([(b"\x00" * 32, b"receipt", b"ciphertext")], None)
    assert time.monotonic() - t0 < 1.5
    assert e.value.status_code == 503 and "within 0.5 s" in e.value.message
    assert "receipt_stream" in readiness.reasons()  # the next request is refused at once
    t0 = time.monotonic()
    StreamMonitor(readiness, stream, stop_after_s=60)()  # the monitor's read too
    assert time.monotonic() - t0 < 1.5
    assert "cannot reach the receipt stream" in readiness.reasons()["receipt_stream"]
    rds.close()


@pytest.fixture
def keys() -> Iterator[StreamKeys]:
    k = StreamKeys(f"verinfer:test:{uuid.uuid4().hex}:", OPERATOR)
    yield k
    r = redis.Redis.from_url(SHARED)
    found = list(r.scan_iter(match=k.prefix + "*"))
    if found:
        r.delete(*found)
    r.close()


def test_the_stream_refuses_receipts_past_its_backlog_budget(keys: StreamKeys) -> None:
    rds = BoundedRedis(SHARED, deadline_s=2.0)
    stream = ReceiptStream(rds, keys, replica="r1", max_backlog=4)
    stream.publish([(b"r1", b"c1"), (b"r2", b"c2"), (b"r3", b"c3")])
    with pytest.raises(ReceiptStreamFullError) as e:  # 3 + 2 > 4: neither is added
        stream.publish([(b"r4", b"c4"), (b"r5", b"c5")])
    assert e.value.status_code == 503
    assert stream.backlog().entries == 3
    stream.publish([(b"r4", b"c4")])  # exactly at the budget
    readiness = Readiness()
    StreamMonitor(readiness, stream, stop_after_s=60)()
    assert "4 receipts wait" in readiness.reasons()["receipt_stream"]
    rds.close()
