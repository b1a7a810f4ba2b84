"""Best-effort zeroization of secrets held in Python.

What this can do: overwrite the bytearrays we own (shares, the epoch seed) in place, so their
memory no longer holds the secret once the job is done. What it cannot do in CPython: ints are
immutable (Shamir arithmetic creates short-lived int copies of shares and the secret), ``bytes``
returned by libraries (HPKE plaintexts) are immutable copies freed but not cleared, the
allocator may have moved buffers, and OpenSSL-held private keys are released when the last
Python reference goes (OpenSSL clears EVP key memory on free). A real TEE bounds the exposure
to enclave memory; the software enclave bounds nothing. See docs/kms.md.
"""

from __future__ import annotations

from collections.abc import Iterable


def wipe(buf: bytearray) -> None:
    buf[:] = bytes(len(buf))


def wipe_all(bufs: Iterable[bytearray]) -> None:
    for b in bufs:
        wipe(b)
