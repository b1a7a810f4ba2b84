"""A hostile DA layer answers slowly, hugely or with junk: a clear typed error, in bounded time
and memory — never a stalled verifier or operator.

Who gains from a stalled reader: a cheating operator whose receipt is being challenged (a
verifier that never finishes its DA read never votes, so the challenge ends without a verdict)
and a DA provider griefing an operator (a put that never returns stops its publisher, and an
operator whose receipts are not committed in time is slashed). Attacks, each on the real client:

1. EigenDA proxy drips its GET answer one byte at a time: every read is within the per-read
   timeout, so httpx never times out and the get never ended. Fix: a whole-call deadline.
2. EigenDA proxy answers an error status with an endless body: ``r.read()`` buffered all of it
   to quote 200 bytes. Fix: error bodies are read up to a few KiB.
3. EigenDA proxy answers a put with an endless "certificate": ``r.content`` buffered it all
   before the length check. Fix: the answer is streamed and cut at the certificate limit.
4. Redis: whoever can write the DA key (the operator itself) stores a value far past the blob
   limit; every verifier's GET pulled all of it (up to Redis' 512 MB) before the sha256 check.
   Fix: read at most ``max_blob_bytes + 1`` bytes (GETRANGE) and refuse a longer value.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.drip import outcome_within
from verinfer.da_client.eigenda import EigenDAProxyClient
from verinfer.da_client.errors import DAError, DAProtocolError, DAUnavailableError
from verinfer.da_client.pointer import Pointer

BIG = 64 * 1024 * 1024  # what the hostile server offers to send


class _Hostile(ThreadingHTTPServer):
    daemon_threads = True
    sent = 0
    behaviour: Callable[[BaseHTTPRequestHandler, _Hostile], None]


class _Handler(BaseHTTPRequestHandler):
    server: _Hostile

    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.behaviour(self, self.server)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        self.server.behaviour(self, self.server)


def _send(h: BaseHTTPRequestHandler, srv: _Hostile, status: int, total: int, chunk: int,
          pause_s: float = 0.0) -> None:
    h.send_response(status)
    h.send_header("Content-Length", str(total))
    h.end_headers()
    try:
        while srv.sent < total:
            h.wfile.write(b"x" * chunk)
            h.wfile.flush()
            srv.sent += chunk
            if pause_s:
                time.sleep(pause_s)
    except OSError:  # the client hung up: what a bounded reader does
        pass


@contextmanager
def hostile(behaviour: Callable[[BaseHTTPRequestHandler, _Hostile], None]) -> Iterator[_Hostile]:
    srv = _Hostile(("127.0.0.1", 0), _Handler)
    srv.behaviour = behaviour
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _url(srv: _Hostile) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def _client(url: str, *, timeout_s: float, deadline_s: float | None = None
            ) -> EigenDAProxyClient:
    client = EigenDAProxyClient(url, timeout_s=timeout_s)
    if deadline_s is not None:
        client.deadline_s = deadline_s
    return client


def _finishes(fn: Callable[[], object], within_s: float) -> BaseException | None:
    """Runs ``fn`` in a thread; fails the test if it has not finished in ``within_s``."""
    return outcome_within(fn, within_s)[0]


POINTER = Pointer("eigenda", hashlib.sha256(b"blob").digest() + b"\x01cert")


def test_eigenda_get_dripping_forever_hits_the_deadline() -> None:
    with hostile(lambda h, s: _send(h, s, 200, BIG, 1, pause_s=0.05)) as srv:
        client = _client(_url(srv), timeout_s=2.0, deadline_s=1.5)
        t0 = time.monotonic()
        err = _finishes(lambda: client.get(POINTER), within_s=10)
        assert isinstance(err, DAUnavailableError), err
        assert "deadline" in str(err)
        assert time.monotonic() - t0 < 5
        client.close()


@pytest.mark.parametrize("status", [500, 400])
def test_eigenda_error_body_is_not_buffered(status: int) -> None:
    with hostile(lambda h, s: _send(h, s, status, BIG, 1 << 16)) as srv:
        client = _client(_url(srv), timeout_s=5.0)
        err = _finishes(lambda: client.get(POINTER), within_s=20)
        assert isinstance(err, DAError), err
        assert srv.sent < BIG // 4, f"the client read {srv.sent} bytes of an error body"
        client.close()


def test_eigenda_put_with_an_endless_certificate_is_cut() -> None:
    with hostile(lambda h, s: _send(h, s, 200, BIG, 1 << 16)) as srv:
        client = _client(_url(srv), timeout_s=5.0)
        err = _finishes(lambda: client.put(b"blob"), within_s=20)
        assert isinstance(err, DAProtocolError), err
        assert srv.sent < BIG // 4, f"the client read {srv.sent} bytes of a certificate"
        client.close()


def test_eigenda_put_dripping_hits_the_deadline() -> None:
    with hostile(lambda h, s: _send(h, s, 200, 4096, 1, pause_s=0.05)) as srv:
        client = _client(_url(srv), timeout_s=2.0, deadline_s=1.5)
        err = _finishes(lambda: client.put(b"blob"), within_s=10)
        assert isinstance(err, DAUnavailableError), err
        client.close()


def test_eigenda_silent_server_is_unavailable() -> None:
    """Control: a proxy that accepts and never answers is caught by the per-read timeout
    (before the fix too)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    try:
        client = _client(f"http://127.0.0.1:{lsock.getsockname()[1]}", timeout_s=1.0,
                         deadline_s=3.0)
        err = _finishes(lambda: client.get(POINTER), within_s=10)
        assert isinstance(err, DAUnavailableError), err
        client.close()
    finally:
        lsock.close()


# ---- 4. Redis: a value far past the blob limit under a pointer's key --------------------------
def test_redis_oversized_value_is_refused_without_reading_it() -> None:
    import uuid

    import redis

    from verinfer.da_client.errors import BlobNotFoundError, CommitmentMismatchError
    from verinfer.da_client.redis_backend import RedisDAClient

    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        r.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    prefix = f"vi-test-hostile-da-{uuid.uuid4().hex}:"
    client = RedisDAClient(prefix=prefix, retention_s=60, max_blob_bytes=1 << 20)
    pointer = client.put(b"the honest blob")
    assert client.get(pointer) == b"the honest blob"
    huge = 48 * 1024 * 1024
    r.set(client.key(pointer), b"\0" * huge, ex=60)  # the operator overwrites its own key
    info0 = r.info("stats")["total_net_output_bytes"]
    try:
        with pytest.raises(CommitmentMismatchError, match="more than"):
            client.get(pointer)
        sent = r.info("stats")["total_net_output_bytes"] - info0
        assert sent < huge // 4, f"Redis sent {sent} bytes for one get"
        with pytest.raises(BlobNotFoundError):  # absent is still "not found", not "empty"
            client.get(Pointer("redis", hashlib.sha256(b"never stored").digest()))
    finally:
        r.delete(client.key(pointer))
        client.close()
        r.close()
