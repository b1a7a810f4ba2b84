"""RedisDAClient against real Redis: the shared server on 127.0.0.1:6379 (unique key prefix per
test, cleaned up), and a throwaway redis-server of our own that the outage test kills."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from verinfer.da_client.errors import (
    BlobNotFoundError,
    BlobTooLargeError,
    CommitmentMismatchError,
    DAUnavailableError,
)
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.publisher import Backoff, Publisher
from verinfer.da_client.redis_backend import RedisDAClient
from verinfer.testing.sample import sample_entry
from verinfer.testing.sinks import InMemoryBatchSink

SHARED = "redis://127.0.0.1:6379/0"


def _shared_up() -> bool:
    try:
        return bool(redis.Redis.from_url(SHARED, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


needs_shared = pytest.mark.skipif(not _shared_up(), reason="no Redis on 127.0.0.1:6379")


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"verinfer:test:{uuid.uuid4().hex}:"
    yield p
    r = redis.Redis.from_url(SHARED)
    keys = list(r.scan_iter(match=p + "*"))
    if keys:
        r.delete(*keys)
    r.close()


@needs_shared
@pytest.mark.parametrize("size", [4096, 256 * 1024])
def test_round_trip_with_retention(prefix: str, size: int) -> None:
    c = RedisDAClient(SHARED, prefix=prefix, retention_s=3600)
    blob = os.urandom(size)
    p = c.put(blob)
    assert p == Pointer.for_blob("redis", blob)
    assert c.get(p) == blob and c.exists(p)
    ttl = c.ttl_s(p)
    assert ttl is not None and 3590 <= ttl <= 3600
    c.close()


@needs_shared
def test_no_retention_means_no_expiry(prefix: str) -> None:
    c = RedisDAClient(SHARED, prefix=prefix, retention_s=None)
    p = c.put(b"forever")
    assert c.ttl_s(p) is None and c.exists(p)


@needs_shared
def test_expired_blob_is_not_found(prefix: str) -> None:
    c = RedisDAClient(SHARED, prefix=prefix, retention_s=1)
    p = c.put(b"short-lived")
    r = redis.Redis.from_url(SHARED)
    r.pexpire(c.key(p), 1)  # let it lapse now rather than sleeping a second
    time.sleep(0.01)
    assert not c.exists(p)
    with pytest.raises(BlobNotFoundError, match="expired"):
        c.get(p)


@needs_shared
def test_corrupted_value_is_rejected(prefix: str) -> None:
    c = RedisDAClient(SHARED, prefix=prefix, retention_s=600)
    p = c.put(b"the evidence")
    redis.Redis.from_url(SHARED).set(c.key(p), b"the evidencE", keepttl=True)
    with pytest.raises(CommitmentMismatchError):
        c.get(p)


@needs_shared
def test_oversized_and_missing(prefix: str) -> None:
    c = RedisDAClient(SHARED, prefix=prefix, max_blob_bytes=1000)
    with pytest.raises(BlobTooLargeError, match="1001 bytes"):
        c.put(bytes(1001))
    assert list(redis.Redis.from_url(SHARED).scan_iter(match=prefix + "*")) == []
    with pytest.raises(BlobNotFoundError):
        c.get(Pointer.for_blob("redis", b"absent"))


# ---- our own throwaway server ----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.2).ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    server = OwnRedis(_free_port(), tmp_path)
    yield server
    server.kill()


def test_put_while_down_is_unavailable(own_redis: OwnRedis) -> None:
    own_redis.start()
    c = RedisDAClient(own_redis.url, socket_timeout_s=1)
    p = c.put(b"up")
    own_redis.kill()
    with pytest.raises(DAUnavailableError, match="redis put"):
        c.put(b"down")
    with pytest.raises(DAUnavailableError):
        c.get(p)


def test_outbox_holds_entries_while_redis_is_down(own_redis: OwnRedis, tmp_path: Path) -> None:
    own_redis.start()
    own_redis.kill()  # Redis is down from the first put on
    client = RedisDAClient(own_redis.url, socket_timeout_s=0.5)
    sink = InMemoryBatchSink()
    entries = [sample_entry(os.urandom(512) + bytes([i])) for i in range(40)]
    with Outbox(tmp_path / "outbox.db") as ob:
        pub = Publisher(ob, client, sink, batch_max_entries=16, batch_max_age_s=0.05,
                        backoff=Backoff(base_s=0.05, max_s=0.3)).start()
        try:
            for e in entries:
                ob.enqueue(*e)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and ob.status().last_error is None:
                time.sleep(0.05)
            st = ob.status()
            assert st.entries["queued"] == 40 and st.entries["committed"] == 0
            assert st.last_error is not None and "DAUnavailableError" in st.last_error
            own_redis.start()  # Redis returns (empty: this server keeps nothing)
            pub.stop(drain_timeout_s=30)
        finally:
            pub.close()
        st = ob.status()
        assert st.entries == {"queued": 0, "published": 0, "batched": 0, "committed": 40}
    digests = {e[0]: e[2] for e in entries}
    seen: list[bytes] = []
    for b in sink.batches:
        m = parse_manifest(client.get(b.manifest))
        for e in m.entries:
            seen.append(e.signed.digest)
            assert client.get(e.ciphertext) == digests[e.signed.digest]
    assert sorted(seen) == sorted(digests)
    client.close()


@needs_shared
def test_extend_retention_only_lengthens(prefix: str) -> None:
    c = RedisDAClient(SHARED, prefix=prefix, retention_s=100)
    p = c.put(b"challenged")
    assert c.extend_retention(p, 5000)
    ttl = c.ttl_s(p)
    assert ttl is not None and ttl > 4900
    assert c.extend_retention(p, 10)  # shorter: ignored
    ttl = c.ttl_s(p)
    assert ttl is not None and ttl > 4900
    assert not c.extend_retention(Pointer.for_blob("redis", b"gone"), 10)
