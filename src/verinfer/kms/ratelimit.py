"""Token bucket per key (the requester address) with an injectable clock."""

from __future__ import annotations

import threading
from collections.abc import Callable

from verinfer.kms.errors import RateLimitedError


class TokenBucketLimiter:
    def __init__(self, capacity: float, refill_per_s: float, now: Callable[[], float],
                 *, max_keys: int = 100_000) -> None:
        if capacity < 1 or refill_per_s <= 0:
            raise ValueError(f"need capacity >= 1 and refill > 0, got {capacity}, {refill_per_s}")
        self.capacity = capacity
        self.refill_per_s = refill_per_s
        self._now = now
        self._max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)
        self._lock = threading.Lock()

    def take(self, key: str) -> None:
        with self._lock:
            now = self._now()
            tokens, last = self._buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.refill_per_s)
            if tokens < 1:
                wait = (1 - tokens) / self.refill_per_s
                self._buckets[key] = (tokens, now)
                raise RateLimitedError(f"rate limit for {key}: retry in {wait:.1f}s")
            if len(self._buckets) >= self._max_keys and key not in self._buckets:
                self._evict_full(now)
            self._buckets[key] = (tokens - 1, now)

    def _evict_full(self, now: float) -> None:
        # Buckets that have refilled completely carry no state worth keeping.
        for k, (t, last) in list(self._buckets.items()):
            if t + (now - last) * self.refill_per_s >= self.capacity:
                del self._buckets[k]
