"""The background publisher: outbox entries -> DA -> Merkle batches -> manifest -> BatchSink.

One step (:meth:`Publisher.run_once`) does, in order: upload due queued ciphertexts (in
parallel), form batches when ``batch_max_entries`` are published or the oldest published entry
waited ``batch_max_age_s``, upload built manifests, hand published manifests to the sink. Any
step can be repeated after a crash (see :mod:`verinfer.da_client.outbox`).

Failures back off exponentially with jitter: a DAUnavailableError (backend down, EigenDA 503)
pauses all uploads to that backend until its retry time, and with a ``fallback_da`` the blobs
(ciphertexts and manifests) go there meanwhile (fail over); any other error backs off only the
entry or batch concerned. Nothing is ever dropped: a failing entry stays queued, its error
visible in ``Outbox.status()``. Clock, sleep and jitter source are injectable.

Only one publisher may run per outbox: it holds an exclusive ``flock`` on ``<db>.publisher.lock``
(released by the OS if the process dies).
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

from verinfer.da_client.base import DAClient
from verinfer.da_client.errors import DAUnavailableError, PublisherBusyError
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.sinks import BatchCommitment, BatchSink
from verinfer.errors import VerinferError
from verinfer.receipts.signed import SignedReceipt


@dataclass(frozen=True)
class Backoff:
    """delay(n) = min(max_s, base_s * factor**(n-1)) scaled by a factor in [1-jitter, 1+jitter]."""

    base_s: float = 0.2
    factor: float = 2.0
    max_s: float = 60.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: Callable[[], float]) -> float:
        raw = min(self.max_s, self.base_s * self.factor ** max(0, attempt - 1))
        return raw * (1.0 + self.jitter * (2.0 * rng() - 1.0))


@dataclass(frozen=True)
class StepReport:
    published: int = 0
    failed: int = 0
    batches_formed: int = 0
    manifests_published: int = 0
    batches_committed: int = 0

    @property
    def progressed(self) -> bool:
        return bool(self.published or self.batches_formed or self.manifests_published
                    or self.batches_committed)


class Publisher:
    def __init__(self, outbox: Outbox, da: DAClient, sink: BatchSink, *,
                 manifest_da: DAClient | None = None, fallback_da: DAClient | None = None,
                 batch_max_entries: int = 256,
                 batch_max_age_s: float = 2.0, backoff: Backoff | None = None,
                 put_workers: int = 8, step_entries: int = 512,
                 step_bytes: int = 64 * 1024 * 1024, poll_interval_s: float = 0.05,
                 now: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None,
                 rng: Callable[[], float] = random.random) -> None:
        if batch_max_entries < 1:
            raise ValueError(f"batch_max_entries must be >= 1, got {batch_max_entries}")
        self.outbox = outbox
        self.da = da
        self.manifest_da = manifest_da or da
        self.fallback_da = fallback_da  # takes blobs while the primary is unavailable (503)
        self.sink = sink
        self.batch_max_entries = batch_max_entries
        self.batch_max_age_s = batch_max_age_s
        self.backoff = backoff or Backoff()
        self.step_entries = step_entries
        self.step_bytes = step_bytes
        self.poll_interval_s = poll_interval_s
        self.now = now or outbox.now
        self.rng = rng
        self._stop = threading.Event()
        self._sleep = sleep or self._interruptible_sleep
        self._pool = ThreadPoolExecutor(max_workers=put_workers,
                                        thread_name_prefix="da-put") if put_workers > 1 else None
        self._da_failures = 0
        self._da_retry_at = 0.0
        self._thread: threading.Thread | None = None
        self._lockfile: IO[bytes] | None = None
        self.last_error: str | None = None

    # ---- one step ------------------------------------------------------------------------
    def run_once(self, *, flush: bool = False) -> StepReport:
        """One pass over every stage. ``flush`` batches whatever is published now."""
        published, failed = self._publish_entries()
        formed = self._form_batches(flush)
        manifests = self._publish_manifests()
        committed = self._commit_batches()
        return StepReport(published, failed, formed, manifests, committed)

    def _publish_entries(self) -> tuple[int, int]:
        primary_paused = self.now() < self._da_retry_at
        if primary_paused and self.fallback_da is None:
            return 0, 0
        due = self.outbox.due_queued(self.step_entries, self.step_bytes)
        if not due:
            return 0, 0
        payloads = [e.payload for e in due]
        results: list[tuple[Pointer | None, Exception | None]]
        if primary_paused:
            results = [(None, DAUnavailableError(f"{self.da.backend} paused until retry"))] * \
                len(due)
        else:
            results = self._put_all(self.da, payloads)
            self._note_primary(results)
        if self.fallback_da is not None:  # fail over what the primary could not take
            retry = [i for i, (_, e) in enumerate(results) if isinstance(e, DAUnavailableError)]
            if retry:
                for i, r in zip(retry, self._put_all(self.fallback_da,
                                                     [payloads[i] for i in retry]), strict=True):
                    results[i] = r
        done: list[tuple[int, str]] = []
        failed = 0
        unavailable: str | None = None
        unavailable_ids: list[int] = []
        for entry, (pointer, err) in zip(due, results, strict=True):
            if pointer is not None:
                done.append((entry.id, str(pointer)))
                continue
            failed += 1
            assert err is not None
            if isinstance(err, DAUnavailableError):
                unavailable = _describe(err)  # the backend is paused, not this entry
                unavailable_ids.append(entry.id)
            else:
                self.outbox.mark_entry_failed(
                    entry.id, _describe(err),
                    self.now() + self.backoff.delay(entry.attempts + 1, self.rng))
        if done:
            self.outbox.mark_published(done)
        if unavailable is not None:
            self.outbox.note_entry_errors(unavailable_ids, unavailable)
            self.last_error = unavailable
        return len(done), failed

    def _put_all(self, da: DAClient,
                 blobs: list[bytes]) -> list[tuple[Pointer | None, Exception | None]]:
        if da.batched_puts:
            try:
                return [(p, None) for p in da.put_many(blobs)]
            except Exception:
                pass  # one by one below tells which blob failed and why
        if self._pool is not None:
            return list(self._pool.map(lambda b: self._try_put(da, b), blobs))
        return [self._try_put(da, b) for b in blobs]

    def _note_primary(self, results: list[tuple[Pointer | None, Exception | None]]) -> None:
        """Pause the primary backend after an availability failure, exponentially longer each
        time; any success resets it."""
        if any(isinstance(e, DAUnavailableError) for _, e in results):
            self._da_failures += 1
            self._da_retry_at = self.now() + self.backoff.delay(self._da_failures, self.rng)
        elif any(p is not None for p, _ in results):
            self._da_failures = 0

    @staticmethod
    def _try_put(da: DAClient, blob: bytes) -> tuple[Pointer | None, Exception | None]:
        try:
            return da.put(blob), None
        except Exception as e:  # every failure is recorded and retried; none escapes the step
            return None, e

    def _form_batches(self, flush: bool) -> int:
        formed = 0
        while True:
            n, oldest = self.outbox.published_backlog()
            if n == 0:
                return formed
            full = n >= self.batch_max_entries
            aged = oldest is not None and self.now() - oldest >= self.batch_max_age_s
            if not (full or aged or flush):
                return formed
            entries = self.outbox.oldest_published(self.batch_max_entries)
            if not entries:
                return formed
            signed = [SignedReceipt.from_bytes(e.receipt) for e in entries]
            # A manifest names one EIP-712 domain: a batch ends where the domain changes.
            same = next((i for i, s in enumerate(signed) if s.domain != signed[0].domain),
                        len(signed))
            entries, signed = entries[:same], signed[:same]
            manifest = build_manifest([ManifestEntry(s, Pointer.parse(e.pointer))
                                       for s, e in zip(signed, entries, strict=True)])
            self.outbox.form_batch(entries, manifest.root, manifest.to_bytes())
            formed += 1

    def _publish_manifests(self) -> int:
        n = 0
        for b in self.outbox.batches_in("built"):
            pointer: Pointer | None = None
            err: Exception | None
            if self.manifest_da is self.da and self.now() < self._da_retry_at:
                err = DAUnavailableError(f"{self.da.backend} paused until retry")
            else:
                pointer, err = self._try_put(self.manifest_da, b.manifest)
                if self.manifest_da is self.da:
                    self._note_primary([(pointer, err)])
            if isinstance(err, DAUnavailableError) and self.fallback_da is not None:
                pointer, err = self._try_put(self.fallback_da, b.manifest)
            if pointer is None:
                assert err is not None
                self._batch_failed(b.id, b.attempts, err)
                break  # keep batch order; the rest wait for this one
            self.outbox.mark_batch_published(b.id, str(pointer))
            n += 1
        return n

    def _commit_batches(self) -> int:
        n = 0
        for b in self.outbox.batches_in("published"):
            assert b.manifest_pointer is not None
            try:
                self.sink.commit(BatchCommitment(b.id, b.root, b.leaf_count,
                                                 Pointer.parse(b.manifest_pointer)))
            except Exception as e:
                self._batch_failed(b.id, b.attempts, e)
                break
            self.outbox.mark_batch_committed(b.id)
            n += 1
        return n

    def _batch_failed(self, batch_id: int, attempts: int, err: Exception) -> None:
        self.last_error = _describe(err)
        self.outbox.mark_batch_failed(batch_id, self.last_error,
                                      self.now() + self.backoff.delay(attempts + 1, self.rng))

    # ---- loops ---------------------------------------------------------------------------
    def drain(self, timeout_s: float = 60.0) -> bool:
        """Run steps (flushing partial batches) until every entry is committed; False on
        timeout. Waits between steps with the injectable sleep, so fake clocks work."""
        own_lock = self._lockfile is None
        if own_lock:
            self._acquire_lock()
        try:
            deadline = self.now() + timeout_s
            while True:
                report = self.run_once(flush=True)
                if self.outbox.pending_count() == 0:
                    return True
                if self.now() >= deadline:
                    return False
                if not report.progressed:
                    self._sleep(self._idle_wait())
        finally:
            if own_lock:
                self._release_lock()

    def _idle_wait(self) -> float:
        """Until the next retry falls due, but at most one poll interval."""
        now = self.now()
        wait = self.poll_interval_s
        for t in (self.outbox.next_due_at(), self._da_retry_at):
            if t is not None and now < t:
                wait = min(wait, t - now)
        return max(wait, 0.001)

    def start(self) -> Publisher:
        """Take the publisher lock and run steps in a daemon thread until :meth:`stop`."""
        self._acquire_lock()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="da-publisher", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, drain_timeout_s: float | None = None) -> None:
        """Stop the thread (optionally draining first) and release the lock."""
        if drain_timeout_s is not None and self._thread is not None:
            deadline = time.monotonic() + drain_timeout_s
            while self.outbox.pending_count() and time.monotonic() < deadline:
                self.outbox.enqueued.set()
                time.sleep(0.01)
        self._stop.set()
        self.outbox.enqueued.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._release_lock()

    def close(self) -> None:
        self.stop()
        if self._pool is not None:
            self._pool.shutdown()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                report = self.run_once()
            except Exception as e:  # e.g. disk full: keep the thread alive, surface the error
                self.last_error = _describe(e)
                report = StepReport()
            if not report.progressed:
                self._sleep(self._idle_wait())

    def _interruptible_sleep(self, seconds: float) -> None:
        # wakes early on enqueue (new work) or stop
        self.outbox.enqueued.wait(timeout=seconds)
        self.outbox.enqueued.clear()

    def _acquire_lock(self) -> None:
        path = f"{self.outbox.path}.publisher.lock"
        f = open(path, "ab")  # noqa: SIM115 - held open for the publisher's lifetime
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise PublisherBusyError(f"another publisher holds {path}") from None
        f.truncate(0)
        f.write(str(os.getpid()).encode())
        f.flush()
        self._lockfile = f

    def _release_lock(self) -> None:
        if self._lockfile is not None:
            fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
            self._lockfile.close()
            self._lockfile = None


def _describe(err: BaseException) -> str:
    msg = err.message if isinstance(err, VerinferError) else str(err)
    return f"{type(err).__name__}: {msg}"
