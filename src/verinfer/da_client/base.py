"""The one DA interface. Backends implement raw storage; verification lives here, once.

``get`` is final: every backend's bytes are checked against the pointer's sha256 before they
reach the caller, so no backend can skip verification.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import final

from verinfer.da_client.errors import (
    BackendMismatchError,
    BlobTooLargeError,
    CommitmentMismatchError,
)
from verinfer.da_client.pointer import Pointer, sha256

DEFAULT_MAX_BLOB_BYTES = 32 * 1024 * 1024  # the EigenDA proxy's body limit; same everywhere


class DAClient(ABC):
    """put(blob) -> Pointer; get(pointer) -> verified bytes; exists(pointer)."""

    backend: str
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES

    # A backend that stores many blobs at the cost of one (one transaction, one fsync) says so;
    # the outbox publisher then hands it whole steps through put_many.
    batched_puts: bool = False

    @final
    def put(self, blob: bytes) -> Pointer:
        """Store ``blob`` durably; idempotent (the same bytes give the same pointer)."""
        return self.put_many([blob])[0]

    @final
    def put_many(self, blobs: Sequence[bytes]) -> list[Pointer]:
        """Store several blobs durably, all or (on an exception) possibly only some."""
        checked = [self._check_blob(b) for b in blobs]
        digests = [sha256(b) for b in checked]
        pointers = self._put_many(checked, digests)
        for pointer, digest in zip(pointers, digests, strict=True):
            if pointer.backend != self.backend or pointer.blob_sha256 != digest:
                raise CommitmentMismatchError(
                    f"{self.backend} returned pointer {_short(pointer)} for a blob with sha256 "
                    f"0x{digest.hex()}")
        return pointers

    def _check_blob(self, blob: object) -> bytes:
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise TypeError(f"a blob must be bytes, got {type(blob).__name__}")
        blob = bytes(blob)
        if len(blob) > self.max_blob_bytes:
            raise BlobTooLargeError(
                f"blob of {len(blob)} bytes exceeds the {self.backend} limit of "
                f"{self.max_blob_bytes} bytes", param="blob")
        return blob

    def _put_many(self, blobs: Sequence[bytes], digests: Sequence[bytes]) -> list[Pointer]:
        return [self._put(b, d) for b, d in zip(blobs, digests, strict=True)]

    @final
    def get(self, pointer: Pointer) -> bytes:
        """The blob, verified against the pointer; raises instead of returning other bytes."""
        self._check_backend(pointer)
        blob = self._get(pointer)
        got = sha256(blob)
        if got != pointer.blob_sha256:
            raise CommitmentMismatchError(
                f"{self.backend} returned {len(blob)} bytes with sha256 0x{got.hex()} for "
                f"{_short(pointer)}; expected sha256 0x{pointer.blob_sha256.hex()}",
                param="pointer")
        return blob

    @final
    def exists(self, pointer: Pointer) -> bool:
        """Whether the backend still holds the blob (not verified; use get for that)."""
        self._check_backend(pointer)
        return self._exists(pointer)

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release connections."""

    def _check_backend(self, pointer: Pointer) -> None:
        if not isinstance(pointer, Pointer):
            raise TypeError(f"expected a Pointer, got {type(pointer).__name__}")
        if pointer.backend != self.backend:
            raise BackendMismatchError(
                f"pointer {_short(pointer)} is for backend {pointer.backend!r}, this client "
                f"serves {self.backend!r}", param="pointer")

    @abstractmethod
    def _put(self, blob: bytes, digest: bytes) -> Pointer: ...

    @abstractmethod
    def _get(self, pointer: Pointer) -> bytes:
        """Raw stored bytes; raise BlobNotFoundError when absent."""

    @abstractmethod
    def _exists(self, pointer: Pointer) -> bool: ...


def _short(pointer: Pointer) -> str:
    s = str(pointer)
    return s if len(s) <= 120 else s[:120] + "…"
