"""A hostile chain RPC held the services' calls for ever and filled their memory (issue 32).

The attack (``verinfer.testing.hostile.HostilePeer``): a chain RPC that drips its answer a
byte every 50 ms (every read succeeds, so requests' per-read timeout never fires), or answers
1 GiB. web3's ``HTTPProvider`` had no whole-call deadline and no size bound: ``verinfer serve``
hung at start on the drip, and reached 2,305 MB RSS on the 1 GiB answer (the explorer
3,180 MB). Who gains: whoever runs (or sits in front of) the RPC a service is pointed at.

Fix (``verinfer.chain.rpc``, the one place src/ makes a chain provider): every call has a
whole-call deadline (connect, headers and body, across web3's retries:
``RpcDeadlineExceeded``) and its answer is read in pieces up to a cap (``RpcAnswerTooLarge``,
a declared Content-Length beyond it refused before the body). Real sockets: the hostile peers
on loopback, the provider in this process, and one real `verinfer serve`.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from verinfer.chain.errors import ChainError
from verinfer.chain.rpc import (
    BoundedSession,
    RpcAnswerTooLarge,
    RpcDeadlineExceeded,
    bounded_web3,
)
from verinfer.testing.hostile import HostilePeer, operator_start_against_rpc

MIB = 1024 * 1024


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("mode", ["drip", "silent"])
def test_a_dripping_or_silent_rpc_is_cut_at_the_whole_call_deadline(mode: str) -> None:
    with HostilePeer(mode) as rpc:
        w3 = bounded_web3(rpc.url, deadline_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(RpcDeadlineExceeded) as err:
            w3.eth.block_number  # noqa: B018
        took = time.monotonic() - t0
    assert 0.9 < took < 2.0, took
    assert isinstance(err.value, ChainError) and "within 1 s" in str(err.value)


def test_the_deadline_holds_through_an_http_proxy() -> None:
    """``HTTP_PROXY`` set: requests sends through its own proxy manager; the drip (here the
    proxy itself) is cut at the deadline all the same."""
    with HostilePeer("drip") as proxy:
        session = BoundedSession(deadline_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(RpcDeadlineExceeded):
            session.post("http://rpc.invalid/", data=b"{}", proxies={"http": proxy.url})
    assert time.monotonic() - t0 < 2.0


def test_a_declared_huge_answer_is_refused_before_its_body() -> None:
    before = _peak_rss_mb()
    with HostilePeer("huge") as rpc:
        w3 = bounded_web3(rpc.url, max_answer_bytes=MIB)
        t0 = time.monotonic()
        with pytest.raises(RpcAnswerTooLarge) as err:
            w3.eth.get_block("latest")
    assert time.monotonic() - t0 < 1.0
    assert err.value.size == 1 << 30 and err.value.cap == MIB
    assert _peak_rss_mb() - before < 50


@pytest.fixture()
def endless_chunked() -> Iterator[str]:
    """An RPC answering with chunked encoding (no length) and never ending."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"1" * 65536
            try:
                while not stop.is_set():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_an_endless_answer_without_length_is_cut_at_the_cap(endless_chunked: str) -> None:
    before = _peak_rss_mb()
    w3 = bounded_web3(endless_chunked, max_answer_bytes=4 * MIB, deadline_s=10.0)
    t0 = time.monotonic()
    with pytest.raises(RpcAnswerTooLarge) as err:
        w3.eth.block_number  # noqa: B018
    assert time.monotonic() - t0 < 5.0
    assert 4 * MIB < err.value.size <= 4 * MIB + 65536
    assert _peak_rss_mb() - before < 64


def test_operator_start_against_a_1_gib_rpc_answer_fails_fast_and_small(
        tiny_path: Path, tmp_path: Path) -> None:
    """Before: the chain check read the whole 1 GiB answer (2,305 MB RSS). Now the declared
    length is refused, the binding is unproven and `verinfer serve` says so and exits."""
    state, seconds, requests_seen, peak_mb = operator_start_against_rpc(
        tiny_path, tmp_path, "huge", limit_s=60.0)
    assert state.startswith("exited"), (state, seconds, peak_mb)
    assert requests_seen >= 1
    assert peak_mb < 1000, peak_mb
    log = (tmp_path / "operator-rpc-huge.log").read_text(errors="replace")
    assert "1073741824 bytes or more" in log, log[-2000:]
