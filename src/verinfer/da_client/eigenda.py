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
"""

from __future__ import annotations

import hashlib
import logging

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
log = logging.getLogger(__name__)


class EigenDAProxyClient(DAClient):
    backend = "eigenda"

    def __init__(self, base_url: str, *, timeout_s: float = 120.0,
                 max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
                 http: httpx.Client | None = None, read_back: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.read_back = read_back
        self.max_blob_bytes = max_blob_bytes
        self._http = http if http is not None else httpx.Client(timeout=timeout_s)

    def _put(self, blob: bytes, digest: bytes) -> Pointer:
        url = f"{self.base_url}/put"
        try:
            r = self._http.post(url, params=_MODE, content=blob,
                                headers={"Content-Type": "application/octet-stream"})
        except httpx.HTTPError as e:
            raise DAUnavailableError(f"eigenda proxy {url} unreachable: {e!r}") from e
        if r.status_code == 503:
            raise DAUnavailableError(
                f"eigenda proxy {url} answered 503: dispersal failed; retry or fail over "
                f"({_snippet(r.content)})")
        if r.status_code == 413:
            raise BlobTooLargeError(
                f"eigenda proxy {url} refused a blob of {len(blob)} bytes as too large (413)",
                param="blob")
        if r.status_code != 200:
            raise _unexpected("put", url, r)
        cert = r.content
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
        try:
            with self._http.stream("GET", url, params=_MODE) as r:
                if r.status_code == 404:
                    return None
                if r.status_code != 200:
                    r.read()
                    raise _unexpected("get", url, r)
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > self.max_blob_bytes:  # a lying proxy cannot exhaust memory
                        raise CommitmentMismatchError(
                            f"eigenda proxy {url} returned more than {self.max_blob_bytes} "
                            f"bytes for {str(pointer)[:80]}…")
                return bytes(body)
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


def _unexpected(op: str, url: str, r: httpx.Response) -> Exception:
    msg = f"eigenda proxy {op} {url} answered {r.status_code}: {_snippet(r.content)}"
    return DAUnavailableError(msg) if r.status_code >= 500 else DAProtocolError(msg)
