"""EigenDA proxy backend (REST, ``commitment_mode=standard``).

Routes (Layr-Labs/eigenda-proxy): ``POST /put?commitment_mode=standard`` with the raw blob as
body -> 200 and the commitment (version byte + DA certificate) as raw body bytes; ``GET
/get/0x<commitment hex>?commitment_mode=standard`` -> 200 and the blob. 503 on put means the
dispersal failed and the caller should retry later or fail over to another backend.

The certificate is not a hash of the blob, so the pointer is ``sha256(blob) || certificate``
and ``get`` checks the returned bytes against that sha256 (the proxy's own KZG checks are a
second, independent layer). The proxy has no HEAD route: ``exists`` downloads the blob.

``put`` does not trust the certificate: it reads the blob back through the proxy and checks
its sha256 before returning the pointer (``read_back``). A proxy that certifies a blob it
cannot serve would otherwise make the operator commit a batch naming an unfetchable pointer
-- and the operator, not the proxy, is slashed for an unpublished receipt. A failed read-back
is an error of that put (logged; the publisher retries the entry or batch with backoff), never
a pointer.

Every answer is read bounded (a proxy is another party): a 200 GET up to ``max_blob_bytes``, a
put's certificate up to the pointer's limit, an error body up to ``ERROR_BODY_BYTES`` (quoted in
the error), and every call within ``deadline_s`` of wall time — httpx's timeout is per read, so
a proxy dripping one byte per second would otherwise hold a verifier's get (no vote) or the
operator's publisher (no commitment, slashed) forever
(tests/adversarial/test_da_hostile_backends.py).
"""

from __future__ import annotations

import hashlib
import logging
import time

import httpx

from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES, DAClient
from verinfer.da_client.errors import (
    BlobNotFoundError,
    BlobTooLargeError,
    CommitmentMismatchError,
    DAProtocolError,
    DAUnavailableError,
)
from verinfer.da_client.pointer import MAX_COMMITMENT_BYTES, SHA256_LEN, Pointer

_MODE = {"commitment_mode": "standard"}
#: How much of an error answer is read (and quoted, cut to 200 characters).
ERROR_BODY_BYTES = 4096
log = logging.getLogger(__name__)


class EigenDAProxyClient(DAClient):
    backend = "eigenda"

    def __init__(self, base_url: str, *, timeout_s: float = 120.0,
                 max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
                 http: httpx.Client | None = None, read_back: bool = True,
                 deadline_s: float = 600.0) -> None:
        """``timeout_s``: httpx's per-operation timeout (connect, each read, each write);
        ``deadline_s``: the whole call, answer read included."""
        self.base_url = base_url.rstrip("/")
        self.read_back = read_back
        self.max_blob_bytes = max_blob_bytes
        self.deadline_s = deadline_s
        self._http = http if http is not None else httpx.Client(timeout=timeout_s)

    def _read(self, r: httpx.Response, limit: int, url: str, started: float) -> bytes | None:
        """At most ``limit`` bytes of the answer (None: it has more), within the deadline."""
        body = bytearray()
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) > limit:
                return None
            if time.monotonic() - started > self.deadline_s:
                raise DAUnavailableError(f"eigenda proxy {url} did not answer within the "
                                         f"deadline of {self.deadline_s} s (read {len(body)} "
                                         "bytes)")
        return bytes(body)

    def _error_snippet(self, r: httpx.Response, url: str, started: float) -> str:
        body = self._read(r, ERROR_BODY_BYTES, url, started)
        return _snippet(body if body is not None else b"(a longer body, not read)")

    def _put(self, blob: bytes, digest: bytes) -> Pointer:
        url = f"{self.base_url}/put"
        started = time.monotonic()
        try:
            with self._http.stream("POST", url, params=_MODE, content=blob,
                                   headers={"Content-Type": "application/octet-stream"}) as r:
                if r.status_code != 200:
                    snippet = self._error_snippet(r, url, started)
                    if r.status_code == 503:
                        raise DAUnavailableError(
                            f"eigenda proxy {url} answered 503: dispersal failed; retry or "
                            f"fail over ({snippet})")
                    if r.status_code == 413:
                        raise BlobTooLargeError(
                            f"eigenda proxy {url} refused a blob of {len(blob)} bytes as too "
                            "large (413)", param="blob")
                    raise _unexpected("put", url, r.status_code, snippet)
                cert = self._read(r, MAX_COMMITMENT_BYTES - SHA256_LEN, url, started)
        except httpx.HTTPError as e:
            raise DAUnavailableError(f"eigenda proxy {url} unreachable: {e!r}") from e
        if cert is None:
            raise DAProtocolError(
                f"eigenda proxy {url} returned a commitment of more than "
                f"{MAX_COMMITMENT_BYTES - SHA256_LEN} bytes")
        if not 0 < len(cert) <= MAX_COMMITMENT_BYTES - SHA256_LEN:
            raise DAProtocolError(
                f"eigenda proxy {url} returned a commitment of {len(cert)} bytes; expected 1.."
                f"{MAX_COMMITMENT_BYTES - SHA256_LEN}")
        pointer = Pointer("eigenda", digest + cert)
        if self.read_back:
            self._read_back(pointer, digest, len(blob))
        return pointer

    def _read_back(self, pointer: Pointer, digest: bytes, size: int) -> None:
        back = self._fetch(pointer)
        if back is None:
            log.error("eigenda proxy %s certified a blob of %d bytes (sha256 0x%s) it does not "
                      "serve; not using that certificate", self.base_url, size, digest.hex())
            raise DAProtocolError(
                f"eigenda proxy {self.base_url} certified blob 0x{digest.hex()} but GET returns "
                "404: the certificate is not usable")
        got = hashlib.sha256(back).digest()
        if got != digest:
            log.error("eigenda proxy %s serves different bytes (sha256 0x%s) for blob 0x%s; not "
                      "using that certificate", self.base_url, got.hex(), digest.hex())
            raise CommitmentMismatchError(
                f"eigenda proxy {self.base_url} serves {len(back)} bytes with sha256 "
                f"0x{got.hex()} for the blob 0x{digest.hex()} it just certified")

    def _fetch(self, pointer: Pointer) -> bytes | None:
        url = f"{self.base_url}/get/0x{pointer.certificate.hex()}"
        started = time.monotonic()
        try:
            with self._http.stream("GET", url, params=_MODE) as r:
                if r.status_code == 404:
                    return None
                if r.status_code != 200:
                    raise _unexpected("get", url, r.status_code,
                                      self._error_snippet(r, url, started))
                body = self._read(r, self.max_blob_bytes, url, started)
                if body is None:  # a lying proxy cannot exhaust memory
                    raise CommitmentMismatchError(
                        f"eigenda proxy {url} returned more than {self.max_blob_bytes} "
                        f"bytes for {str(pointer)[:80]}…")
                return body
        except httpx.HTTPError as e:
            raise DAUnavailableError(f"eigenda proxy {url} unreachable: {e!r}") from e

    def _get(self, pointer: Pointer) -> bytes:
        blob = self._fetch(pointer)
        if blob is None:
            raise BlobNotFoundError(f"eigenda proxy has no blob for {str(pointer)[:120]}",
                                    param="pointer")
        return blob

    def _exists(self, pointer: Pointer) -> bool:
        return self._fetch(pointer) is not None

    def close(self) -> None:
        self._http.close()


def _snippet(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")


def _unexpected(op: str, url: str, status: int, snippet: str) -> Exception:
    msg = f"eigenda proxy {op} {url} answered {status}: {snippet}"
    return DAUnavailableError(msg) if status >= 500 else DAProtocolError(msg)
