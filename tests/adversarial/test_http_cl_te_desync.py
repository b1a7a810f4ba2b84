"""A client smuggles a second request past a front proxy: Content-Length and Transfer-Encoding.

A request carrying both ``Content-Length: 5`` and ``Transfer-Encoding: chunked`` was served by
the operator (uvicorn/h11 reads it as chunked, ignoring the length) and the connection was kept
open for the next request: the bytes after the chunked body were answered as a second request
(measured: two 200 answers on one connection). A front proxy that frames by Content-Length sees
a different request boundary than the service behind it — the classic CL.TE desync: an
attacker's trailing bytes become the start of the next (another user's) request on a shared
upstream connection. RFC 9112 §6.1: a server may reject such a request, and in any case MUST
close the connection after answering it.

Fix (``verinfer.httpserve.BodyGuard``, so the operator and the KMS shard both get it): a
request with both headers is refused with 400 ``ambiguous_framing`` before its body is read,
and the connection is closed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.rawhttp import raw_exchange
from support.servers import Server, launched_server

BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2,
                   "temperature": 0}).encode()
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
NEXT = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Iterator[Server]:
    with launched_server(tiny_path, "--unsafe-no-evidence") as s:
        yield s


def _send(server: Server, data: bytes) -> bytes:
    return raw_exchange(server.base, data)


def _statuses(answer: bytes) -> list[bytes]:
    return [answer[i:i + 12] for i in range(len(answer)) if answer.startswith(b"HTTP/1.1 ", i)]


def test_content_length_with_transfer_encoding_is_refused_and_closed(server: Server) -> None:
    smuggled = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + CHUNKED + NEXT)
    answer = _send(server, smuggled)
    statuses = _statuses(answer)
    assert statuses == [b"HTTP/1.1 400"], (statuses, answer[:400])
    err = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == "ambiguous_framing" and err["type"] == "invalid_request_error"
    # the honest forms still work, and keep their connection for the next request
    for framing in (b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
                    b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED):
        honest = _send(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       b"application/json\r\n" + framing + NEXT)
        assert _statuses(honest) == [b"HTTP/1.1 200"] * 2, honest[:400]
