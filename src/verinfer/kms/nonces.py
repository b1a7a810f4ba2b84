"""Single-use nonces with a short expiry, issued by one shard and held in its memory only
(a restart forgets them, which only makes outstanding nonces invalid)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from verinfer.kms.errors import (
    NonceCapacityError,
    NonceExpiredError,
    NonceReplayedError,
    NonceUnknownError,
)
from verinfer.kms.protocol import NONCE_LEN
from verinfer.kms.sealing import TokenBytes


@dataclass(frozen=True)
class NonceGrant:
    nonce: bytes
    expires_at: float


class NonceBook:
    def __init__(self, ttl_s: float, now: Callable[[], float], *, capacity: int = 10_000,
                 token_bytes: TokenBytes = secrets.token_bytes) -> None:
        if ttl_s <= 0:
            raise ValueError(f"nonce ttl must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._now = now
        self._capacity = capacity
        self._token = token_bytes
        self._expiry: dict[bytes, float] = {}
        # Used nonces are remembered until their expiry passes, then an unknown nonce is refused
        # anyway; the used set therefore stays as small as the live set.
        self._used: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def issue(self) -> NonceGrant:
        with self._lock:
            self._prune()
            if len(self._expiry) >= self._capacity:
                raise NonceCapacityError(f"{len(self._expiry)} outstanding nonces; try later")
            nonce = self._token(NONCE_LEN)
            exp = self._now() + self.ttl_s
            self._expiry[nonce] = exp
            return NonceGrant(nonce, exp)

    def consume(self, nonce: bytes) -> None:
        """Mark used; raise if unknown, expired or already used. A nonce is spent by the first
        release attempt that names it, whether that attempt succeeds or not."""
        with self._lock:
            now = self._now()
            if nonce in self._used:
                raise NonceReplayedError(f"nonce 0x{nonce.hex()[:16]}… was already used")
            exp = self._expiry.pop(nonce, None)
            if exp is None:
                raise NonceUnknownError(f"nonce 0x{nonce.hex()[:16]}… was not issued by this shard")
            self._used[nonce] = exp
            if now > exp:
                raise NonceExpiredError(
                    f"nonce 0x{nonce.hex()[:16]}… expired {now - exp:.1f}s ago")

    def _prune(self) -> None:
        now = self._now()
        for book in (self._expiry, self._used):
            for n in [n for n, e in book.items() if e < now]:
                del book[n]
