"""The receipt stream: serving replicas hand their signed receipts to the batch committer
through one Redis Stream per operator (issue 37).

Layout (every key of one operator shares the hash tag ``{<operator address>}``, so a Redis
Cluster keeps them in one slot and the committer's scripts stay atomic):

* ``<prefix>{op}:receipts`` — the stream. Each entry: ``r`` the signed receipt (wire bytes),
  ``c`` the ciphertext (the DA blob), ``s`` the replica that signed it. A replica adds the
  entries of one response in one script call, after checking the backlog budget; the
  committer reads them with a consumer group (``committers``), acknowledges and deletes them
  once their batch is committed, so the stream's length *is* the backlog.
* ``<prefix>{op}:lease``, ``…:lease:token`` — the committer lease and its fencing counter
  (:mod:`verinfer.operator.committer`).
* ``<prefix>{op}:r:<digest hex>`` — the batch root a receipt was assigned to (kept for the
  retention period), ``…:batch:<root hex>`` and ``…:batches:open`` — batches decided and not yet
  confirmed on chain, ``…:committed`` — the record of committed batches, ``…:rejected`` —
  entries the committer refused (bounded).

Every Redis call goes through :class:`BoundedRedis`: it ends within its deadline (the socket
timeout bounds each read; the caller stops waiting at the deadline whatever the server does and
the connection pool is dropped), and a failure is a :class:`ReceiptStreamError` — a 503 in
OpenAI's shape where a replica meets it, since a replica that cannot reach the stream must not
sign.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from verinfer.httpserve import redact_urls
from verinfer.operator.config import OperatorConfig, OperatorConfigError
from verinfer.operator.readiness import NotReadyError, Readiness
from verinfer.protocol.limits import MAX_CHOICES, MAX_PROMPTS

log = logging.getLogger(__name__)

T = TypeVar("T")

GROUP = "committers"
DEFAULT_PREFIX = "verinfer:operator:"
#: Defaults (docs/deploy.md "Replicas and the committer"): a Redis call ends within 2 s; the
#: stream holds at most 100,000 receipts not yet committed. One publish is one response's
#: receipts: at most n choices for each of its prompts.
DEFAULT_CALL_DEADLINE_S = 2.0
DEFAULT_MAX_BACKLOG = 100_000
#: How long the paying key of a receipt is kept (as the receipt's batch assignment: 14 days).
DEFAULT_OWNER_RETENTION_S = 14 * 24 * 3600
MAX_ENTRIES_PER_PUBLISH = MAX_CHOICES * MAX_PROMPTS


class ReceiptStreamError(NotReadyError):
    """The receipt stream (Redis) failed or refused: the replica does not sign (503)."""

    code = "receipt_stream_unavailable"

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message, retry_after=retry_after)


class ReceiptStreamFullError(ReceiptStreamError):
    """The stream holds its budget of receipts not yet committed (the committer is behind)."""

    code = "receipt_stream_full"


@dataclass(frozen=True)
class StreamKeys:
    """The Redis keys of one operator (see the module doc)."""

    prefix: str
    operator: str  # checksummed address; lower-cased in keys

    @property
    def base(self) -> str:
        return f"{self.prefix}{{{self.operator.lower()}}}:"

    @property
    def stream(self) -> str:
        return self.base + "receipts"

    @property
    def lease(self) -> str:
        return self.base + "lease"

    @property
    def lease_token(self) -> str:
        return self.base + "lease:token"

    @property
    def open_batches(self) -> str:
        return self.base + "batches:open"

    @property
    def committed(self) -> str:
        return self.base + "committed"

    @property
    def rejected(self) -> str:
        return self.base + "rejected"

    def receipt(self, digest: bytes) -> str:
        return self.base + "r:" + digest.hex()

    def owner(self, digest: bytes) -> str:
        return self.base + "o:" + digest.hex()

    def batch(self, root: bytes) -> str:
        return self.base + "batch:" + root.hex()


class BoundedRedis:
    """A Redis client whose every call has a whole-call deadline.

    The socket timeout bounds each read and connect; on top, the call runs in a small pool and
    the caller waits at most ``deadline_s`` for it (a server that answers a byte at a time
    cannot hold it longer): past the deadline the pool's connections are dropped, which ends
    the stuck read, and :class:`ReceiptStreamError` is raised."""

    def __init__(self, url: str, *, deadline_s: float = DEFAULT_CALL_DEADLINE_S,
                 workers: int = 8) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s!r}")
        self.url, self.deadline_s = url, deadline_s
        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=deadline_s, socket_connect_timeout=deadline_s,
            health_check_interval=0)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                           thread_name_prefix="redis-call")

    def call(self, what: str, fn: Callable[[Any], T], *,
             deadline_s: float | None = None) -> T:
        """``fn(client)`` within the deadline; a Redis failure is a ReceiptStreamError."""
        limit = self.deadline_s if deadline_s is None else deadline_s
        fut = self._pool.submit(fn, self.client)
        try:
            return fut.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            self.client.connection_pool.disconnect()
            raise ReceiptStreamError(f"redis {what}: no answer within {limit:g} s") from None
        except redis.RedisError as e:
            raise ReceiptStreamError(redact_urls(f"redis {what} failed: {type(e).__name__}: "
                                                 f"{e}")[:500]) from None

    def script(self, source: str) -> Any:
        return self.client.register_script(source)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


# KEYS[1] the stream, KEYS[2..] the receipts' owner keys (with an owner); ARGV[1] the backlog
# budget, ARGV[2] the replica, ARGV[3] the owner (sha256 of the paying API key) or "",
# ARGV[4] its retention s, then (receipt, ciphertext) pairs. All entries of one response or
# none; refused (0) at the budget.
_PUBLISH = """
if redis.call('XLEN', KEYS[1]) + (#ARGV - 4) / 2 > tonumber(ARGV[1]) then return 0 end
local ids = {}
for i = 5, #ARGV, 2 do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'r', ARGV[i], 'c', ARGV[i + 1], 's', ARGV[2])
end
for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[3], 'EX', ARGV[4]) end
return ids
"""


@dataclass(frozen=True)
class Backlog:
    entries: int  # receipts in the stream (published, not yet in a committed batch)
    oldest_age_s: float | None  # age of the oldest one (from its stream id)


class ReceiptStream:
    """One operator's receipt stream, from a serving replica's side: publish, measure."""

    def __init__(self, redis_client: BoundedRedis, keys: StreamKeys, *, replica: str,
                 max_backlog: int = DEFAULT_MAX_BACKLOG,
                 owner_retention_s: int = DEFAULT_OWNER_RETENTION_S,
                 now: Callable[[], float] = time.time) -> None:
        if max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        self.redis, self.keys, self.replica = redis_client, keys, replica
        self.max_backlog, self.owner_retention_s, self.now = (max_backlog, owner_retention_s,
                                                              now)
        self._publish = redis_client.script(_PUBLISH)

    def publish(self, items: Sequence[tuple[bytes, bytes]], *,
                owner: tuple[bytes, Sequence[bytes]] | None = None) -> list[str]:
        """Add (signed receipt bytes, ciphertext) entries, all or none; returns their stream
        ids. ``owner``: (sha256 of the paying API key, the receipts' digests): recorded with
        them, for ``GET /v1/receipts`` on any replica. Raises ReceiptStreamFullError at the
        backlog budget, ReceiptStreamError when Redis fails or is slow (nothing the caller may
        promise was recorded)."""
        if not 0 < len(items) <= MAX_ENTRIES_PER_PUBLISH:
            raise ValueError(f"one publish takes 1..{MAX_ENTRIES_PER_PUBLISH} entries, "
                             f"got {len(items)}")
        keys = [self.keys.stream]
        who: bytes = b""
        if owner is not None:
            who, digests = owner
            if len(digests) != len(items):
                raise ValueError(f"{len(digests)} digests for {len(items)} entries")
            keys += [self.keys.owner(d) for d in digests]
        args: list[bytes | str | int] = [self.max_backlog, self.replica, who,
                                         self.owner_retention_s]
        for receipt, blob in items:
            args += [receipt, blob]
        ids = self.redis.call("publish", lambda _c: self._publish(keys=keys, args=args))
        if ids == 0:
            raise ReceiptStreamFullError(
                f"the receipt stream holds {self.max_backlog} receipts not yet committed (is "
                "`verinfer operator commit` running?)")
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]

    def backlog(self) -> Backlog:
        """Entries in the stream and the age of the oldest (one round trip)."""
        def read(c: Any) -> tuple[int, list[Any]]:
            pipe = c.pipeline(transaction=False)
            pipe.xlen(self.keys.stream)
            pipe.xrange(self.keys.stream, "-", "+", count=1)
            n, first = pipe.execute()
            return int(n), first
        n, first = self.redis.call("backlog", read)
        age = None
        if first:
            ms = int(_text(first[0][0]).split("-")[0])
            age = max(0.0, self.now() - ms / 1000.0)
        return Backlog(n, age)


def stream_status(rds: BoundedRedis, keys: StreamKeys, *,
                  now: Callable[[], float] = time.time) -> dict[str, object]:
    """What `verinfer operator status` shows of the stream: backlog, the lease holder and its
    fencing token, batches decided and not finished, batches committed, entries rejected."""
    def read(c: Any) -> list[Any]:
        pipe = c.pipeline(transaction=False)
        pipe.xlen(keys.stream)
        pipe.xrange(keys.stream, "-", "+", count=1)
        pipe.get(keys.lease)
        pipe.scard(keys.open_batches)
        pipe.xlen(keys.committed)
        pipe.xlen(keys.rejected)
        return list(pipe.execute())
    n, first, lease, open_batches, committed, rejected = rds.call("status", read)
    age = None
    if first:
        age = max(0.0, now() - int(_text(first[0][0]).split("-")[0]) / 1000.0)
    token, holder = (None, None) if lease is None else _text(lease).split("|", 1)
    return {"stream": keys.stream, "entries": int(n), "oldest_age_s": age,
            "lease_holder": holder, "lease_token": None if token is None else int(token),
            "open_batches": int(open_batches), "committed_batches": int(committed),
            "rejected": int(rejected)}


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class StreamMonitor:
    """The replica's readiness check in stream mode (replaces the outbox backlog monitor):
    blocks signing while Redis does not answer, while the stream holds ``max_backlog``
    receipts, or while its oldest receipt is older than ``stop_after_s`` (the committer is
    down or behind: receipts signed now could miss their publication deadline)."""

    NAME = "receipt_stream"

    def __init__(self, readiness: Readiness, stream: ReceiptStream, *, stop_after_s: float,
                 retry_after_s: float = 5.0) -> None:
        self.readiness, self.stream = readiness, stream
        self.stop_after_s, self.retry_after_s = stop_after_s, retry_after_s

    def __call__(self) -> None:
        try:
            b = self.stream.backlog()
        except ReceiptStreamError as e:
            self.readiness.block(self.NAME, f"cannot reach the receipt stream: {e.message}",
                                 self.retry_after_s)
            return
        if b.entries >= self.stream.max_backlog:
            self.readiness.block(self.NAME, f"{b.entries} receipts wait in the stream for the "
                                 f"committer (limit {self.stream.max_backlog})",
                                 self.retry_after_s)
        elif b.oldest_age_s is not None and b.oldest_age_s >= self.stop_after_s:
            self.readiness.block(self.NAME, (
                f"the oldest receipt in the stream is {b.oldest_age_s:.0f} s old (limit "
                f"{self.stop_after_s:g} s before its publication deadline): is the committer "
                "running?"), self.retry_after_s)
        else:
            self.readiness.clear(self.NAME)


class StreamRecorder:
    """What the evidence pipeline calls in stream mode: publish every choice's receipt to the
    stream, then, with a local copy, record them in the replica's own outbox (a record of what
    was published: a receipt the stream refused is never handed out, so it is not kept). A
    failed publish blocks readiness at once, so the next requests get a 503 without waiting
    for the monitor, and raises ReceiptStreamError (503) for this one."""

    def __init__(self, stream: ReceiptStream, readiness: Readiness,
                 local_copy: Callable[[Sequence[tuple[bytes, bytes, bytes]], bytes | None],
                                      object] | None = None) -> None:
        self.stream, self.readiness, self.local_copy = stream, readiness, local_copy
        self._lock = threading.Lock()

    def record(self, items: Sequence[tuple[bytes, bytes, bytes]], owner: bytes | None) -> None:
        """``items``: (digest, signed receipt bytes, ciphertext) of one response."""
        try:
            self.stream.publish([(receipt, blob) for _, receipt, blob in items],
                                owner=None if owner is None else (owner, [d for d, _, _ in items]))
        except ReceiptStreamError as e:
            self.readiness.block(StreamMonitor.NAME, e.message, e.retry_after)
            raise
        if self.local_copy is not None:
            self.local_copy(items, owner)


def operator_address(cfg: OperatorConfig) -> str:
    from eth_account import Account

    return str(Account.from_key(cfg.private_key()).address)


def stream_keys(cfg: OperatorConfig, operator: str | None = None) -> StreamKeys:
    """The keys of this operator's stream (``cfg.stream`` must be set)."""
    if cfg.stream is None:
        raise OperatorConfigError("operator.json has no \"stream\" section (replicas and a "
                                  "committer): see docs/deploy.md")
    return StreamKeys(cfg.stream.prefix, operator or operator_address(cfg))


def open_stream(cfg: OperatorConfig, *, now: Callable[[], float] = time.time) -> ReceiptStream:
    """A serving replica's side of the stream, from operator.json's ``stream`` section."""
    keys = stream_keys(cfg)
    sc = cfg.stream
    assert sc is not None  # stream_keys refused otherwise
    replica = sc.replica or f"{socket.gethostname()}:{os.getpid()}"
    return ReceiptStream(BoundedRedis(sc.redis_url, deadline_s=sc.call_deadline_s), keys,
                         replica=replica, max_backlog=sc.max_backlog, now=now)


__all__ = ["DEFAULT_CALL_DEADLINE_S", "DEFAULT_MAX_BACKLOG", "DEFAULT_PREFIX", "GROUP",
           "MAX_ENTRIES_PER_PUBLISH", "Backlog", "BoundedRedis", "ReceiptStream",
           "ReceiptStreamError", "ReceiptStreamFullError", "StreamKeys", "StreamMonitor",
           "StreamRecorder", "open_stream", "operator_address", "stream_keys", "stream_status"]
