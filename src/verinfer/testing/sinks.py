"""A batch sink that keeps commitments in memory: the outbox's and the publisher's tests and the
DA benchmark hand batches to it instead of a chain or a file."""

from __future__ import annotations

import threading

from verinfer.da_client.sinks import BatchCommitment


class InMemoryBatchSink:
    """Keeps commitments in a list, once per root (a ``BatchSink``); counts every call, so a
    test sees the at-least-once repeats."""

    def __init__(self) -> None:
        self.batches: list[BatchCommitment] = []
        self.calls = 0
        self._roots: set[bytes] = set()
        self._lock = threading.Lock()

    def commit(self, batch: BatchCommitment) -> None:
        with self._lock:
            self.calls += 1
            if batch.root not in self._roots:
                self._roots.add(batch.root)
                self.batches.append(batch)
