"""The EigenDA proxy client against a loopback HTTP server that follows the proxy's routes
(verinfer.testing.eigenda_fake_proxy; no real proxy or EigenDA network runs here)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from verinfer.da_client.eigenda import EigenDAProxyClient
from verinfer.da_client.errors import (
    BlobNotFoundError,
    BlobTooLargeError,
    CommitmentMismatchError,
    DAProtocolError,
    DAUnavailableError,
)
from verinfer.da_client.pointer import Pointer, sha256
from verinfer.testing.eigenda_fake_proxy import FakeEigenDAProxy


@pytest.fixture
def proxy() -> Iterator[FakeEigenDAProxy]:
    with FakeEigenDAProxy(max_body_bytes=512 * 1024) as p:
        yield p


@pytest.fixture
def client(proxy: FakeEigenDAProxy) -> Iterator[EigenDAProxyClient]:
    c = EigenDAProxyClient(proxy.url, timeout_s=10)
    yield c
    c.close()


@pytest.mark.parametrize("size", [1, 4096, 256 * 1024])
def test_round_trip(client: EigenDAProxyClient, size: int) -> None:
    blob = os.urandom(size)
    p = client.put(blob)
    assert p.backend == "eigenda"
    assert p.blob_sha256 == sha256(blob)
    assert p.certificate[:1] == b"\x01" and len(p.certificate) > 1
    assert Pointer.parse(str(p)) == p
    assert client.get(p) == blob
    assert client.exists(p)


def test_routes_are_the_documented_ones(proxy: FakeEigenDAProxy) -> None:
    r = httpx.post(f"{proxy.url}/put", params={"commitment_mode": "standard"}, content=b"hi")
    assert r.status_code == 200
    g = httpx.get(f"{proxy.url}/get/0x{r.content.hex()}", params={"commitment_mode": "standard"})
    assert g.status_code == 200 and g.content == b"hi"
    assert httpx.get(f"{proxy.url}/health").status_code == 200


def test_503_is_retryable_unavailable(client: EigenDAProxyClient,
                                      proxy: FakeEigenDAProxy) -> None:
    proxy.fail_next_puts = 1
    with pytest.raises(DAUnavailableError, match="503") as ei:
        client.put(b"blob")
    assert not ei.value.caller_fault  # the backend failed, not the caller
    p = client.put(b"blob")  # the retry succeeds
    assert client.get(p) == b"blob"


def test_corrupted_answer_is_rejected(client: EigenDAProxyClient,
                                      proxy: FakeEigenDAProxy) -> None:
    p = client.put(b"the evidence")
    proxy.corrupt_gets = True
    with pytest.raises(CommitmentMismatchError):
        client.get(p)


def test_wrong_sha_in_pointer_is_rejected(client: EigenDAProxyClient) -> None:
    p = client.put(b"the evidence")
    forged = Pointer("eigenda", sha256(b"other bytes") + p.certificate)
    with pytest.raises(CommitmentMismatchError):
        client.get(forged)


def test_unknown_certificate_is_not_found(client: EigenDAProxyClient) -> None:
    p = Pointer("eigenda", sha256(b"x") + b"\x01" + bytes(48))
    assert not client.exists(p)
    with pytest.raises(BlobNotFoundError):
        client.get(p)


def test_oversized_blob_client_side_and_proxy_413(proxy: FakeEigenDAProxy) -> None:
    strict = EigenDAProxyClient(proxy.url, max_blob_bytes=1000)
    with pytest.raises(BlobTooLargeError, match="1001 bytes exceeds the eigenda limit of 1000"):
        strict.put(bytes(1001))
    assert proxy.puts == 0  # refused before upload
    lax = EigenDAProxyClient(proxy.url, max_blob_bytes=1 << 20)
    with pytest.raises(BlobTooLargeError, match="413"):
        lax.put(bytes(512 * 1024 + 1))


def test_proxy_down_is_unavailable() -> None:
    with FakeEigenDAProxy() as p:
        url = p.url
    c = EigenDAProxyClient(url, timeout_s=2)
    with pytest.raises(DAUnavailableError, match="unreachable"):
        c.put(b"x")


def test_wrong_route_is_protocol_error(proxy: FakeEigenDAProxy) -> None:
    c = EigenDAProxyClient(proxy.url + "/nope")
    with pytest.raises(DAProtocolError, match="404"):
        c.put(b"x")
