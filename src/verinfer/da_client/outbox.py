"""The durable publication outbox: no acknowledged response without its published evidence.

The operator calls :meth:`Outbox.enqueue` with (receipt digest, receipt bytes, ciphertext) and
returns the response only after it returns: by then the entry is committed to SQLite and fsynced.
A :class:`~verinfer.da_client.publisher.Publisher` moves entries through

    queued -> published (ciphertext on DA) -> batched (in a manifest) -> committed (sink took it)

Every transition is one SQLite transaction and every step is repeatable: DA puts are
content-addressed, a batch's manifest bytes are stored before upload, and sinks are idempotent
by root, so re-running after a crash at any point neither loses nor duplicates an entry.

SQLite runs in WAL mode with ``synchronous=FULL``: each commit fsyncs the WAL, so an
acknowledged entry survives power loss and OS crashes, not only a process crash (which is all
``NORMAL`` guarantees in WAL mode). Measured cost here: ~0.25 ms per commit.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.da_client.errors import OutboxConflictError, OutboxError
from verinfer.da_client.pointer import sha256
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.signed import SignedReceipt

ENTRY_STATES = ("queued", "published", "batched", "committed")
BATCH_STATES = ("built", "published", "committed")
SCHEMA_VERSION = 2  # 2: entries.owner (sha256 of the API key that paid for the receipt)
DEFAULT_MAX_PAYLOAD_BYTES = 32 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    receipt_digest  BLOB NOT NULL UNIQUE,
    receipt         BLOB NOT NULL,
    payload         BLOB NOT NULL,
    payload_sha256  BLOB NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('queued','published','batched','committed')),
    enqueued_at     REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    last_error      TEXT,
    pointer         TEXT,
    published_at    REAL,
    batch_id        INTEGER REFERENCES batches(id),
    leaf_index      INTEGER,
    owner           BLOB,
    UNIQUE (batch_id, leaf_index)
);
CREATE INDEX IF NOT EXISTS entries_by_state ON entries (state, id);
CREATE TABLE IF NOT EXISTS batches (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    root             BLOB NOT NULL UNIQUE,
    leaf_count       INTEGER NOT NULL,
    manifest         BLOB NOT NULL,
    manifest_pointer TEXT,
    state            TEXT NOT NULL CHECK (state IN ('built','published','committed')),
    created_at       REAL NOT NULL,
    committed_at     REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL NOT NULL DEFAULT 0,
    last_error       TEXT
);
CREATE INDEX IF NOT EXISTS batches_by_state ON batches (state, id);
"""


@dataclass(frozen=True)
class QueuedEntry:
    id: int
    receipt_digest: bytes
    payload: bytes
    attempts: int


@dataclass(frozen=True)
class PublishedEntry:
    id: int
    receipt_digest: bytes
    receipt: bytes
    pointer: str


@dataclass(frozen=True)
class BatchRow:
    id: int
    root: bytes
    leaf_count: int
    manifest: bytes
    manifest_pointer: str | None
    state: str
    attempts: int
    created_at: float
    committed_at: float | None


@dataclass(frozen=True)
class OutboxStatus:
    entries: dict[str, int]  # per entry state
    batches: dict[str, int]  # per batch state
    oldest_unpublished_age_s: float | None
    last_batch: BatchRow | None
    last_error: str | None

    @property
    def pending(self) -> int:
        """Entries not yet committed, plus batches not yet committed."""
        e = self.entries
        return e["queued"] + e["published"] + e["batched"] + self.batches["built"] + \
            self.batches["published"]

    def to_json(self) -> dict[str, object]:
        b = self.last_batch
        return {
            "entries": self.entries, "batches": self.batches,
            "oldest_unpublished_age_s": self.oldest_unpublished_age_s,
            "last_batch": None if b is None else {
                "id": b.id, "root": to_hex(b.root), "leaf_count": b.leaf_count,
                "manifest": b.manifest_pointer, "state": b.state, "created_at": b.created_at,
                "committed_at": b.committed_at},
            "last_error": self.last_error,
        }


class Outbox:
    """SQLite-backed durable queue. Thread-safe; one connection guarded by a lock."""

    def __init__(self, path: str | Path, *, now: Callable[[], float] = time.time,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 unsafe_synchronous_normal: bool = False) -> None:
        self.path = Path(path)
        self.now = now
        self.max_payload_bytes = max_payload_bytes
        self.enqueued = threading.Event()  # set on every enqueue; the publisher waits on it
        self._lock = threading.RLock()
        self._group = threading.Condition()
        self._waiting: list[_Pending] = []
        self._leader_active = False
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=30.0)
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise OutboxError(f"outbox {self.path} cannot use WAL mode (got {mode!r})")
        self._db.execute(f"PRAGMA synchronous={'NORMAL' if unsafe_synchronous_normal else 'FULL'}")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._tx():
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            # 0: a new file. Any other version is refused, never migrated: the schema's version
            # is bumped when it changes (v1, without entries.owner, never shipped).
            if version not in (0, SCHEMA_VERSION):
                raise OutboxError(f"outbox {self.path} has schema version {version}; this code "
                                  f"knows {SCHEMA_VERSION}")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # ---- producer side ---------------------------------------------------------------------
    def enqueue(self, receipt_digest: bytes, receipt: bytes, payload: bytes) -> int:
        """Durably record one entry; returns its id once committed (fsynced).

        Idempotent: the same digest with the same bytes returns the existing id; the same digest
        with different bytes raises OutboxConflictError. Concurrent callers are group-committed:
        one caller (the leader) writes everything queued so far in one transaction and one
        fsync, and each caller returns only after the transaction holding its entry committed.
        """
        req = _Pending(self._check_entry(receipt_digest, receipt, payload))
        with self._group:
            self._waiting.append(req)
            while not req.done and self._leader_active:
                self._group.wait()
            if req.done:
                return req.result()
            self._leader_active = True
            batch, self._waiting = self._waiting, []
        try:
            results = self._insert([r.entry for r in batch], per_entry_errors=True)
        except BaseException as e:  # the whole transaction failed: nobody in it is durable
            results = [e] * len(batch)
        with self._group:
            for r, res in zip(batch, results, strict=True):
                r.finish(res)
            self._leader_active = False
            self._group.notify_all()
        self.enqueued.set()
        return req.result()

    def enqueue_many(self, items: Sequence[tuple[bytes, bytes, bytes]], *,
                     owner: bytes | None = None) -> list[int]:
        """Several entries in one transaction (one fsync); all or none. ``owner`` (sha256 of
        the paying API key) is stored with each new entry."""
        checked = [self._check_entry(*it) for it in items]
        ids = [r for r in self._insert(checked, per_entry_errors=False, owner=owner)
               if isinstance(r, int)]
        self.enqueued.set()
        return ids

    def _insert(self, checked: Sequence[tuple[bytes, bytes, bytes, bytes]], *,
                per_entry_errors: bool, owner: bytes | None = None
                ) -> list[int | BaseException]:
        out: list[int | BaseException] = []
        with self._tx():
            t = self.now()
            for digest, receipt, payload, payload_hash in checked:
                cur = self._db.execute(
                    "INSERT INTO entries (receipt_digest, receipt, payload, payload_sha256, state,"
                    " enqueued_at, owner) VALUES (?, ?, ?, ?, 'queued', ?, ?)"
                    " ON CONFLICT (receipt_digest) DO NOTHING",
                    (digest, receipt, payload, payload_hash, t, owner))
                if cur.rowcount == 1:
                    out.append(int(cur.lastrowid or 0))
                    continue
                row = self._db.execute(
                    "SELECT id, receipt, payload_sha256 FROM entries WHERE receipt_digest = ?",
                    (digest,)).fetchone()
                if bytes(row[1]) == receipt and bytes(row[2]) == payload_hash:
                    out.append(int(row[0]))
                    continue
                err = OutboxConflictError(
                    f"receipt 0x{digest.hex()} is already queued (entry {row[0]}) with "
                    "different receipt or ciphertext bytes", param="receipt_digest")
                if not per_entry_errors:
                    raise err  # rolls the whole transaction back
                out.append(err)  # wrote nothing for this entry; the others still commit
        return out

    def _check_entry(self, digest: bytes, receipt: bytes,
                     payload: bytes) -> tuple[bytes, bytes, bytes, bytes]:
        for name, v in (("receipt_digest", digest), ("receipt", receipt), ("payload", payload)):
            if not isinstance(v, bytes):
                raise OutboxError(f"{name} must be bytes, got {type(v).__name__}", param=name)
        if len(digest) != 32:
            raise OutboxError(f"receipt_digest must be 32 bytes, got {len(digest)}: "
                              f"0x{digest.hex()}", param="receipt_digest")
        if len(payload) > self.max_payload_bytes:
            raise OutboxError(f"ciphertext of {len(payload)} bytes exceeds the DA limit of "
                              f"{self.max_payload_bytes}", param="payload")
        # Refuse now what could never be batched later: the receipt must decode, name this
        # digest, and commit to exactly this ciphertext.
        try:
            signed = SignedReceipt.from_bytes(receipt)
        except VerinferError as e:
            raise OutboxError(f"receipt 0x{digest.hex()} does not decode: {e.message}",
                              param="receipt") from e
        if signed.digest != digest:
            raise OutboxError(f"receipt bytes carry digest 0x{signed.digest.hex()}, not "
                              f"0x{digest.hex()}", param="receipt_digest")
        payload_hash = sha256(payload)
        if signed.receipt.ciphertext_hash != payload_hash:
            raise OutboxError(
                f"receipt 0x{digest.hex()} has ciphertextHash "
                f"0x{signed.receipt.ciphertext_hash.hex()}, but the ciphertext's sha256 is "
                f"0x{payload_hash.hex()}", param="payload")
        return digest, receipt, payload, payload_hash

    # ---- publisher side (used by Publisher; each call is one transaction) --------------------
    def due_queued(self, limit: int, max_bytes: int = 64 * 1024 * 1024) -> list[QueuedEntry]:
        """Oldest due queued entries: at most ``limit`` of them and about ``max_bytes`` of
        ciphertext (always at least one), so a step never loads an unbounded amount."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, receipt_digest, payload, attempts FROM entries WHERE id IN ("
                " SELECT id FROM (SELECT id, sum(length(payload)) OVER (ORDER BY id) AS upto,"
                "  length(payload) AS size FROM entries WHERE state = 'queued'"
                "  AND next_attempt_at <= ? ORDER BY id LIMIT ?)"
                " WHERE upto - size < ?) ORDER BY id",
                (self.now(), limit, max_bytes)).fetchall()
        return [QueuedEntry(r[0], bytes(r[1]), bytes(r[2]), r[3]) for r in rows]

    def mark_published(self, done: Iterable[tuple[int, str]]) -> int:
        n = 0
        with self._tx():
            t = self.now()
            for entry_id, pointer in done:
                n += self._db.execute(
                    "UPDATE entries SET state = 'published', pointer = ?, published_at = ?,"
                    " last_error = NULL WHERE id = ? AND state = 'queued'",
                    (pointer, t, entry_id)).rowcount
        return n

    def mark_entry_failed(self, entry_id: int, error: str, retry_at: float) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE entries SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?"
                " WHERE id = ? AND state = 'queued'", (retry_at, error[:1000], entry_id))

    def note_entry_errors(self, entry_ids: Sequence[int], error: str) -> None:
        """Count a failed attempt (backend down) without rescheduling the entries."""
        with self._tx():
            self._db.executemany(
                "UPDATE entries SET attempts = attempts + 1, last_error = ?"
                " WHERE id = ? AND state = 'queued'", [(error[:1000], i) for i in entry_ids])

    def published_backlog(self) -> tuple[int, float | None]:
        """(entries published but not batched, published_at of the oldest)."""
        with self._lock:
            n, oldest = self._db.execute(
                "SELECT count(*), min(published_at) FROM entries WHERE state = 'published'"
            ).fetchone()
        return int(n), oldest

    def oldest_published(self, max_entries: int) -> list[PublishedEntry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, receipt_digest, receipt, pointer FROM entries"
                " WHERE state = 'published' ORDER BY id LIMIT ?", (max_entries,)).fetchall()
        return [PublishedEntry(r[0], bytes(r[1]), bytes(r[2]), r[3]) for r in rows]

    def form_batch(self, entries: Sequence[PublishedEntry], root: bytes, manifest: bytes) -> int:
        """Record a batch and assign ``entries`` (leaf order) to it in one transaction. The
        manifest is built by the caller outside the lock, so producers are not blocked; if any
        entry is no longer 'published' the transaction rolls back."""
        with self._tx():
            cur = self._db.execute(
                "INSERT INTO batches (root, leaf_count, manifest, state, created_at)"
                " VALUES (?, ?, ?, 'built', ?)", (root, len(entries), manifest, self.now()))
            batch_id = int(cur.lastrowid or 0)
            changed = 0
            for i, e in enumerate(entries):
                changed += self._db.execute(
                    "UPDATE entries SET state = 'batched', batch_id = ?, leaf_index = ?"
                    " WHERE id = ? AND state = 'published'", (batch_id, i, e.id)).rowcount
            if changed != len(entries):
                raise OutboxError(f"batch of {len(entries)} entries: only {changed} were still "
                                  "published (is a second publisher running?)")
        return batch_id

    def pending_count(self) -> int:
        """Entries not yet committed plus batches not yet committed (index lookups only)."""
        with self._lock:
            e = self._db.execute("SELECT count(*) FROM entries WHERE state IN"
                                 " ('queued', 'published', 'batched')").fetchone()[0]
            b = self._db.execute("SELECT count(*) FROM batches WHERE state IN"
                                 " ('built', 'published')").fetchone()[0]
        return int(e) + int(b)

    def oldest_pending_at(self) -> float | None:
        """enqueued_at of the oldest entry not yet committed (None when all are): the receipt
        closest to its publication deadline. Ids grow with time, so the index finds it."""
        with self._lock:
            # one (state, id) index probe per state: committed history is never scanned
            row = self._db.execute(
                "SELECT enqueued_at FROM entries WHERE id = (SELECT min(m) FROM ("
                " SELECT min(id) AS m FROM entries WHERE state = 'queued' UNION ALL"
                " SELECT min(id) FROM entries WHERE state = 'published' UNION ALL"
                " SELECT min(id) FROM entries WHERE state = 'batched'))").fetchone()
        return None if row is None else float(row[0])

    def batches_in(self, state: str, *, due_only: bool = True) -> list[BatchRow]:
        if state not in BATCH_STATES:
            raise ValueError(f"unknown batch state {state!r}")
        with self._lock:
            rows = self._db.execute(
                _BATCH_SELECT + " WHERE state = ? AND next_attempt_at <= ? ORDER BY id",
                (state, self.now() if due_only else float("inf"))).fetchall()
        return [_batch_row(r) for r in rows]

    def mark_batch_published(self, batch_id: int, manifest_pointer: str) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE batches SET state = 'published', manifest_pointer = ?, attempts = 0,"
                " next_attempt_at = 0, last_error = NULL WHERE id = ? AND state = 'built'",
                (manifest_pointer, batch_id))

    def mark_batch_committed(self, batch_id: int) -> None:
        with self._tx():
            t = self.now()
            self._db.execute(
                "UPDATE batches SET state = 'committed', committed_at = ?, last_error = NULL"
                " WHERE id = ? AND state = 'published'", (t, batch_id))
            self._db.execute("UPDATE entries SET state = 'committed' WHERE batch_id = ?"
                             " AND state = 'batched'", (batch_id,))

    def mark_batch_failed(self, batch_id: int, error: str, retry_at: float) -> None:
        with self._tx():
            self._db.execute(
                "UPDATE batches SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?"
                " WHERE id = ?", (retry_at, error[:1000], batch_id))

    def next_due_at(self) -> float | None:
        """Earliest retry time among queued entries and unfinished batches."""
        with self._lock:
            a = self._db.execute("SELECT min(next_attempt_at) FROM entries"
                                 " WHERE state = 'queued'").fetchone()[0]
            b = self._db.execute("SELECT min(next_attempt_at) FROM batches"
                                 " WHERE state != 'committed'").fetchone()[0]
        vals = [v for v in (a, b) if v is not None]
        return min(vals) if vals else None

    # ---- inspection --------------------------------------------------------------------------
    def status(self) -> OutboxStatus:
        with self._lock:
            entries = dict.fromkeys(ENTRY_STATES, 0)
            for state, n in self._db.execute(
                    "SELECT state, count(*) FROM entries GROUP BY state"):
                entries[state] = n
            batches = dict.fromkeys(BATCH_STATES, 0)
            for state, n in self._db.execute(
                    "SELECT state, count(*) FROM batches GROUP BY state"):
                batches[state] = n
            oldest = self._db.execute("SELECT min(enqueued_at) FROM entries"
                                      " WHERE state = 'queued'").fetchone()[0]
            last = self._db.execute(_BATCH_SELECT + " ORDER BY id DESC LIMIT 1").fetchone()
            err = self._db.execute(
                "SELECT last_error FROM entries WHERE state = 'queued' AND last_error IS NOT NULL"
                " UNION ALL SELECT last_error FROM batches WHERE state != 'committed'"
                " AND last_error IS NOT NULL LIMIT 1").fetchone()
        age = None if oldest is None else max(0.0, self.now() - oldest)
        return OutboxStatus(entries, batches, age, None if last is None else _batch_row(last),
                            None if err is None else err[0])

    def entry_state(self, receipt_digest: bytes) -> tuple[str, str | None, int | None] | None:
        """(state, ciphertext pointer, batch id) of one entry, or None if unknown."""
        with self._lock:
            row = self._db.execute("SELECT state, pointer, batch_id FROM entries"
                                   " WHERE receipt_digest = ?", (receipt_digest,)).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def receipt(self, receipt_digest: bytes) -> bytes | None:
        """The stored receipt bytes of one entry (kept after the payload is pruned)."""
        with self._lock:
            row = self._db.execute("SELECT receipt FROM entries WHERE receipt_digest = ?",
                                   (receipt_digest,)).fetchone()
        return None if row is None else bytes(row[0])

    def receipt_owner(self, receipt_digest: bytes) -> bytes | None:
        """sha256 of the API key that paid for the receipt (None: open API or older entry)."""
        with self._lock:
            row = self._db.execute("SELECT owner FROM entries WHERE receipt_digest = ?",
                                   (receipt_digest,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def batch(self, batch_id: int) -> BatchRow | None:
        with self._lock:
            row = self._db.execute(_BATCH_SELECT + " WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else _batch_row(row)

    def all_batches(self) -> list[BatchRow]:
        with self._lock:
            rows = self._db.execute(_BATCH_SELECT + " ORDER BY id").fetchall()
        return [_batch_row(r) for r in rows]

    def prune_committed_payloads(self, committed_before: float) -> int:
        """Drop the local ciphertext copy of entries whose batch was committed before the
        given time (the DA holds them); the rows stay as the audit trail."""
        with self._tx():
            return self._db.execute(
                "UPDATE entries SET payload = X'' WHERE state = 'committed' AND batch_id IN"
                " (SELECT id FROM batches WHERE committed_at < ?) AND length(payload) > 0",
                (committed_before,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)


_BATCH_SELECT = ("SELECT id, root, leaf_count, manifest, manifest_pointer, state, attempts,"
                 " created_at, committed_at FROM batches")


def _batch_row(r: Any) -> BatchRow:  # a sqlite row of _BATCH_SELECT
    return BatchRow(int(r[0]), bytes(r[1]), int(r[2]), bytes(r[3]), r[4], str(r[5]), int(r[6]),
                    float(r[7]), None if r[8] is None else float(r[8]))


class _Pending:
    """One caller's entry waiting for a group commit."""

    def __init__(self, entry: tuple[bytes, bytes, bytes, bytes]) -> None:
        self.entry = entry
        self.done = False
        self._result: int | BaseException = 0

    def finish(self, result: int | BaseException) -> None:
        self._result = result
        self.done = True

    def result(self) -> int:
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT under the outbox lock; ROLLBACK on any exception."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            if exc_type is None:
                self._db.execute("COMMIT")
            else:
                self._db.execute("ROLLBACK")
        finally:
            self._lock.release()


__all__ = ["BATCH_STATES", "ENTRY_STATES", "BatchRow", "Outbox",
           "OutboxStatus", "PublishedEntry", "QueuedEntry"]
