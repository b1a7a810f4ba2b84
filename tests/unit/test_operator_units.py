"""Pure pieces of the operator: stream text deltas, rate limits, API keys, choice seeds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verinfer.errors import AuthenticationError, RateLimitError
from verinfer.operator.generation import TextDeltas
from verinfer.operator.security import ApiKeys, RateLimiter
from verinfer.protocol.request_rule import choice_seed


@given(st.text(alphabet="ab\ufffdc", max_size=30), st.lists(st.text("abc", min_size=1,
                                                                   max_size=3), max_size=3))
def test_deltas_concatenate_to_the_final_text_and_never_show_a_stop(text: str,
                                                                   stops: list[str]) -> None:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    final = text[:cut]
    d = TextDeltas(stops)
    out = ""
    for i in range(1, cut + 1):  # the engine reports the growing text, stop-cut
        out += d.delta(text[:i], finished=False)
        assert not any(s in out for s in stops)
    out += d.delta(final, finished=True)
    assert out == final


def test_deltas_hold_a_split_utf8_sequence() -> None:
    d = TextDeltas(())
    assert d.delta("ab\ufffd", finished=False) == "ab"
    assert d.delta("abé", finished=False) == "é"


def test_rate_limiter_refills_with_the_injected_clock() -> None:
    now = [0.0]
    rl = RateLimiter(60, burst=2, clock=lambda: now[0])
    rl.acquire("a"), rl.acquire("a")
    with pytest.raises(RateLimitError) as e:
        rl.acquire("a")
    assert 0 < e.value.retry_after <= 1.0
    rl.acquire("b")  # per caller
    now[0] = 1.0
    rl.acquire("a")


def test_api_keys() -> None:
    assert ApiKeys().check(None) == "open"
    keys = ApiKeys(["sk-1"])
    assert keys.check("Bearer sk-1").startswith("key-")
    for bad in (None, "sk-1", "Bearer sk-2", "Basic sk-1"):
        with pytest.raises(AuthenticationError):
            keys.check(bad)


def test_choice_seeds() -> None:
    assert choice_seed(5, 0) == 5
    assert len({choice_seed(5, i) for i in range(8)}) == 8
