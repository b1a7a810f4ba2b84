"""A client with many addresses grows the open API's rate limiter without bound.

Without API keys the operator limits per client address, and kept one token bucket per address
ever seen, forever. An IPv6 client owns 2^64 addresses: one request from each new address is
~200 bytes of server memory that is never given back (10 M requests: ~2 GB), until the operator
is killed for memory. Who gains: a griefer, at the price of unanswered-or-answered requests it
would send anyway. Fix (``verinfer.operator.security.RateLimiter``): at most ``MAX_CALLERS``
buckets; refilled ones (the same as a new one) go first, then the least recently used.
"""

from __future__ import annotations

import pytest

from verinfer.errors import RateLimitError
from verinfer.operator.security import RateLimiter

BOUND = 100_000  # verinfer.operator.security.MAX_CALLERS


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def test_many_addresses_do_not_grow_the_limiter_without_bound() -> None:
    clock = Clock()
    limiter = RateLimiter(60, burst=2, clock=clock)
    for i in range(3 * BOUND):
        limiter.acquire(f"ip-2001:db8::{i:x}")
        clock.t += 0.0001  # all within a few seconds: none refills
    assert len(limiter._buckets) <= BOUND


def test_a_throttled_recent_caller_stays_throttled_and_refilled_ones_go_first() -> None:
    clock = Clock()
    limiter = RateLimiter(60, burst=1, clock=clock, max_callers=10)
    for i in range(9):
        limiter.acquire(f"old-{i}")
    clock.t += 120  # the old buckets refill: they are the same as new ones
    limiter.acquire("attacker")
    with pytest.raises(RateLimitError):
        limiter.acquire("attacker")
    for i in range(5):
        limiter.acquire(f"new-{i}")  # past the bound: the refilled buckets are dropped
    assert len(limiter._buckets) <= 10 and "old-0" not in limiter._buckets
    with pytest.raises(RateLimitError):
        limiter.acquire("attacker")
