"""A client fills the fake EigenDA proxy's memory past its body limit with ``Content-Length: -1``.

The proxy (``verinfer.testing.eigenda_fake_proxy``, what the DA tests, the benchmark and the
hostile-services harness disperse to) compared ``int(Content-Length)`` with its 32 MiB limit
and then called ``rfile.read(length)``: ``-1`` passes the comparison and ``read(-1)`` reads to
the end of the stream, so one connection streamed 200 MiB into one blob (measured: +198 MiB
RSS in 0.3 s, answer 200 with a certificate) — no bound at all. A Content-Length that is not
a number (``abc``, ``1e3``) raised ValueError in the handler: the client got no answer, just a
closed connection, and a traceback went to stderr.

Fix: the Content-Length is ASCII digits or the put is refused before any body is read: 411
when it is missing, 400 when malformed, 413 over the limit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.rawhttp import raw_exchange
from verinfer.testing.eigenda_fake_proxy import FakeEigenDAProxy

LIMIT = 1024 * 1024  # a small limit: the attack streams a few times past it


@pytest.fixture
def proxy() -> Iterator[FakeEigenDAProxy]:
    with FakeEigenDAProxy(max_body_bytes=LIMIT) as p:
        yield p


def _exchange(proxy: FakeEigenDAProxy, length: str | None, body: bytes) -> bytes:
    head = "POST /put?commitment_mode=standard HTTP/1.1\r\nHost: x\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return raw_exchange(proxy.url, head.encode() + b"\r\n", body, half_close=True)


def test_negative_content_length_does_not_bypass_the_body_limit(
        proxy: FakeEigenDAProxy) -> None:
    answer = _exchange(proxy, "-1", b"a" * (4 * LIMIT))
    stored = max((len(b) for b in proxy.blobs.values()), default=0)
    assert stored <= LIMIT, f"a blob of {stored} bytes was kept past the {LIMIT} byte limit"
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


@pytest.mark.parametrize("length", ["abc", "1e3", "+5", "-0"])
def test_malformed_content_length_gets_a_clear_400(proxy: FakeEigenDAProxy,
                                                   length: str) -> None:
    answer = _exchange(proxy, length, b"hello")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"Content-Length" in answer
    assert not proxy.blobs


def test_missing_content_length_gets_411(proxy: FakeEigenDAProxy) -> None:
    answer = _exchange(proxy, None, b"hello")
    assert answer.startswith(b"HTTP/1.1 411"), answer[:200]
    assert not proxy.blobs
