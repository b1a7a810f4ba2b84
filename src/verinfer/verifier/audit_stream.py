"""Light audits over Redis Streams.

Keys (all under one prefix, so devnets and tests never collide):
- ``<prefix>audit:jobs``    jobs; consumer group ``verifiers``; one entry per receipt to audit:
  fields ``job`` (id), ``receipt`` (SignedReceipt JSON), ``ciphertext`` (DA pointer).
- ``<prefix>audit:reports`` signed reports (``report`` = SignedAuditReport JSON).
- ``<prefix>audit:dead``    jobs that failed ``max_deliveries`` times, with the last error.

A worker reads new entries with XREADGROUP, and first takes over entries that sat unacknowledged
for ``min_idle_ms`` (its own failed attempts or those of a crashed worker) with XAUTOCLAIM. An
entry is XACKed only after its report is on the reports stream (at-least-once; a report may be
written twice if a worker dies between XADD and XACK — reports carry the job id). An entry
delivered more than ``max_deliveries`` times goes to the dead-letter stream and is acked.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from verinfer.errors import VerinferError
from verinfer.kms.protocol import AuditAssignment
from verinfer.protocol.jsonsafe import loads_untrusted
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.errors import AuditJobError
from verinfer.verifier.reports import AuditReport, SignedAuditReport
from verinfer.verifier.votes import Verdict

GROUP = "verifiers"


@dataclass(frozen=True)
class StreamKeys:
    prefix: str

    @property
    def jobs(self) -> str:
        return f"{self.prefix}audit:jobs"

    @property
    def reports(self) -> str:
        return f"{self.prefix}audit:reports"

    @property
    def dead(self) -> str:
        return f"{self.prefix}audit:dead"


@dataclass(frozen=True)
class AuditJob:
    job_id: str
    signed: SignedReceipt
    ciphertext: str  # DA pointer
    #: per-receipt KMS epochs: the audit scheduler's signed assignment (docs/kms.md §8)
    assignment: AuditAssignment | None = None

    def fields(self) -> dict[str, str]:
        f = {"job": self.job_id, "receipt": json.dumps(self.signed.to_json()),
             "ciphertext": self.ciphertext}
        if self.assignment is not None:
            f["assignment"] = json.dumps(self.assignment.to_json())
        return f

    @classmethod
    def parse(cls, f: dict[str, str]) -> AuditJob:
        try:
            assignment = None
            if f.get("assignment") is not None:
                assignment = AuditAssignment.from_json(loads_untrusted(
                    f["assignment"], max_bytes=4 * 1024, what="audit job assignment"))
            return cls(f["job"], SignedReceipt.from_json(
                loads_untrusted(f["receipt"], max_bytes=64 * 1024, what="audit job receipt")),
                       f["ciphertext"], assignment)
        except (KeyError, ValueError, VerinferError) as e:
            raise AuditJobError(f"malformed audit job {f!r:.200}: {e}") from e


def ensure_group(r: redis.Redis, keys: StreamKeys) -> None:
    try:
        r.xgroup_create(keys.jobs, GROUP, id="0", mkstream=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


class AuditQueue:
    """The watcher's side: enqueue jobs, read reports."""

    def __init__(self, r: redis.Redis, keys: StreamKeys,
                 new_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> None:
        self.r, self.keys, self.new_id = r, keys, new_id
        ensure_group(r, keys)

    def enqueue(self, signed: SignedReceipt, ciphertext: str,
                assignment: AuditAssignment | None = None) -> str:
        job = AuditJob(self.new_id(), signed, ciphertext, assignment)
        self.r.xadd(self.keys.jobs, job.fields())  # type: ignore[arg-type]
        return job.job_id

    def reports(self, after: str = "0-0") -> list[tuple[str, SignedAuditReport]]:
        out = []
        rows: Any = self.r.xrange(self.keys.reports, min=f"({after}" if after != "0-0" else "-")
        for entry_id, f in rows:
            out.append((str(entry_id), SignedAuditReport.from_json(
                loads_untrusted(f["report"], max_bytes=64 * 1024, what="audit report"))))
        return out

    def dead_letters(self) -> list[dict[str, str]]:
        rows: Any = self.r.xrange(self.keys.dead)
        return [dict(f) for _, f in rows]


Judge = Callable[[AuditJob], Verdict]
ReportSink = Callable[[SignedAuditReport], None]


@dataclass
class WorkerStats:
    done: int = 0
    failed_attempts: int = 0
    dead: int = 0
    errors: list[str] = field(default_factory=list)


class AuditWorker:
    """One consumer of the jobs stream. ``judge`` runs the enclave flow for a job and returns
    the verdict; ``sink`` (optional) records the signed report on chain (AuditLog)."""

    def __init__(self, r: redis.Redis, keys: StreamKeys, *, consumer: str, account: Any,
                 judge: Judge, sink: ReportSink | None = None, max_deliveries: int = 3,
                 min_idle_ms: int = 30_000, block_ms: int = 1000,
                 now: Callable[[], float] = time.time) -> None:
        self.r, self.keys, self.consumer, self.account = r, keys, consumer, account
        self.judge, self.sink = judge, sink
        self.max_deliveries, self.min_idle_ms, self.block_ms = max_deliveries, min_idle_ms, block_ms
        self.now = now
        self.stats = WorkerStats()
        ensure_group(r, keys)

    def _claim_stale(self) -> list[tuple[str, dict[str, str]]]:
        res: Any = self.r.xautoclaim(self.keys.jobs, GROUP, self.consumer, self.min_idle_ms,
                                     start_id="0-0", count=10)
        return [(i, f) for i, f in res[1] if f]  # entries deleted meanwhile come back empty

    def _deliveries(self, entry_id: str) -> int:
        p: Any = self.r.xpending_range(self.keys.jobs, GROUP, min=entry_id, max=entry_id,
                                       count=1)
        return int(p[0]["times_delivered"]) if p else 1

    def process_once(self) -> int:
        """Handles stale entries first, else waits up to block_ms for new ones; returns how
        many entries were handled (acked, failed or dead-lettered)."""
        entries = self._claim_stale()
        if not entries:
            got: Any = self.r.xreadgroup(GROUP, self.consumer, {self.keys.jobs: ">"}, count=1,
                                         block=self.block_ms)
            entries = [(i, f) for _, msgs in (got or []) for i, f in msgs]
        for entry_id, f in entries:
            self._handle(entry_id, f)
        return len(entries)

    def _handle(self, entry_id: str, f: dict[str, str]) -> None:
        n = self._deliveries(entry_id)
        if n > self.max_deliveries:
            self._dead_letter(entry_id, f, f"delivered {n} times, giving up")
            return
        try:
            job = AuditJob.parse(f)
        except AuditJobError as e:  # a malformed job never succeeds: dead-letter at once
            self._dead_letter(entry_id, f, e.message)
            return
        try:
            verdict = self.judge(job)
            report = SignedAuditReport.sign(AuditReport(
                job.job_id, job.signed.digest, self.account.address, verdict,
                int(self.now())), self.account)
            if self.sink is not None:
                self.sink(report)
        except Exception as e:  # retried via XAUTOCLAIM after min_idle_ms
            msg = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
            self.stats.failed_attempts += 1
            self.stats.errors.append(msg)
            self.r.hset(f"{self.keys.prefix}audit:last-error", entry_id, msg)
            return
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.keys.reports, {"job": job.job_id, "report": json.dumps(report.to_json())})
        pipe.xack(self.keys.jobs, GROUP, entry_id)
        pipe.hdel(f"{self.keys.prefix}audit:last-error", entry_id)
        pipe.execute()
        self.stats.done += 1

    def _dead_letter(self, entry_id: str, f: dict[str, str], why: str) -> None:
        last = self.r.hget(f"{self.keys.prefix}audit:last-error", entry_id)
        pipe = self.r.pipeline(transaction=True)
        dead: dict[Any, Any] = {**f, "entry": entry_id, "error": why,
                                "last_error": str(last or "")}
        pipe.xadd(self.keys.dead, dead)
        pipe.xack(self.keys.jobs, GROUP, entry_id)
        pipe.hdel(f"{self.keys.prefix}audit:last-error", entry_id)
        pipe.execute()
        self.stats.dead += 1

    def run(self, stop: Callable[[], bool]) -> None:
        while not stop():
            self.process_once()
