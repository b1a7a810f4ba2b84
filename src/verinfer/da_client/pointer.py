"""DA pointers: ``da://<backend>/0x<hex commitment>``, one spelling per pointer.

For ``local`` and ``redis`` the commitment is sha256(blob) (32 bytes). For ``eigenda`` the
proxy's commitment (a DA certificate) is not a hash of the blob, so the pointer carries
``sha256(blob) || certificate``: every pointer names the blob's sha256 in its first 32 bytes,
which is what :func:`DAClient.get` verifies and what a receipt's ``ciphertextHash`` equals.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from verinfer.da_client.errors import MalformedPointerError

BACKENDS = ("local", "redis", "eigenda")
# Stores the publishing operator runs itself (docs/da.md): it can rewrite the bytes under a key
# after publishing, so bytes that do not hash to the pointer are its doing, exactly like a blob
# it deleted. A reader counts such a mismatch as "absent" (never as its own DA trouble, which
# it would retry until the challenge ends without a vote). Under EigenDA the bytes are held by
# the DA network and checked by the proxy the reader runs: a mismatch there is the reader's.
OPERATOR_HOSTED = frozenset({"local", "redis"})
SCHEME = "da://"
SHA256_LEN = 32
MAX_COMMITMENT_BYTES = 64 * 1024  # EigenDA V2 certs are a few KiB; refuse absurd inputs early
_POINTER = re.compile(r"da://([a-z]+)/0x([0-9a-f]*)")


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class Pointer:
    """Where a blob lives and what it must hash to."""

    backend: str
    commitment: bytes

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise MalformedPointerError(
                f"unknown DA backend {self.backend!r}; expected one of {', '.join(BACKENDS)}",
                param="pointer")
        if not isinstance(self.commitment, bytes):
            raise MalformedPointerError(
                f"commitment must be bytes, got {type(self.commitment).__name__}",
                param="pointer")
        n = len(self.commitment)
        if self.backend == "eigenda":
            if not SHA256_LEN < n <= MAX_COMMITMENT_BYTES:
                raise MalformedPointerError(
                    f"an eigenda commitment is sha256 (32 bytes) + a non-empty certificate of at "
                    f"most {MAX_COMMITMENT_BYTES - SHA256_LEN} bytes, got {n} bytes",
                    param="pointer")
        elif n != SHA256_LEN:
            raise MalformedPointerError(
                f"a {self.backend} commitment is sha256 (32 bytes), got {n} bytes: "
                f"0x{self.commitment.hex()}", param="pointer")

    @classmethod
    def parse(cls, text: str) -> Pointer:
        """Parse the canonical form; lower-case hex only, so each pointer has one spelling."""
        if not isinstance(text, str):
            raise MalformedPointerError(f"a DA pointer must be a string, got {text!r}",
                                        param="pointer")
        m = _POINTER.fullmatch(text)
        if m is None or len(m.group(2)) % 2:
            shown = text if len(text) <= 200 else text[:200] + "…"
            raise MalformedPointerError(
                f"malformed DA pointer {shown!r}; expected da://<backend>/0x<lower-case hex>",
                param="pointer")
        return cls(m.group(1), bytes.fromhex(m.group(2)))

    @classmethod
    def for_blob(cls, backend: str, blob: bytes) -> Pointer:
        """The pointer of a content-addressed backend (local, redis): known before upload."""
        if backend == "eigenda":
            raise MalformedPointerError(
                "an eigenda pointer needs the proxy's certificate; it is known only after upload",
                param="pointer")
        return cls(backend, sha256(blob))

    @property
    def blob_sha256(self) -> bytes:
        """sha256 of the blob this pointer names (= a receipt's ciphertextHash)."""
        return self.commitment[:SHA256_LEN]

    @property
    def certificate(self) -> bytes:
        """The backend-native commitment: the EigenDA cert, or sha256 for local/redis."""
        return self.commitment[SHA256_LEN:] if self.backend == "eigenda" else self.commitment

    def __str__(self) -> str:
        return f"{SCHEME}{self.backend}/0x{self.commitment.hex()}"


def mismatch_counts_as_absent(pointer: Pointer) -> bool:
    """True when bytes that do not match ``pointer`` can only come from the publisher
    (an operator-hosted store): readers then treat them as a missing blob."""
    return pointer.backend in OPERATOR_HOSTED
