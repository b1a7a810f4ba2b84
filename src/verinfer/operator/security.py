"""API keys and per-key rate limits.

Keys are compared by their SHA-256 so the server never needs the plaintext list in memory
longer than start-up. With no keys configured the API is open and limits apply per client
address instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from verinfer.errors import AuthenticationError, RateLimitError


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._digests = [key_digest(k) for k in keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @staticmethod
    def presents_key(authorization: str | None) -> bool:
        """Whether an Authorization header offers a bearer key at all (right or wrong)."""
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and bool(token.strip())

    def check(self, authorization: str | None) -> str:
        """The caller's identity for rate limiting: a key fingerprint (keys on) or 'open'."""
        if not self.enabled:
            return "open"
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
        d = key_digest(token.strip())
        if not any(hmac.compare_digest(d, known) for known in self._digests):
            raise AuthenticationError("incorrect API key provided")
        return "key-" + d[:8].hex()

    def digest(self, authorization: str | None) -> bytes | None:
        """sha256 of the presented key when keys are on and it is one of them, else None:
        what a receipt stores as its owner."""
        if not self.enabled:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        d = key_digest(token.strip())
        return d if any(hmac.compare_digest(d, k) for k in self._digests) else None


@dataclass
class _Bucket:
    tokens: float
    at: float


#: Callers whose buckets are kept. Without keys a caller is a client address, and an IPv6
#: client has 2^64 of them: one bucket per address ever seen grew the server's memory without
#: bound. Past this many, refilled buckets (the same as a new one) are dropped, then the
#: least recently used down to half.
MAX_CALLERS = 100_000


class RateLimiter:
    """Token bucket per caller: ``per_minute`` requests, bursting up to ``burst``."""

    def __init__(self, per_minute: float, burst: int | None = None, *,
                 clock: Callable[[], float], max_callers: int = MAX_CALLERS) -> None:
        if per_minute <= 0:
            raise ValueError(f"per_minute must be > 0, got {per_minute}")
        self.rate = per_minute / 60.0
        self.burst = float(burst if burst is not None else max(1, math.ceil(per_minute / 6)))
        self.clock = clock
        self.max_callers = max_callers
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def _evict(self, now: float) -> None:
        """Drop refilled buckets; if that is not enough, the least recently used down to half
        the bound (a dropped caller starts again with a full burst). O(n), once per n/2 new
        callers at worst."""
        self._buckets = {k: b for k, b in self._buckets.items()
                         if b.tokens + (now - b.at) * self.rate < self.burst}
        if len(self._buckets) > self.max_callers // 2:
            recent = sorted(self._buckets.items(), key=lambda kv: kv[1].at)
            self._buckets = dict(recent[len(recent) - self.max_callers // 2:])

    def acquire(self, caller: str) -> None:
        with self._lock:
            now = self.clock()
            b = self._buckets.get(caller)
            if b is None:
                if len(self._buckets) >= self.max_callers:
                    self._evict(now)
                b = self._buckets[caller] = _Bucket(self.burst, now)
            b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
            b.at = now
            if b.tokens < 1.0:
                wait = (1.0 - b.tokens) / self.rate
                raise RateLimitError(f"rate limit reached for {caller}: "
                                     f"{self.rate * 60:g} requests per minute; retry in "
                                     f"{wait:.1f} s", retry_after=wait)
            b.tokens -= 1.0

    def tokens(self, caller: str) -> float:
        """``caller``'s tokens now (a full burst for one never seen), without taking any."""
        with self._lock:
            b = self._buckets.get(caller)
            if b is None:
                return self.burst
            return min(self.burst, b.tokens + (self.clock() - b.at) * self.rate)


class AuthThrottle:
    """Failed API-key checks per client address, in a token bucket of their own: a failure
    takes a token, and an address without one gets 429 for every attempt (its key is not
    looked at, so a right guess cannot show) until the bucket refills. Without it keys could
    be guessed at line rate (issue 32.8: 300 wrong keys, 300 answers of 401, no 429). Only
    failures are charged: a client with a valid key never waits on this bucket unless its
    address has been failing."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    def require(self, address: str) -> None:
        if self.limiter.tokens(address) < 1.0:
            wait = (1.0 - self.limiter.tokens(address)) / self.limiter.rate
            raise RateLimitError(f"too many failed API key checks from this address; retry in "
                                 f"{wait:.1f} s", retry_after=wait)

    def failed(self, address: str) -> None:
        with contextlib.suppress(RateLimitError):  # the bucket is empty now: the next is 429
            self.limiter.acquire(address)
