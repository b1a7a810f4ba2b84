"""One client address filled a service's global HTTP caps (issue 32, docs/budgets.md).

The attacks (``verinfer.testing.hostile``: ``idle``, ``slow_body``): from one address, open more
idle connections than the server's ``limit_concurrency``, or start more stalled bodies than
the bodies-in-progress cap holds. Both caps were global only, so every other client got 503
until the header deadline (10 s) or the body deadline (30 s) freed them: the operator's and the
KMS shard's /health p99 was 5000 ms under 600 idle connections from 127.0.0.2.

Fix (``verinfer.httpserve``, used by the operator, the KMS shard and the explorer): a cap on
open connections per client address (past it a 503 and the connection closed before anything
is read; a trusted proxy is not counted), and a per-address share of the bodies in progress
(``BodyGuard``: past it 503 to that address only). The global caps stay. Real uvicorn on
loopback, configured as the services run it; the attacker connects from 127.0.0.2, the honest
client from 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support.inproc import serving
from verinfer.httpserve import BodyGuard, ServeLimits

ATTACKER, HONEST = "127.0.0.2", "127.0.0.1"
MIB = 1024 * 1024
#: the defaults but for smaller totals: 40 connections, 4 MiB of bodies, 1 MiB per body
LIMITS = ServeLimits(max_body_bytes=MIB, max_inflight_body_bytes=4 * MIB, max_connections=40,
                     body_deadline_s=5.0, header_deadline_s=5.0)


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, answers its length."""
    if scope["type"] != "http":
        return
    n = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        n += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = json.dumps({"received": n}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture()
def server() -> Iterator[tuple[str, int]]:
    with serving(BodyGuard(_echo, LIMITS), LIMITS) as addr:
        yield addr


def _connect(addr: tuple[str, int], src: str) -> socket.socket:
    return socket.create_connection(addr, timeout=5, source_address=(src, 0))


def _post(s: socket.socket, n: int, send: int | None = None) -> None:
    s.sendall(f"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n".encode()
              + b"a" * (n if send is None else send))


def _answer(s: socket.socket) -> tuple[int, bytes]:
    raw = b""
    while b"\r\n\r\n" not in raw or len(raw.split(b"\r\n\r\n", 1)[1]) < int(
            raw.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
            if b"content-length: " in raw.lower() else 0):
        chunk = s.recv(65536)
        if not chunk:
            break
        raw += chunk
    return int(raw.split(b" ", 2)[1]), raw.split(b"\r\n\r\n", 1)[-1]


def test_idle_connections_from_one_address_leave_room_for_others(
        server: tuple[str, int]) -> None:
    idle = [_connect(server, ATTACKER) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.3)
        # the attacker's connections past its share were told 503 and closed at once
        refused = 0
        for s in idle[LIMITS.max_connections_per_client:]:
            status, body = _answer(s)
            assert status == 503, body
            assert json.loads(body)["error"]["code"] == "too_many_connections"
            refused += 1
        assert refused == LIMITS.max_connections - 32
        for _ in range(3):  # an honest client from another address is served
            with _connect(server, HONEST) as s:
                s.sendall(b"GET /h HTTP/1.1\r\nHost: x\r\n\r\n")
                status, body = _answer(s)
                assert status == 200, body
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)  # closed: the attacker's address has its share again
    with _connect(server, ATTACKER) as s:
        _post(s, 3)
        assert _answer(s)[0] == 200


def test_stalled_bodies_from_one_address_leave_room_for_others(
        server: tuple[str, int]) -> None:
    share = LIMITS.client_body_share
    assert share < LIMITS.max_inflight_body_bytes
    stalled = []
    try:
        for _ in range(LIMITS.max_inflight_body_bytes // MIB):  # enough to fill the total cap
            s = _connect(server, ATTACKER)
            _post(s, MIB, send=1000)  # then nothing
            stalled.append(s)
        time.sleep(0.3)
        # past its share the attacker got 503 server_busy at once; the rest still wait
        refused = 0
        for s in stalled[share // MIB:]:
            status, body = _answer(s)
            assert status == 503, body
            assert json.loads(body)["error"]["code"] == "server_busy"
            refused += 1
        assert refused == (LIMITS.max_inflight_body_bytes - share) // MIB
        for _ in range(3):  # an honest 512 KiB body from another address goes through
            with _connect(server, HONEST) as s:
                t0 = time.monotonic()
                _post(s, MIB // 2)
                status, body = _answer(s)
                assert status == 200, body
                assert json.loads(body) == {"received": MIB // 2}
                assert time.monotonic() - t0 < 2
    finally:
        for s in stalled:
            s.close()


def test_a_trusted_proxy_is_not_held_to_one_address_share() -> None:
    """Every client behind a trusted proxy shares its address: its connections are not
    counted (the global cap still holds)."""
    with serving(BodyGuard(_echo, LIMITS), LIMITS, trusted_proxies=[ATTACKER]) as addr:
        conns = [_connect(addr, ATTACKER) for _ in range(LIMITS.max_connections_per_client + 4)]
        try:
            time.sleep(0.3)
            for s in conns:  # each one is served: none was refused at connect
                s.sendall(b"GET /h HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.9\r\n\r\n")
                assert _answer(s)[0] == 200
        finally:
            for s in conns:
                s.close()
