"""The operator's token budget: how much engine work (and KV memory) requests may hold.

A job's cost is the positions its KV cache holds: prompt + max_tokens. A request's cost is the
sum over its jobs (prompts x ``n`` choices), so one body of 16 one-token prompts x n=8 x
max_tokens near the window asks for 128 windows (issue 32.2: RSS 882 -> 3,205 MB at
``--max-context 2048``; ~36 GiB at the default window). Two bounds, both answered 503 (OpenAI
error shape) before any job reaches the engine:

- ``per_request``: one request's cost (``request_over_budget``; retrying does not help, ask
  for fewer tokens or choices);
- ``total``: the cost of every request admitted and not finished, server-wide
  (``engine_overloaded`` with ``Retry-After``).

A request's cost is reserved when it is admitted and each job's share given back when its
engine future is done (finished, failed or cancelled), or when the request ends without having
submitted it (``Reservation.release_rest``). docs/budgets.md ("operator") has the numbers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from verinfer.errors import EngineOverloadedError

#: Defaults, in windows of ``--max-context`` tokens: one request at most this many windows,
#: all requests together at most this many.
REQUEST_WINDOWS = 4
TOTAL_WINDOWS = 8


class TokenBudget:
    """Thread-safe (futures complete on the engine thread)."""

    def __init__(self, per_request: int, total: int) -> None:
        if not 0 < per_request <= total:
            raise ValueError(f"need 0 < per_request <= total, got {per_request}, {total}")
        self.per_request, self.total = per_request, total
        self._held = 0
        self._lock = threading.Lock()

    @classmethod
    def for_window(cls, window: int, per_request: int | None = None,
                   total: int | None = None) -> TokenBudget:
        """The defaults for a served window (``--max-context``) where a bound is not given."""
        req = per_request or REQUEST_WINDOWS * window
        return cls(req, total or max(req, TOTAL_WINDOWS * window))

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def reserve(self, costs: Sequence[int]) -> Reservation:
        """Admits a request whose jobs cost ``costs`` tokens, or raises EngineOverloadedError."""
        need = sum(costs)
        if need > self.per_request:
            raise EngineOverloadedError(
                f"this request asks for {need} tokens of engine work (prompt + max_tokens, "
                f"times every prompt and choice); this server takes at most "
                f"{self.per_request} per request: ask for fewer choices, prompts or "
                f"max_tokens", code="request_over_budget")
        with self._lock:
            if self._held + need > self.total:
                held = self._held
            else:
                self._held += need
                return Reservation(self, list(costs))
        e = EngineOverloadedError(
            f"the server is at its token budget ({held} of {self.total} tokens held by "
            f"requests in progress); retry shortly")
        e.retry_after = 1.0  # type: ignore[attr-defined]  # read by the error handler
        raise e

    def _give_back(self, tokens: int) -> None:
        with self._lock:
            self._held -= tokens


class Reservation:
    """One admitted request's share of the budget, job by job."""

    def __init__(self, budget: TokenBudget, costs: list[int]) -> None:
        self._budget, self._costs = budget, costs
        self._open = [True] * len(costs)
        self._attached = [False] * len(costs)
        self._lock = threading.Lock()

    def _release(self, index: int) -> None:
        with self._lock:
            if not self._open[index]:
                return
            self._open[index] = False
        self._budget._give_back(self._costs[index])

    def attach(self, index: int, fut: Future[Any]) -> None:
        """Job ``index`` now runs as ``fut``: its share is given back when ``fut`` is done
        (the engine drops a finished or cancelled job's KV cache by its next step)."""
        with self._lock:
            self._attached[index] = True
        fut.add_done_callback(lambda _f: self._release(index))

    def release_rest(self) -> None:
        """Gives back the share of every job never submitted: the request is over (answered,
        failed, or its client gone before its jobs started). Idempotent."""
        with self._lock:
            rest = [i for i, a in enumerate(self._attached) if not a]
        for i in rest:
            self._release(i)
