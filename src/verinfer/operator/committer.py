"""The batch committer (``verinfer operator commit``, issue 37): the one process that sends the
operator's transactions when several serving replicas sign receipts.

Replicas publish every signed receipt and its ciphertext to the operator's receipt stream
(:mod:`verinfer.operator.stream`). The committer holding the **lease** reads the stream with the
consumer group ``committers``, checks each entry (the receipt decodes, is this operator's, for
this domain, correctly signed, and names the ciphertext's sha256), puts the ciphertexts and the
batch manifest on DA, and commits the batch root on chain. A standby committer polls for the
lease and takes over when the active one stops renewing it (crash, partition, SIGKILL).

**Never twice.** A receipt is in at most one batch, whatever crashes when:

1. *Decide* — one Lua script, run only while the caller's fencing token is the lease's,
   assigns every receipt of the batch to the batch root (``…:r:<digest>``, refused when any is
   already assigned) and records the batch (root, leaf count, manifest pointer, stream ids) in
   ``…:batches:open``. A committer that lost its lease cannot decide anything: its token no
   longer matches.
2. *Send* — only after Redis confirms the lease is still this committer's with at least
   ``send_margin_s`` left (and the local clock agrees): a committer that lost its lease stops
   before sending. The sink reads the chain first (``BatchRegistry.batchOf``) and sends
   nothing for a root already there, so a restart after the send is safe.
3. *Finish* — acknowledge and delete the batch's stream entries, close the batch, record it in
   ``…:committed``.

A new lease holder first finishes every open batch (the same root, from the recorded manifest:
re-sending it is idempotent on chain, where a second ``commitBatch`` of a root reverts), then
claims every entry still pending for another consumer (``XPENDING``, then ``XCLAIM`` by id:
only the lease holder reads, so any other consumer's pending entry belongs to a dead or
deposed committer), then reads its own pending entries before new ones. Receipts are thus
assigned once, and committed in exactly the batch they were assigned to.

**Budgets.** The committer holds at most ``batch_max_entries`` entries and
``max_buffer_bytes`` of ciphertext in memory, plus at most one entry (a read asks for no more
entries than the budget left holds at the largest entry the DA takes, and for one when it holds
none); every Redis call has a whole-call deadline
(:class:`~verinfer.operator.stream.BoundedRedis`), every chain call the RPC provider's
(``verinfer.chain.rpc``) and the sender's mining timeout; ``…:committed`` and ``…:rejected``
are capped streams, and receipt assignments expire after ``retention_s``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from verinfer.da_client.base import DAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.da_client.outbox import BatchRow
from verinfer.da_client.pointer import Pointer, sha256
from verinfer.da_client.sinks import BatchCommitment, BatchSink
from verinfer.errors import VerinferError
from verinfer.operator.stream import GROUP, BoundedRedis, ReceiptStreamError, StreamKeys
from verinfer.receipts.eip712 import Domain, recover_digest_signer
from verinfer.receipts.signed import MAX_WIRE_BYTES, SignedReceipt

log = logging.getLogger(__name__)

#: Defaults (docs/deploy.md "Replicas and the committer").
DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_MAX_BUFFER_BYTES = 256 * 1024 * 1024
DEFAULT_RETENTION_S = 14 * 24 * 3600
COMMITTED_MAXLEN = 100_000
#: The slowest read of the stream a committer's deadline allows for (bytes per second), on top
#: of the call deadline: a read of entries that may be 32 MiB each is given time to arrive.
READ_BYTES_PER_S = 64 * 1024 * 1024
REJECTED_MAXLEN = 10_000


class LeaseLostError(VerinferError):
    """This committer does not hold the lease (any more): it must not decide or send."""

    code = "committer_lease_lost"


# KEYS[1] lease, KEYS[2] token counter; ARGV[1] holder, ARGV[2] ttl ms -> the new token or 0
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. '|' .. ARGV[1], 'PX', ARGV[2])
return t
"""
# KEYS[1] lease; ARGV[1] "token|holder", ARGV[2] ttl ms -> 1 renewed, 0 not ours
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""
# KEYS[1] lease; ARGV[1] "token|holder" -> the lease's ms left, or -1 when not ours
_CHECK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PTTL', KEYS[1]) end
return -1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1] lease, KEYS[2] batch hash, KEYS[3] open set, KEYS[4..] receipt keys;
# ARGV[1] "token|holder", ARGV[2] root hex, ARGV[3] retention s, ARGV[4] leaf count,
# ARGV[5] manifest pointer, ARGV[6] stream ids (space separated), ARGV[7] token, ARGV[8] now
# -> {-1} lease lost, {0, i...} receipts (1-based) already assigned elsewhere, {1} decided
_DECIDE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local taken = {0}
for i = 4, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= ARGV[2] then taken[#taken + 1] = i - 3 end
end
if #taken > 1 then return taken end
for i = 4, #KEYS do redis.call('SET', KEYS[i], ARGV[2], 'EX', ARGV[3]) end
redis.call('HSET', KEYS[2], 'leaf_count', ARGV[4], 'manifest', ARGV[5], 'ids', ARGV[6],
           'token', ARGV[7], 'state', 'open', 'decided_at', ARGV[8])
redis.call('SADD', KEYS[3], ARGV[2])
return {1}
"""
# KEYS[1] batch hash, KEYS[2] open set, KEYS[3] stream, KEYS[4] committed stream;
# ARGV[1] root hex, ARGV[2] now, ARGV[3] retention s, ARGV[4] committed maxlen
_FINISH = """
local ids = redis.call('HGET', KEYS[1], 'ids')
if not ids then return 0 end
local n = 0
for id in string.gmatch(ids, '%S+') do
  n = n + redis.call('XACK', KEYS[3], 'committers', id)
  redis.call('XDEL', KEYS[3], id)
end
if redis.call('HGET', KEYS[1], 'state') ~= 'committed' then
  redis.call('HSET', KEYS[1], 'state', 'committed', 'committed_at', ARGV[2])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'root', ARGV[1],
             'leaf_count', redis.call('HGET', KEYS[1], 'leaf_count'),
             'manifest', redis.call('HGET', KEYS[1], 'manifest'))
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('SREM', KEYS[2], ARGV[1])
return n
"""


class Lease:
    """The committer lease in Redis: ``SET NX PX`` with a fencing token from a counter.

    ``token`` grows with every new holder. The holder renews well inside the TTL; it counts
    the lease lost as soon as a renewal fails or its own clock says the TTL ran out since the
    last successful renewal began (whichever comes first), so it never acts on a lease Redis
    already gave away."""

    def __init__(self, rds: BoundedRedis, keys: StreamKeys, holder: str, *,
                 ttl_s: float = DEFAULT_LEASE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 3 * rds.deadline_s:
            raise ValueError(f"lease ttl_s ({ttl_s:g}) must exceed 3 Redis call deadlines "
                             f"({rds.deadline_s:g} s each)")
        self.redis, self.keys, self.holder, self.ttl_s, self.clock = rds, keys, holder, ttl_s, \
            clock
        self.token: int | None = None
        self._valid_until = 0.0
        self._lock = threading.Lock()
        self._acquire = rds.script(_ACQUIRE)
        self._renew = rds.script(_RENEW)
        self._check = rds.script(_CHECK)
        self._release = rds.script(_RELEASE)

    @property
    def value(self) -> str:
        return f"{self.token}|{self.holder}"

    def _ms(self) -> int:
        return int(self.ttl_s * 1000)

    def ensure(self) -> bool:
        """Renew the lease if held, else try to take it. True while this process holds it."""
        with self._lock:
            t0 = self.clock()
            if self.token is not None:
                ok = self.redis.call("lease renew", lambda _c: self._renew(
                    keys=[self.keys.lease], args=[self.value, self._ms()]))
                if ok == 1:
                    self._valid_until = t0 + self.ttl_s
                    return True
                log.warning("committer lease lost (token %s)", self.token)
                self.token = None
            token = int(self.redis.call("lease acquire", lambda _c: self._acquire(
                keys=[self.keys.lease, self.keys.lease_token], args=[self.holder, self._ms()])))
            if token == 0:
                return False
            self.token, self._valid_until = token, t0 + self.ttl_s
            log.warning("committer lease taken by %s (fencing token %d)", self.holder, token)
            return True

    def held_locally(self, margin_s: float = 0.0) -> bool:
        return self.token is not None and self.clock() + margin_s < self._valid_until

    def confirm(self, margin_s: float) -> None:
        """Raise LeaseLostError unless Redis says the lease is still ours with more than
        ``margin_s`` left and the local clock agrees (called right before a send)."""
        with self._lock:
            if not self.held_locally(margin_s):
                raise LeaseLostError("the committer lease expired locally; not sending")
            left_ms = int(self.redis.call("lease check", lambda _c: self._check(
                keys=[self.keys.lease], args=[self.value])))
            if left_ms < 0:
                self.token = None
                raise LeaseLostError("the committer lease is held by another committer; "
                                     "not sending")
            if left_ms < margin_s * 1000:
                raise LeaseLostError(f"the committer lease has {left_ms} ms left (< "
                                     f"{margin_s:g} s margin); not sending")

    def release(self) -> None:
        """Give the lease up (a clean stop: the standby takes over at once)."""
        with self._lock:
            if self.token is None:
                return
            try:
                self.redis.call("lease release", lambda _c: self._release(
                    keys=[self.keys.lease], args=[self.value]))
            finally:
                self.token = None


@dataclass(frozen=True)
class StreamEntry:
    id: str
    signed: SignedReceipt
    blob: bytes


@dataclass
class CommitterStep:
    leader: bool = False
    read: int = 0
    rejected: int = 0
    duplicates: int = 0
    batches_committed: int = 0
    receipts_committed: int = 0
    roots: list[bytes] = field(default_factory=list)

    @property
    def progressed(self) -> bool:
        return bool(self.read or self.rejected or self.duplicates or self.batches_committed)


class BatchCommitter:
    """Reads the receipt stream, forms, decides and commits batches (see the module doc)."""

    def __init__(self, rds: BoundedRedis, keys: StreamKeys, da: DAClient, sink: BatchSink,
                 lease: Lease, *, domain: Domain, consumer: str | None = None,
                 manifest_da: DAClient | None = None, batch_max_entries: int = 1024,
                 batch_max_age_s: float = 5.0, max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
                 read_block_ms: int = 200, retention_s: int = DEFAULT_RETENTION_S,
                 send_margin_s: float | None = None, verify_signatures: bool = True,
                 claims: ClaimSteps | None = None, claims_every_s: float = 2.0,
                 now: Callable[[], float] = time.time) -> None:
        """``claims``: the operator's unpublished-claim responder over this committer's batch
        records (:class:`StreamBatchIndex`); stepped only while this committer holds the
        lease, so the committer stays the operator's one sender."""
        if batch_max_entries < 1:
            raise ValueError(f"batch_max_entries must be >= 1, got {batch_max_entries}")
        if max_buffer_bytes < 1:
            raise ValueError(f"max_buffer_bytes must be >= 1, got {max_buffer_bytes}")
        self.redis, self.keys, self.da, self.sink, self.lease = rds, keys, da, sink, lease
        self.manifest_da = manifest_da or da
        self.domain, self.operator = domain, keys.operator
        self.consumer = consumer or f"committer-{uuid.uuid4().hex[:12]}"
        self.batch_max_entries, self.batch_max_age_s = batch_max_entries, batch_max_age_s
        self.max_buffer_bytes, self.read_block_ms = max_buffer_bytes, read_block_ms
        self.retention_s, self.verify_signatures, self.now = retention_s, verify_signatures, now
        # the lease must outlive a whole send: the confirm before it asks for this much left
        self.send_margin_s = (send_margin_s if send_margin_s is not None
                              else lease.ttl_s / 2)
        self._buffer: dict[str, StreamEntry] = {}  # stream id -> entry, in id order
        self._buffer_bytes = 0
        self._cursor = "0"  # "0": own pending entries first; then ">" (new ones)
        self._term: int | None = None  # the lease token this committer last took over with
        self.claims, self.claims_every_s = claims, claims_every_s
        self._claims_at = float("-inf")
        self._decide = rds.script(_DECIDE)
        self._finish = rds.script(_FINISH)
        self.last_error: str | None = None

    # ---- one step --------------------------------------------------------------------------
    def step(self, *, flush: bool = False) -> CommitterStep:
        """One pass: hold the lease, finish open batches, read, commit what is due.
        ``flush`` commits whatever is buffered now, however few or young."""
        rep = CommitterStep()
        if not self.lease.ensure():
            self._drop_buffer()
            self._term = None
            return rep
        rep.leader = True
        if self._term != self.lease.token:
            self._take_over()
            self._term = self.lease.token
        self._finish_open(rep)
        self._fill(rep)
        while self._buffer and (flush or self._due()):
            if not self._commit_one(rep):
                break
        return rep

    def _due(self) -> bool:
        if len(self._buffer) >= self.batch_max_entries or \
                self._buffer_bytes >= self.max_buffer_bytes:
            return True
        first = next(iter(self._buffer))
        return self.now() - int(first.split("-")[0]) / 1000.0 >= self.batch_max_age_s

    def _drop_buffer(self) -> None:
        self._buffer.clear()
        self._buffer_bytes = 0

    def _take_over(self) -> None:
        """A new term: create the group if needed, claim every entry pending for another
        consumer, then read own pending entries from the start."""
        self._drop_buffer()
        self._cursor = "0"

        def create(c: Any) -> None:
            try:
                c.xgroup_create(self.keys.stream, GROUP, id="0", mkstream=True)
            except Exception as e:  # BUSYGROUP: it exists (any other error re-raised)
                if "BUSYGROUP" not in str(e):
                    raise
        self.redis.call("xgroup create", create)
        # the pending ids (XPENDING: ids and consumers, never an entry's fields), then claimed
        # by id (XCLAIM JUSTID): a dead committer's buffer may be hundreds of MiB, and its
        # entries' bytes move only with the budgeted reads of _fill
        start, claimed = "-", 0
        while True:
            def pending(c: Any, s: str = start) -> Any:
                return c.xpending_range(self.keys.stream, GROUP, min=s, max="+", count=100)
            rows = self.redis.call("xpending", pending)
            theirs = [_text(r["message_id"]) for r in rows
                      if _text(r["consumer"]) != self.consumer]
            if theirs:
                def claim(c: Any, ids: list[str] = theirs) -> Any:
                    return c.xclaim(self.keys.stream, GROUP, self.consumer, 0, ids,
                                    justid=True)
                self.redis.call("xclaim", claim)
                claimed += len(theirs)
            if len(rows) < 100:
                break
            start = "(" + _text(rows[-1]["message_id"])
        if claimed:
            log.warning("took over %d receipt(s) pending for other committers", claimed)

    def _finish_open(self, rep: CommitterStep) -> None:
        """Commit (idempotently) and close every batch decided but not finished, oldest
        first: a predecessor's, or ours from a step that failed after deciding."""
        roots = self.redis.call("open batches", lambda c: c.smembers(self.keys.open_batches))
        rows = []
        for raw in roots:
            root = bytes.fromhex(_text(raw))
            h = self._hgetall(root)
            rows.append((float(_text(h.get(b"decided_at", b"0"))), root, h))
        for _, root, h in sorted(rows, key=lambda t: t[0]):
            if not h:
                self._close(root.hex())
                continue
            self._send_and_finish(root, int(_text(h[b"leaf_count"])),
                                  Pointer.parse(_text(h[b"manifest"])), rep)

    def _fill(self, rep: CommitterStep) -> None:
        """Read entries into the buffer, within its budget (entries and bytes). One read asks
        for no more entries than the bytes left in the budget hold at the largest entry a
        replica may publish (at least one), and its deadline grows with what it may carry: a
        stream of big entries (32 MiB blobs) is read a few at a time, never gigabytes in one
        reply."""
        per_entry = self.da.max_blob_bytes + MAX_WIRE_BYTES
        while True:
            room = self.batch_max_entries - len(self._buffer)
            left = self.max_buffer_bytes - self._buffer_bytes
            if room <= 0 or left <= 0:
                return
            count = min(room, max(1, left // per_entry))
            cursor = self._cursor
            block = self.read_block_ms if cursor == ">" and not self._buffer else None
            def read(c: Any, cur: str = cursor, n: int = count, b: int | None = block) -> Any:
                return c.xreadgroup(GROUP, self.consumer, {self.keys.stream: cur}, count=n,
                                    block=b)
            res = self.redis.call("xreadgroup", read,
                                  deadline_s=self.redis.deadline_s + (block or 0) / 1000.0
                                  + count * per_entry / READ_BYTES_PER_S)
            entries = res[0][1] if res else []
            if not entries:
                if cursor != ">":
                    self._cursor = ">"  # own pending entries all read: now the new ones
                    continue
                return
            for sid_raw, fields in entries:
                sid = _text(sid_raw)
                if cursor != ">":
                    self._cursor = sid
                if sid in self._buffer:
                    continue
                entry = self._check(sid, fields, rep)
                if entry is not None:
                    self._buffer[sid] = entry
                    self._buffer_bytes += len(entry.blob)
                    rep.read += 1
            if cursor == ">" and len(entries) < count:
                return  # the stream holds no more new entries now

    def _check(self, sid: str, fields: dict[bytes, bytes] | None,
               rep: CommitterStep) -> StreamEntry | None:
        """The entry, or None after rejecting it (acknowledged, deleted, and recorded in the
        capped ``…:rejected`` stream with the reason)."""
        reason = None
        if not fields:  # deleted after delivery (a finished batch's duplicate delivery)
            self._ack([sid])
            return None
        try:
            raw, got = fields.get(b"r"), fields.get(b"c")
            if raw is None or got is None:
                raise ValueError("entry lacks r (receipt) or c (ciphertext)")
            blob = got
            signed = SignedReceipt.from_bytes(raw)
            if signed.domain != self.domain:
                raise ValueError(f"receipt domain {signed.domain.to_json()} is not the "
                                 f"committer's {self.domain.to_json()}")
            if signed.receipt.operator.lower() != self.operator.lower():
                raise ValueError(f"receipt of operator {signed.receipt.operator}, not "
                                 f"{self.operator}")
            if len(blob) > self.da.max_blob_bytes:
                raise ValueError(f"ciphertext of {len(blob)} bytes exceeds the DA limit")
            if sha256(blob) != signed.receipt.ciphertext_hash:
                raise ValueError("the ciphertext's sha256 is not the receipt's ciphertextHash")
            # from_bytes checked the chain rule and the digest; recover over that digest
            if self.verify_signatures and recover_digest_signer(
                    signed.digest, signed.signature).lower() != self.operator.lower():
                raise ValueError(f"the signature does not recover to {self.operator}")
        except (VerinferError, ValueError) as e:
            reason = e.message if isinstance(e, VerinferError) else str(e)
        if reason is None:
            return StreamEntry(sid, signed, blob)
        log.error("receipt stream entry %s rejected: %s", sid, reason)
        rep.rejected += 1
        src = fields.get(b"s", b"?")
        self.redis.call("reject", lambda c: c.xadd(
            self.keys.rejected, {"id": sid, "replica": src, "reason": reason[:500]},
            maxlen=REJECTED_MAXLEN, approximate=True))
        self._ack([sid])
        return None

    def _hgetall(self, root: bytes) -> dict[bytes, bytes]:
        key = self.keys.batch(root)
        return dict(self.redis.call("batch", lambda c: c.hgetall(key)))

    def _close(self, root_hex: str) -> None:
        self.redis.call("close batch", lambda c: c.srem(self.keys.open_batches, root_hex))

    def _is_open(self, root_hex: str) -> bool:
        return bool(self.redis.call("is open", lambda c: c.sismember(self.keys.open_batches,
                                                                      root_hex)))

    def _ack(self, ids: list[str]) -> None:
        def run(c: Any) -> None:
            pipe = c.pipeline(transaction=True)
            pipe.xack(self.keys.stream, GROUP, *ids)
            pipe.xdel(self.keys.stream, *ids)
            pipe.execute()
        self.redis.call("xack", run)

    def _commit_one(self, rep: CommitterStep) -> bool:
        """Form, decide, send and finish one batch from the head of the buffer. False when
        nothing more can be done this step (an assigned receipt's batch is still open)."""
        head = list(self._buffer.values())[:self.batch_max_entries]
        by_digest: dict[bytes, list[StreamEntry]] = {}
        for e in head:
            by_digest.setdefault(e.signed.digest, []).append(e)
        digests = list(by_digest)
        assigned = self.redis.call("assigned", lambda c: c.mget(
            [self.keys.receipt(d) for d in digests]))
        done_dups: list[str] = []
        fresh: list[bytes] = []
        for d, root in zip(digests, assigned, strict=True):
            if root is None:
                fresh.append(d)
            else:  # assigned before (published twice, or a predecessor decided it)
                if self._is_open(_text(root)):
                    return False  # its batch is not finished: finish it first (next step)
                done_dups += [e.id for e in by_digest[d]]
        if done_dups:
            self._ack(done_dups)
            self._forget(done_dups)
            rep.duplicates += len(done_dups)
        if not fresh:
            return True
        entries = [by_digest[d][0] for d in fresh]
        ids = [e.id for d in fresh for e in by_digest[d]]
        pointers = self.da.put_many([e.blob for e in entries])
        manifest = build_manifest([ManifestEntry(e.signed, p)
                                   for e, p in zip(entries, pointers, strict=True)])
        mptr = self.manifest_da.put(manifest.to_bytes())
        res = self.redis.call("decide", lambda _c: self._decide(
            keys=[self.keys.lease, self.keys.batch(manifest.root), self.keys.open_batches,
                  *[self.keys.receipt(d) for d in fresh]],
            args=[self.lease.value, manifest.root.hex(), self.retention_s, len(entries),
                  str(mptr), " ".join(ids), self.lease.token or 0, f"{self.now():.3f}"]))
        status = int(res[0])
        if status == -1:
            self.lease.token = None
            raise LeaseLostError("the committer lease was taken over before the batch was "
                                 "decided; nothing sent")
        if status == 0:  # cannot happen while fenced; re-read and retry next step
            log.error("receipts %s were assigned by another committer meanwhile",
                      [fresh[int(i) - 1].hex() for i in res[1:]])
            return False
        self._forget(ids)
        self._send_and_finish(manifest.root, len(entries), mptr, rep)
        return True

    def _forget(self, ids: list[str]) -> None:
        for sid in ids:
            e = self._buffer.pop(sid, None)
            if e is not None:
                self._buffer_bytes -= len(e.blob)

    def _send_and_finish(self, root: bytes, leaf_count: int, manifest: Pointer,
                         rep: CommitterStep) -> None:
        self.lease.confirm(self.send_margin_s)  # stop before sending without the lease
        self.sink.commit(BatchCommitment(0, root, leaf_count, manifest))
        self.redis.call("finish batch", lambda _c: self._finish(
            keys=[self.keys.batch(root), self.keys.open_batches, self.keys.stream,
                  self.keys.committed],
            args=[root.hex(), f"{self.now():.3f}", self.retention_s, COMMITTED_MAXLEN]))
        rep.batches_committed += 1
        rep.receipts_committed += leaf_count
        rep.roots.append(root)
        log.info("batch 0x%s committed: %d receipts, manifest %s", root.hex(), leaf_count,
                 manifest)

    # ---- the loop --------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, idle_s: float = 0.05,
            max_backoff_s: float = 10.0) -> None:
        """Steps until ``stop`` is set; a background thread renews the lease every third of
        its TTL (so a long send does not lose it). On stop the lease is released."""
        keeper = threading.Thread(target=self._keep_lease, args=(stop,), daemon=True,
                                  name="committer-lease")
        keeper.start()
        failures = 0
        try:
            while not stop.is_set():
                try:
                    rep = self.step()
                    failures, self.last_error = 0, None
                except Exception as e:  # Redis, DA, the chain (web3's own errors too): retry;
                    # every state that matters is in Redis, so nothing is lost by re-reading
                    failures += 1
                    self.last_error = f"{type(e).__name__}: {e}"[:500]
                    log.warning("committer step failed (%d in a row): %s", failures,
                                self.last_error)
                    self._drop_buffer()  # re-read from the pending list: nothing is lost
                    self._cursor = "0"
                    stop.wait(min(max_backoff_s, 0.2 * 2 ** min(failures, 8)))
                    continue
                if rep.leader:
                    self._step_claims()
                if not rep.leader:
                    stop.wait(self.lease.ttl_s / 5)
                elif not rep.progressed:
                    stop.wait(idle_s)
        finally:
            stop.set()
            keeper.join(timeout=self.redis.deadline_s * 2)
            try:
                self.lease.release()
            except ReceiptStreamError as e:
                log.warning("could not release the committer lease: %s", e.message)

    def _step_claims(self) -> None:
        """One claim-responder step when due (its own failures are logged, never raised: a
        chain outage must not stop batch commits, nor the reverse)."""
        if self.claims is None or time.monotonic() - self._claims_at < self.claims_every_s:
            return
        self._claims_at = time.monotonic()
        try:
            self.claims.step()
        except Exception as e:
            msg = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
            log.warning("claim responder step failed: %s", msg)

    def _keep_lease(self, stop: threading.Event) -> None:
        while not stop.wait(self.lease.ttl_s / 3):
            if self.lease.token is None:
                continue
            try:
                self.lease.ensure()
            except ReceiptStreamError as e:
                log.warning("committer lease renewal failed: %s", e.message)


class ClaimSteps(Protocol):
    def step(self) -> None: ...


class StreamBatchIndex:
    """Where a receipt was batched, for the unpublished-claim responder
    (:class:`verinfer.operator.claims.ClaimResponder`), from the committer's records: the
    receipt's batch root (``…:r:<digest>``), the batch record (``…:batch:<root>``) and its
    manifest, read back from DA. The two calls the responder makes of an outbox, with the same
    answers: ``entry_state`` -> (state, None, batch id) or a receipt in no batch yet (still in
    the stream: the responder retries while the response period lasts), ``batch`` -> the row
    with the manifest bytes. Batch ids are local handles of the roots seen (bounded)."""

    MAX_HANDLES = 4096

    def __init__(self, rds: BoundedRedis, keys: StreamKeys, manifest_da: DAClient) -> None:
        self.redis, self.keys, self.manifest_da = rds, keys, manifest_da
        self._ids: OrderedDict[bytes, int] = OrderedDict()
        self._roots: dict[int, bytes] = {}
        self._next = 1
        self._lock = threading.Lock()

    def entry_state(self, receipt_digest: bytes) -> tuple[str, str | None, int | None]:
        key = self.keys.receipt(receipt_digest)
        raw = self.redis.call("receipt batch", lambda c: c.get(key))
        if raw is None:
            return ("unbatched", None, None)
        return ("batched", None, self._handle(bytes.fromhex(_text(raw))))

    def owner(self, receipt_digest: bytes) -> bytes | None:
        """sha256 of the API key that paid for the receipt, as its replica recorded it (None:
        open API, or not recorded)."""
        key = self.keys.owner(receipt_digest)
        raw = self.redis.call("receipt owner", lambda c: c.get(key))
        return bytes(raw) if raw else None

    def _handle(self, root: bytes) -> int:
        with self._lock:
            if root in self._ids:
                self._ids.move_to_end(root)
                return self._ids[root]
            if len(self._ids) >= self.MAX_HANDLES:
                _, old_id = self._ids.popitem(last=False)
                self._roots.pop(old_id, None)
            bid, self._next = self._next, self._next + 1
            self._ids[root], self._roots[bid] = bid, root
            return bid

    def batch(self, batch_id: int) -> BatchRow | None:
        with self._lock:
            root = self._roots.get(batch_id)
        if root is None:
            return None
        key = self.keys.batch(root)
        h = dict(self.redis.call("batch", lambda c: c.hgetall(key)))
        if not h:
            return None
        pointer = _text(h[b"manifest"])
        committed = h.get(b"committed_at")
        return BatchRow(batch_id, root, int(_text(h[b"leaf_count"])),
                        self.manifest_da.get(Pointer.parse(pointer)), pointer,
                        _text(h.get(b"state", b"open")), 0,
                        float(_text(h.get(b"decided_at", b"0"))),
                        None if committed is None else float(_text(committed)))


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


__all__ = ["DEFAULT_LEASE_TTL_S", "BatchCommitter", "ClaimSteps", "CommitterStep", "Lease",
           "LeaseLostError", "StreamBatchIndex", "StreamEntry"]
