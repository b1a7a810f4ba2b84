"""One 160-byte request took the operator's memory (issue 32.2).

The attack: ``{"prompt": [[1]]*16, "n": 8, "max_tokens": <window - 1>}`` asks for 128 jobs of a
whole window each. The engine allocated every job's KV cache at submit, and nothing bounded
the jobs a request or the queue could hold: at --max-context 2048 one such body grew a
server's RSS from 882 to 3,205 MB; at the default window one body committed ~36 GiB. Who
gains: a griefer, for one small request.

Fix: the engine allocates a job's cache when it schedules it (tests/unit/
test_engine_kv_at_schedule.py), and the operator budgets tokens (prompt + max_tokens, times
every prompt and choice) per request and for every request in progress
(``verinfer.operator.budget``), answering 503 in OpenAI's error shape beyond either, before
any job reaches the engine. Real HTTP: the operator app on loopback (tiny model, window 2048).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from support.inproc import serving
from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel
from verinfer.httpserve import ServeLimits
from verinfer.operator.app import ServerConfig, create_app
from verinfer.operator.budget import TokenBudget

LIMITS = ServeLimits(max_body_bytes=4 * 1024 * 1024)
HOSTILE = {"model": "tiny", "prompt": [[1]] * 16, "n": 8, "max_tokens": 2047,
           "temperature": 0}


def _wait(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture
def engine(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    eng = Engine(tiny_loaded, "invariant", max_seqs=4, max_batch_tokens=48)
    yield eng
    eng.close()


def test_a_body_asking_for_128_windows_is_refused_before_the_engine(engine: Engine) -> None:
    app = create_app(engine, "tiny", ServerConfig(http_limits=LIMITS))
    budget: TokenBudget = app.state.token_budget
    with serving(app, LIMITS) as (host, port), \
            httpx.Client(base_url=f"http://{host}:{port}", timeout=10) as c:
        t0 = time.monotonic()
        r = c.post("/v1/completions", json=HOSTILE)
        took = time.monotonic() - t0
        assert r.status_code == 503, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "request_over_budget" and err["type"] == "server_error"
        assert str(budget.per_request) in err["message"]
        assert took < 2, took
        # nothing reached the engine, nothing is held
        assert engine.in_flight == 0 and engine.kv_bytes == 0 and budget.held == 0
        # a request inside the budget is served as before
        ok = c.post("/v1/completions", json={**HOSTILE, "prompt": [1], "n": 2,
                                             "max_tokens": 3})
        assert ok.status_code == 200, ok.text[:300]
        _wait(lambda: budget.held == 0, 5, "the served request's tokens were not given back")


def test_the_budget_of_requests_in_progress_is_shared_and_given_back(engine: Engine) -> None:
    """Budget 2,100 tokens in all: one long stream holds 2,001; the next long request is 503
    with Retry-After; when the stream's client leaves, its share comes back."""
    cfg = ServerConfig(http_limits=LIMITS, max_request_tokens=2100, max_queued_tokens=2100)
    app = create_app(engine, "tiny", cfg)
    budget: TokenBudget = app.state.token_budget
    long = {"model": "tiny", "prompt": [1], "max_tokens": 2000, "temperature": 0.9, "seed": 3}
    with serving(app, LIMITS) as (host, port), \
            httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as c:
        with c.stream("POST", "/v1/completions", json={**long, "stream": True}) as s:
            assert s.status_code == 200
            assert budget.held == 2001  # reserved before the response started
            r = c.post("/v1/completions", json=long)
            assert r.status_code == 503, r.text[:300]
            assert r.json()["error"]["code"] == "engine_overloaded"
            assert r.headers["Retry-After"] == "1"
            assert engine.in_flight == 1  # the refused one never reached the engine
        _wait(lambda: budget.held == 0 and engine.in_flight == 0, 10,
              "the stream's share was not given back when its client left")
        assert c.post("/v1/completions", json={**long, "max_tokens": 3}).status_code == 200
        _wait(lambda: budget.held == 0, 5, "not given back")
