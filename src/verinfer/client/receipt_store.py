"""The receipt keeper's local store: one SQLite file (stdlib ``sqlite3``) holding every receipt
the verified client accepted, where each stands (docs/client.md, "The receipt keeper"), the
batches read so far and the keeper's chain cursor.

Restart-safe: WAL journal, ``synchronous=FULL``, one transaction per state change (the row
and its history line together), a schema version in ``PRAGMA user_version`` (a file written
by a newer schema is refused, never rewritten). Several processes may share a file (an app
adding receipts, ``verinfer client watch`` following them): every update names the row
version it read and fails with :class:`StoreConflictError` if another writer moved it first.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from verinfer.errors import BadInputError, VerinferError
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.signed import SignedReceipt

#: The schema this code writes (``PRAGMA user_version``).
SCHEMA_VERSION = 1
#: How long a writer waits for another process's transaction (milliseconds).
BUSY_TIMEOUT_MS = 10_000


class State(StrEnum):
    """Where a kept receipt stands. The happy path: pending -> batched -> available -> final.
    The faults: ``claimed`` (an unpublished claim is open on chain), ``slashed`` (the claim
    was upheld: the operator paid), ``unavailable`` (committed, but its ciphertext or manifest
    is not on DA with the right hash by the availability deadline), ``late`` (its deadline
    passed and no claim was filed: a watch-only keeper, or the claim window closed)."""

    PENDING = "pending"
    BATCHED = "batched"
    AVAILABLE = "available"
    FINAL = "final"
    CLAIMED = "claimed"
    SLASHED = "slashed"
    UNAVAILABLE = "unavailable"
    LATE = "late"


#: States nothing moves a receipt out of.
TERMINAL = frozenset({State.FINAL, State.SLASHED, State.UNAVAILABLE, State.LATE})
#: Terminal states that mean the operator failed the receipt.
FAULTS = frozenset({State.SLASHED, State.UNAVAILABLE, State.LATE})


class StoreError(VerinferError):
    """The receipt store cannot be opened or read (a newer schema, a corrupt file, a store of
    another deployment)."""

    code = "receipt_store"


class StoreConflictError(StoreError):
    """Another writer changed the receipt since it was read; re-read and decide again."""

    code = "receipt_store_conflict"


class UnknownReceiptError(BadInputError):
    """No receipt with that id is kept here."""

    code = "unknown_receipt"


@dataclass(frozen=True)
class Kept:
    """One receipt's row. Chain times are the chain's block timestamps (seconds)."""

    id: str  # 0x + 64 hex: the EIP-712 digest
    signed: SignedReceipt
    state: State
    version: int = 0  # bumped by every update (optimistic concurrency)
    publish_by: int | None = None  # issuedAt + publicationDeadline
    deadline: int | None = None  # the next chain time something must have happened by
    batch_root: str | None = None
    leaf_index: int | None = None
    committed_at: int | None = None
    ciphertext: str | None = None  # the DA pointer of its ciphertext (from the manifest)
    final_after: int | None = None  # committedAt + challengeWindow
    claim_id: int | None = None
    claim_answered: bool = False  # the operator answered our claim: it was published
    failures: int = 0  # failed chain/DA calls in a row (reset by progress)
    last_error: str | None = None
    note: str | None = None  # why it is where it is (the last transition's reason)
    added_at: float = 0.0
    updated_at: float = 0.0

    @property
    def operator(self) -> str:
        return self.signed.receipt.operator

    @property
    def issued_at(self) -> int:
        return self.signed.receipt.issued_at

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "signed"}
        d["state"] = str(self.state)
        d["operator"], d["issued_at"] = self.operator, self.issued_at
        return d


_COLUMNS = ("id", "signed", "state", "version", "publish_by", "deadline", "batch_root",
            "leaf_index", "committed_at", "ciphertext", "final_after", "claim_id",
            "claim_answered", "failures", "last_error", "note", "added_at", "updated_at")

_SCHEMA = """
CREATE TABLE receipts (
    id TEXT PRIMARY KEY, signed TEXT NOT NULL, operator TEXT NOT NULL,
    issued_at INTEGER NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL,
    publish_by INTEGER, deadline INTEGER, batch_root TEXT, leaf_index INTEGER,
    committed_at INTEGER, ciphertext TEXT, final_after INTEGER, claim_id INTEGER,
    claim_answered INTEGER NOT NULL, failures INTEGER NOT NULL, last_error TEXT, note TEXT,
    added_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE INDEX receipts_state ON receipts(state);
CREATE TABLE history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, at REAL NOT NULL,
    state TEXT NOT NULL, note TEXT);
CREATE TABLE leaves (
    digest TEXT NOT NULL, operator TEXT NOT NULL, root TEXT NOT NULL,
    leaf_index INTEGER NOT NULL, siblings TEXT NOT NULL, ciphertext TEXT NOT NULL,
    committed_at INTEGER NOT NULL, PRIMARY KEY (digest, root));
CREATE TABLE batches (
    root TEXT NOT NULL, operator TEXT NOT NULL, leaf_count INTEGER NOT NULL,
    pointer TEXT NOT NULL, block INTEGER NOT NULL, committed_at INTEGER,
    read INTEGER NOT NULL, error TEXT, PRIMARY KEY (operator, root));
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Leaf:
    """A receipt found in a committed batch's manifest, with its proof under the root."""

    digest: str
    operator: str
    root: str
    leaf_index: int
    siblings: tuple[str, ...]
    ciphertext: str
    committed_at: int


@dataclass(frozen=True)
class BatchRow:
    root: str
    operator: str
    leaf_count: int
    pointer: str
    block: int
    committed_at: int | None = None
    read: bool = False
    error: str | None = None


def default_path() -> Path:
    """``$VERINFER_RECEIPTS`` if set, else ``receipts.sqlite`` in the user's data directory
    (``$XDG_DATA_HOME/verinfer``, ``~/.local/share/verinfer``; ``%APPDATA%`` on Windows,
    ``~/Library/Application Support`` on macOS)."""
    if os.environ.get("VERINFER_RECEIPTS"):
        return Path(os.environ["VERINFER_RECEIPTS"])
    if os.name == "nt" and os.environ.get("APPDATA"):
        base = Path(os.environ["APPDATA"])
    elif os.uname().sysname == "Darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "verinfer" / "receipts.sqlite"


class ReceiptStore:
    """The store at ``path`` (created with its directory if absent; ``":memory:"`` for a
    throw-away one). ``clock``: wall time for the rows' added/updated stamps."""

    def __init__(self, path: str | Path | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = default_path() if path is None else path
        self.clock = clock
        if str(self.path) != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000,
                                       isolation_level=None, check_same_thread=False)
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            self._lock = threading.RLock()
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open the receipt store {self.path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ReceiptStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- schema ------------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._tx() as db:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} was written by a newer verinfer (schema "
                                 f"{version}; this one knows {SCHEMA_VERSION})")
            if version == 0:
                tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                                    ).fetchone()[0]
                if tables:
                    raise StoreError(f"{self.path} is an SQLite file but not a receipt store")
                db.executescript_in_tx(_SCHEMA)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _tx(self) -> Iterator[_Tx]:
        """One IMMEDIATE transaction (the write lock taken at once: no upgrade deadlock)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield _Tx(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    # ---- meta ----------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                       "SET value = excluded.value", (key, value))

    def bind_deployment(self, chain_id: int, challenge_manager: str) -> None:
        """A store follows receipts of one deployment: the first keeper records it, later ones
        must match (receipts of another chain would be judged against the wrong contracts)."""
        want = f"{chain_id}:{challenge_manager.lower()}"
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'deployment'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta(key, value) VALUES ('deployment', ?)", (want,))
            elif row[0] != want:
                raise StoreError(f"{self.path} keeps receipts of deployment {row[0]}, not "
                                 f"{want}")

    # ---- receipts ------------------------------------------------------------------------------
    def add(self, signed: SignedReceipt, *, note: str = "accepted by the verified client"
            ) -> bool:
        """Keeps ``signed`` as pending; False if it was kept already (nothing changes)."""
        rid, now = to_hex(signed.digest), self.clock()
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO receipts(id, signed, operator, issued_at, state, version,"
                " claim_answered, failures, added_at, updated_at, note) "
                "VALUES (?, ?, ?, ?, ?, 0, 0, 0, ?, ?, ?)",
                (rid, json.dumps(signed.to_json(), sort_keys=True),
                 signed.receipt.operator, signed.receipt.issued_at, str(State.PENDING), now,
                 now, note))
            if cur.rowcount:
                db.execute("INSERT INTO history(id, at, state, note) VALUES (?, ?, ?, ?)",
                           (rid, now, str(State.PENDING), note))
            return bool(cur.rowcount)

    def get(self, rid: str) -> Kept:
        with self._lock:
            row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM receipts WHERE id = ?",
                                   (rid.lower(),)).fetchone()
        if row is None:
            raise UnknownReceiptError(f"no receipt {rid} in {self.path}", param="receipt")
        return _kept(row)

    def receipts(self, states: Iterable[State] | None = None) -> list[Kept]:
        """Every kept receipt (in ``states`` if given), oldest first."""
        q = f"SELECT {', '.join(_COLUMNS)} FROM receipts"
        args: tuple[str, ...] = ()
        if states is not None:
            args = tuple(str(s) for s in states)
            q += f" WHERE state IN ({', '.join('?' * len(args))})"
        with self._lock:
            rows = self._db.execute(q + " ORDER BY issued_at, id", args).fetchall()
        return [_kept(r) for r in rows]

    def update(self, old: Kept, new: Kept) -> Kept:
        """Writes ``new`` over the row ``old`` was read from, in one transaction with a history
        line when the state or note changed. Raises :class:`StoreConflictError` if the row
        moved since ``old`` was read."""
        if new.id != old.id:
            raise ValueError("update must keep the receipt id")
        now = self.clock()
        row = replace(new, version=old.version + 1, updated_at=now)
        values = _row(row)
        sets = ", ".join(f"{c} = ?" for c in _COLUMNS if c not in ("id", "signed", "added_at"))
        args = [values[c] for c in _COLUMNS if c not in ("id", "signed", "added_at")]
        with self._tx() as db:
            cur = db.execute(f"UPDATE receipts SET {sets} WHERE id = ? AND version = ?",
                             (*args, old.id, old.version))
            if cur.rowcount != 1:
                raise StoreConflictError(f"receipt {old.id} changed since it was read "
                                         f"(version {old.version})")
            if new.state != old.state or new.note != old.note:
                db.execute("INSERT INTO history(id, at, state, note) VALUES (?, ?, ?, ?)",
                           (old.id, now, str(new.state), new.note))
        return row

    def history(self, rid: str) -> list[tuple[float, State, str | None]]:
        with self._lock:
            rows = self._db.execute("SELECT at, state, note FROM history WHERE id = ? "
                                    "ORDER BY seq", (rid.lower(),)).fetchall()
        return [(float(a), State(s), n) for a, s, n in rows]

    def counts(self) -> dict[State, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, count(*) FROM receipts GROUP BY state"
                                    ).fetchall()
        got = {State(s): int(n) for s, n in rows}
        return {s: got.get(s, 0) for s in State}

    # ---- batches and leaves --------------------------------------------------------------------
    def add_batches(self, batches: Iterable[BatchRow], cursor: int) -> None:
        """Records committed batches and moves the scan cursor to ``cursor`` (one
        transaction: the cursor never passes a batch that was not recorded)."""
        with self._tx() as db:
            for b in batches:
                db.execute("INSERT OR IGNORE INTO batches(root, operator, leaf_count, pointer, "
                           "block, committed_at, read, error) VALUES (?, ?, ?, ?, ?, ?, 0, ?)",
                           (b.root, b.operator.lower(), b.leaf_count, b.pointer, b.block,
                            b.committed_at, b.error))
            db.execute("INSERT INTO meta(key, value) VALUES ('cursor', ?) ON CONFLICT(key) "
                       "DO UPDATE SET value = excluded.value", (str(cursor),))

    def unread_batches(self, operators: Iterable[str]) -> list[BatchRow]:
        ops = tuple(o.lower() for o in operators)
        if not ops:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT root, operator, leaf_count, pointer, block, committed_at, read, error "
                f"FROM batches WHERE read = 0 AND operator IN ({', '.join('?' * len(ops))}) "
                "ORDER BY block", ops).fetchall()
        return [BatchRow(r[0], r[1], int(r[2]), r[3], int(r[4]),
                         None if r[5] is None else int(r[5]), bool(r[6]), r[7]) for r in rows]

    def batch_read(self, batch: BatchRow, leaves: Iterable[Leaf], committed_at: int) -> None:
        """A batch's manifest was read: its leaves (with proofs) in, the batch marked read."""
        with self._tx() as db:
            for lf in leaves:
                db.execute("INSERT OR IGNORE INTO leaves(digest, operator, root, leaf_index, "
                           "siblings, ciphertext, committed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (lf.digest, lf.operator.lower(), lf.root, lf.leaf_index,
                            json.dumps(list(lf.siblings)), lf.ciphertext, lf.committed_at))
            db.execute("UPDATE batches SET read = 1, error = NULL, committed_at = ? "
                       "WHERE operator = ? AND root = ?",
                       (committed_at, batch.operator.lower(), batch.root))

    def batch_failed(self, batch: BatchRow, error: str, *, final: bool,
                     committed_at: int | None = None) -> None:
        """A manifest could not be read: ``final`` (not a manifest of this batch: never
        retried) or not (DA trouble: retried next step)."""
        with self._tx() as db:
            db.execute("UPDATE batches SET error = ?, read = ?, committed_at = "
                       "coalesce(?, committed_at) WHERE operator = ? AND root = ?",
                       (error[:500], 2 if final else 0, committed_at, batch.operator.lower(),
                        batch.root))

    def leaves_of(self, digest: str, operator: str) -> list[Leaf]:
        """Where receipt ``digest`` was found in its own operator's committed batches, the
        earliest commit first (the contract looks a receipt up under its operator only)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT digest, operator, root, leaf_index, siblings, ciphertext, committed_at "
                "FROM leaves WHERE digest = ? AND operator = ? ORDER BY committed_at",
                (digest.lower(), operator.lower())).fetchall()
        return [Leaf(r[0], r[1], r[2], int(r[3]), tuple(json.loads(r[4])), r[5], int(r[6]))
                for r in rows]

    def batch_errors(self) -> list[BatchRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT root, operator, leaf_count, pointer, block, committed_at, read, error "
                "FROM batches WHERE error IS NOT NULL ORDER BY block").fetchall()
        return [BatchRow(r[0], r[1], int(r[2]), r[3], int(r[4]),
                         None if r[5] is None else int(r[5]), bool(r[6]), r[7]) for r in rows]


class _Tx:
    """The connection inside one transaction (``executescript`` would commit it)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, tuple(args))

    def executescript_in_tx(self, script: str) -> None:
        for stmt in script.split(";"):
            if stmt.strip():
                self._db.execute(stmt)


def _row(k: Kept) -> dict[str, Any]:
    d = asdict(k)
    d["signed"] = json.dumps(k.signed.to_json(), sort_keys=True)
    d["state"] = str(k.state)
    d["claim_answered"] = int(k.claim_answered)
    return d


def _kept(row: tuple[Any, ...]) -> Kept:
    d = dict(zip(_COLUMNS, row, strict=True))
    try:
        d["signed"] = SignedReceipt.from_json(json.loads(d["signed"]))
        d["state"] = State(d["state"])
    except (ValueError, KeyError, VerinferError) as e:
        raise StoreError(f"receipt {d['id']}: the stored row is unreadable: {e}") from e
    d["claim_answered"] = bool(d["claim_answered"])
    return Kept(**d)
