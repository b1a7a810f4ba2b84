"""The verified client's chain cache (verinfer.client.chain_view): answers kept for the TTL,
failed reads never kept and raised as ChainReadError, the cache bounded whatever keys an
operator makes it read. The reads themselves run on anvil in tests/e2e/test_client_verified.py."""

from __future__ import annotations

import pytest
from web3 import Web3

from verinfer.chain.deploy import Deployment
from verinfer.client.chain_view import MAX_CACHED, ChainReadError, ChainView

DEP = Deployment(31337, "0x" + "22" * 20, "0x" + "33" * 20, "0x" + "44" * 20,
                 "0x" + "11" * 20, "0x" + "55" * 20, 0)


def view(clock: list[float], ttl_s: float = 30.0) -> ChainView:
    return ChainView(w3=Web3(), deployment=DEP, ttl_s=ttl_s, clock=lambda: clock[0])


def test_an_answer_is_kept_for_the_ttl_then_read_again() -> None:
    clock, calls = [0.0], []
    v = view(clock)

    def read() -> int:
        calls.append(clock[0])
        return len(calls)
    assert [v._cached(("k",), read) for _ in range(3)] == [1, 1, 1]
    clock[0] = 29.9
    assert v._cached(("k",), read) == 1
    clock[0] = 30.0
    assert v._cached(("k",), read) == 2 and v.reads == 2


def test_a_failed_read_is_raised_and_not_kept() -> None:
    clock, calls = [0.0], []
    v = view(clock)

    def failing() -> int:
        calls.append(1)
        raise ConnectionError("no route")
    for _ in range(2):
        with pytest.raises(ChainReadError, match="no route"):
            v._cached(("k",), failing)
    assert len(calls) == 2 and v.reads == 0


def test_the_cache_is_bounded() -> None:
    v = view([0.0])
    for i in range(MAX_CACHED + 10):
        v._cached(("operator", i), lambda: True)
    assert len(v._cache) <= MAX_CACHED
