"""When the operator must not sign: named blockers, each owned by one monitor.

A receipt is a promise with a deadline (publish within ``publicationDeadline``, be challengeable
under an approved identity). Signing one the operator cannot keep makes it slashable, so the
server refuses completions (503 in OpenAI's shape, with ``Retry-After``) while any blocker is
set, reports them in ``/health`` and the ``verinfer_ready`` metric, and resumes by itself once
the monitor that set a blocker clears it. Two monitors exist:

* :class:`BacklogMonitor` — the publication outbox: stop before the oldest receipt not yet
  committed on the sink can reach its publication deadline (issue 14.7).
* the chain identity check (:mod:`verinfer.operator.runtime`) — model id and approved engine
  fingerprint hash must be on ProtocolConfig's allowlists (issue 13.5).

Monitors run in one daemon thread (:class:`MonitorThread`) with an injectable interval and
wait function, so tests drive them step by step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from verinfer.errors import ServerError
from verinfer.httpserve import redact_urls

log = logging.getLogger(__name__)


class NotReadyError(ServerError):
    """503: the operator cannot issue a receipt it could honour right now."""

    status_code = 503
    code = "operator_not_ready"

    def __init__(self, message: str, *, retry_after: float) -> None:
        # sent to clients: never a chain RPC's credentials from an exception's text
        super().__init__(redact_urls(message))
        self.retry_after = retry_after


@dataclass(frozen=True)
class Blocker:
    reason: str
    retry_after_s: float


class Readiness:
    """Thread-safe set of blockers by name; ready when empty."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blockers: dict[str, Blocker] = {}

    def block(self, name: str, reason: str, retry_after_s: float = 5.0) -> None:
        reason = redact_urls(reason)  # served by the public /health
        with self._lock:
            new = name not in self._blockers or self._blockers[name].reason != reason
            self._blockers[name] = Blocker(reason, retry_after_s)
        if new:
            log.warning("not signing receipts (%s): %s", name, reason)

    def clear(self, name: str) -> None:
        with self._lock:
            gone = self._blockers.pop(name, None)
        if gone is not None:
            log.warning("resumed signing receipts (%s cleared)", name)

    @property
    def ready(self) -> bool:
        with self._lock:
            return not self._blockers

    def reasons(self) -> dict[str, str]:
        with self._lock:
            return {k: b.reason for k, b in sorted(self._blockers.items())}

    def require(self) -> None:
        """Raise :class:`NotReadyError` naming every blocker (call before any work)."""
        with self._lock:
            if not self._blockers:
                return
            items = sorted(self._blockers.items())
        retry = max(b.retry_after_s for _, b in items)
        text = "; ".join(f"{k}: {b.reason}" for k, b in items)
        raise NotReadyError(f"the operator is not signing receipts now ({text})",
                            retry_after=retry)


class BacklogMonitor:
    """Blocks signing while the oldest receipt not yet committed is older than ``stop_after_s``.

    ``stop_after_s`` must leave a margin below the publication deadline: receipts signed until
    the blocker trips still need the publisher to upload and commit them once DA/the chain is
    back. Age is measured from the entry's enqueue time (the receipt's issuedAt, same clock).
    Also blocks when more than ``max_pending`` entries wait (bounded disk and drain time).
    """

    NAME = "publication_backlog"

    def __init__(self, readiness: Readiness, oldest_pending_at: Callable[[], float | None],
                 pending_count: Callable[[], int], *, stop_after_s: float,
                 max_pending: int = 100_000, clock: Callable[[], float] = time.time,
                 retry_after_s: float = 5.0, last_error: Callable[[], str | None] = lambda: None
                 ) -> None:
        if stop_after_s <= 0:
            raise ValueError(f"stop_after_s must be > 0, got {stop_after_s}")
        self.readiness, self.oldest_pending_at = readiness, oldest_pending_at
        self.pending_count, self.stop_after_s, self.max_pending = (pending_count, stop_after_s,
                                                                   max_pending)
        self.clock, self.retry_after_s, self.last_error = clock, retry_after_s, last_error

    def __call__(self) -> None:
        oldest = self.oldest_pending_at()
        age = 0.0 if oldest is None else max(0.0, self.clock() - oldest)
        pending = self.pending_count() if oldest is not None else 0
        if age >= self.stop_after_s:
            err = self.last_error()
            self.readiness.block(self.NAME, (
                f"the oldest unpublished receipt is {age:.0f} s old (limit {self.stop_after_s:g}"
                f" s before its publication deadline); publisher: {err or 'no error yet'}"),
                self.retry_after_s)
        elif pending > self.max_pending:
            self.readiness.block(self.NAME, f"{pending} receipts wait for publication (limit "
                                 f"{self.max_pending})", self.retry_after_s)
        else:
            self.readiness.clear(self.NAME)


class MonitorThread:
    """Runs every check once per ``interval_s`` in a daemon thread until :meth:`stop`. A
    check that raises sets its own blocker (an unknown state is not a safe state)."""

    def __init__(self, readiness: Readiness, checks: Sequence[tuple[str, Callable[[], None]]],
                 *, interval_s: float = 1.0) -> None:
        self.readiness, self.checks, self.interval_s = readiness, list(checks), interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        for name, check in self.checks:
            try:
                check()
            except Exception as e:  # recorded as a blocker; the loop lives on
                self.readiness.block(name, f"check failed: {type(e).__name__}: {e}",
                                     self.interval_s)

    def start(self) -> MonitorThread:
        self.run_once()  # ready/not-ready is known before the first request is served
        self._thread = threading.Thread(target=self._loop, name="operator-readiness",
                                        daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
