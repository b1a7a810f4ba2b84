"""Slow bodies pinned the operator's memory (issue 32.9).

The attack: declare ``Content-Length: N``, send N-1 bytes, then nothing. The server waited for
the last byte for ever, holding what it had read: 30 such connections with 4 MiB bodies took a
`verinfer serve` from 307 to 565 MB, and the memory stayed taken. Headers sent a byte every
few seconds held a connection just as long (uvicorn's keep-alive timer stops at the first
byte). Who gains: a griefer, with a few connections and no CPU.

Fix (``verinfer.httpserve``, one module every service can use): a body must arrive whole
within a deadline (else 408 and the connection closed), bodies of requests in progress are
capped together (503 past it), headers have a deadline of their own, and connections are
capped (uvicorn's ``limit_concurrency``, 503 past it). Raw sockets against a real server on
loopback: the operator app (tiny model) in this process under the server config ``verinfer
serve`` runs, and one real `verinfer serve` process whose memory is measured.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.inproc import serving
from support.servers import launched_server
from verinfer.engine.engine import Engine
from verinfer.httpserve import ServeLimits
from verinfer.operator.app import ServerConfig, create_app

DEADLINE = 1.0
LIMITS = ServeLimits(max_body_bytes=4 * 1024 * 1024, body_deadline_s=DEADLINE,
                     header_deadline_s=1.0, max_inflight_body_bytes=1024 * 1024,
                     max_connections=40)


@pytest.fixture(scope="module")
def server(tiny_engine: Engine) -> Iterator[tuple[str, int]]:
    app = create_app(tiny_engine, "tiny", ServerConfig(http_limits=LIMITS))
    with serving(app, LIMITS) as addr:
        yield addr


def _head(n: int) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\n\r\n").encode()


def _read_all(s: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout``)."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open; got {out[:200]!r}") from None
    return out


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _error(raw: bytes) -> dict[str, object]:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]  # type: ignore[no-any-return]


def test_a_body_that_stops_one_byte_short_gets_408_and_is_closed(
        server: tuple[str, int]) -> None:
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode()
    conns = []
    for _ in range(30):  # 30 connections, each one byte short: every one answered and closed
        s = socket.create_connection(server)
        s.sendall(_head(len(body)) + body[:-1])
        conns.append(s)
    t0 = time.monotonic()
    for s in conns:
        raw = _read_all(s, 10 * DEADLINE)
        s.close()
        assert _status(raw) == 408, raw[:300]
        assert b"connection: close" in raw.lower()
        assert _error(raw)["code"] == "request_timeout"
    assert time.monotonic() - t0 < 5 * DEADLINE


def test_bodies_in_progress_are_capped_together(server: tuple[str, int]) -> None:
    """1 MiB of bodies in progress: two slow 400 KB bodies fit, the third is 503 at once."""
    n = 400 * 1024
    slow = [socket.create_connection(server) for _ in range(2)]
    for s in slow:
        s.sendall(_head(n) + b"{")
    time.sleep(0.2)
    third = socket.create_connection(server)
    t0 = time.monotonic()
    third.sendall(_head(n) + b"{")
    raw = _read_all(third, 5)
    assert _status(raw) == 503 and time.monotonic() - t0 < DEADLINE, raw[:300]
    assert _error(raw)["code"] == "server_busy" and b"retry-after: 1" in raw.lower()
    for s in slow:  # the slow ones run out of time and give their share back
        assert _status(_read_all(s, 10 * DEADLINE)) == 408
    ok = socket.create_connection(server)
    ok.sendall(_head(n) + b"{")  # admitted now (then refused by its own deadline)
    assert _status(_read_all(ok, 10 * DEADLINE)) == 408


def test_headers_sent_slowly_are_cut_off(server: tuple[str, int]) -> None:
    s = socket.create_connection(server)
    t0 = time.monotonic()
    for c in b"GET /health HTTP/1.1\r\nHost: x\r\n":  # never the blank line
        try:
            s.sendall(bytes([c]))
        except OSError:
            break
        time.sleep(0.05)
        if time.monotonic() - t0 > 4 * DEADLINE:
            break
    assert _read_all(s, 5) == b""  # closed without an answer
    assert time.monotonic() - t0 < 4 * DEADLINE


def test_connections_past_the_cap_get_503(server: tuple[str, int]) -> None:
    idle = [socket.create_connection(server) for _ in range(LIMITS.max_connections)]
    time.sleep(0.2)
    s = socket.create_connection(server)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5)
    assert _status(s.recv(65536)) == 503
    for c in [*idle, s]:
        c.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_thirty_stalled_4_mib_bodies_do_not_keep_the_servers_memory(tiny_path: Path) -> None:
    """The finding's numbers: a real `verinfer serve`, 30 connections each declaring 4 MiB and
    sending all but one byte. Past 64 MiB of bodies in progress the rest are refused at once
    (503, connection closed: a client still sending sees a reset); the others are answered 408
    within the deadline and closed; the server's memory comes back (the finding: +258 MB,
    held for ever)."""
    n = 4 * 1024 * 1024 - 64
    payload = b'{"model":"tiny","prompt":"' + b"a" * (n - 40)
    with launched_server(tiny_path, "--unsafe-no-evidence", "--body-deadline", "2") as srv:
        host, port = srv.base.removeprefix("http://").split(":")
        before = _rss_mb(srv.proc.pid)
        conns, statuses = [], []
        t0 = time.monotonic()
        for _ in range(30):
            s = socket.create_connection((host, int(port)))
            try:
                s.sendall(_head(n) + payload[:n - 1])
                conns.append(s)
            except OSError:  # refused while still sending
                statuses.append(_status(_read_all(s, 5) or b"HTTP/1.1 503 -"))
                s.close()
        peak = _rss_mb(srv.proc.pid)
        for s in conns:
            try:
                raw = _read_all(s, 20)
            except ConnectionResetError:
                raw = b"HTTP/1.1 503 -"  # answered and closed while its last bytes were sent
            s.close()
            statuses.append(_status(raw))
        took = time.monotonic() - t0
        time.sleep(0.5)
        after = _rss_mb(srv.proc.pid)
    print(f"RSS before {before:.0f} MB, with 30 stalled bodies {peak:.0f} MB, after "
          f"{after:.0f} MB; statuses {sorted(statuses)}; all answered in {took:.1f} s")
    assert set(statuses) <= {408, 503} and 408 in statuses, statuses
    assert took < 10
    assert after < before + 100, (before, peak, after)
