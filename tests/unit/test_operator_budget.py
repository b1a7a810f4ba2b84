"""The operator's token budget (verinfer.operator.budget): admission, and every share given
back exactly once — by its job's future when done, or by ``release_rest`` when never run."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from verinfer.errors import EngineOverloadedError
from verinfer.operator.budget import TokenBudget


def test_per_request_and_total_bounds() -> None:
    b = TokenBudget(per_request=100, total=150)
    with pytest.raises(EngineOverloadedError) as e:
        b.reserve([60, 41])
    assert e.value.code == "request_over_budget" and b.held == 0
    r = b.reserve([50, 50])
    with pytest.raises(EngineOverloadedError) as e:
        b.reserve([51])
    assert e.value.code == "engine_overloaded" and e.value.retry_after == 1.0  # type: ignore[attr-defined]
    assert b.held == 100
    b.reserve([50])
    assert b.held == 150
    r.release_rest()
    assert b.held == 50


def test_shares_come_back_once_when_futures_finish_or_are_cancelled() -> None:
    b = TokenBudget(per_request=100, total=100)
    r = b.reserve([10, 20, 30])
    done: Future[int] = Future()
    cancelled: Future[int] = Future()
    r.attach(0, done)
    r.attach(1, cancelled)
    r.release_rest()  # job 2 never ran: its 30 come back; the running two are still held
    assert b.held == 30
    done.set_result(1)
    cancelled.cancel()
    assert b.held == 0
    r.release_rest()
    assert b.held == 0


def test_defaults_follow_the_window() -> None:
    b = TokenBudget.for_window(2048)
    assert (b.per_request, b.total) == (4 * 2048, 8 * 2048)
    assert TokenBudget.for_window(2048, per_request=20_000).total == 20_000
    with pytest.raises(ValueError):
        TokenBudget(per_request=10, total=5)
