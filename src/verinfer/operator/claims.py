"""The operator's answer to unpublished claims (issue 31, finding 1).

Anyone may call ``ChallengeManager.claimUnpublished`` on any receipt of this operator once its
publication deadline (issuedAt + publicationDeadline) has passed. The claim locks
``slashAmount`` of the operator's stake; unless someone proves within ``responsePeriod`` that
the receipt sits in a batch of this operator committed by the deadline
(``answerUnpublished(id, root, index, siblings)``), ``resolveUnpublished`` slashes it and pays
the claimant α of it. So an operator that does not answer loses α·S to any stranger for every
published receipt. :class:`ClaimResponder` answers:

1. it follows ``ClaimOpened`` events naming this operator (a block cursor, persisted);
2. for each open claim it finds the receipt in its own outbox (receipt digest -> batch -> the
   stored manifest -> the Merkle proof), checks on chain that the batch was committed by the
   claim's ``publishBy``, and sends ``answerUnpublished`` before ``responseDeadline`` (chain
   time);
3. a claim it cannot answer (the receipt is in no batch of its outbox, or its batch was
   committed too late: then no proof exists) is retried while the response period lasts — a
   batch still being committed may land — and counted as failed once the period is over.

The same loop runs the operator's :class:`~verinfer.operator.stake_watch.OperatorStakeWatch`
when given one (``connect`` does): a raised operator minimum is announced on chain
(MinimumRaisePending) a notice period ahead, and the watch logs the effective time and block and
the shortfall to bond.

Durable: the cursor and every tracked claim live in ``claims-<ChallengeManager>.json`` in the
operator directory (written atomically), so a restarted operator re-checks its open claims and
scans on from where it stopped. Every chain call runs under a whole-call deadline
(:class:`~verinfer.chain.errors.RpcDeadlineError`), failures back off exponentially with
jitter, and each step is idempotent (the claim's on-chain status is read before every answer).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from eth_account import Account
from web3 import Web3

from verinfer.chain.bindings import (
    BatchRegistryContract,
    ChallengeManagerContract,
    ProtocolConfigContract,
    StakeRegistryContract,
    TxSender,
)
from verinfer.chain.deploy import Deployment
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.rpc import (
    LOG_CHUNK_BLOCKS,
    REORG_OVERLAP_BLOCKS,
    bounded_web3,
    call_within,
)
from verinfer.chain.structs import ClaimStatus
from verinfer.da_client.errors import ManifestError
from verinfer.da_client.manifest import inclusion_proof
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Backoff
from verinfer.errors import VerinferError
from verinfer.operator.stake_watch import OperatorStakeWatch
from verinfer.protocol.hexutil import parse_hex, to_hex

log = logging.getLogger(__name__)

T = TypeVar("T")

STATE_VERSION = 1
#: Default whole-call deadline of a read (all of its HTTP requests together).
RPC_DEADLINE_S = 20.0
#: Default whole-call deadline of answerUnpublished: estimate, send and wait to be mined.
SEND_DEADLINE_S = 90.0

#: Seconds between two reads of the operator minimum (a raise gives hours of notice).
STAKE_WATCH_INTERVAL_S = 30.0

OPEN, ANSWERED, FAILED = "open", "answered", "failed"


class ClaimStateError(VerinferError):
    """The claims state file cannot be read or belongs to another operator."""

    code = "claims_state"


@dataclass
class TrackedClaim:
    claim_id: int
    receipt_digest: str  # 0x-hex
    publish_by: int
    response_deadline: int
    block_number: int
    state: str = OPEN  # open | answered | failed
    attempts: int = 0
    last_error: str | None = None
    answered_by_us: bool = False


@dataclass(frozen=True)
class ClaimCounts:
    """Totals over every claim this operator's state file tracks (so they survive restarts)."""

    seen: int
    answered: int
    failed: int
    open: int
    errors: int  # failed attempts (RPC, reverts, nothing to prove yet) in this process


@dataclass
class _Proof:
    root: bytes
    index: int
    siblings: tuple[bytes, ...]


class _NotAnswerable(Exception):
    def __init__(self, reason: str, *, final: bool) -> None:
        super().__init__(reason)
        self.reason, self.final = reason, final


@dataclass
class ClaimResponder:
    """Answers the unpublished claims against ``operator``'s receipts (see the module doc).
    ``challenges`` must carry a sender (the operator's account)."""

    w3: Web3
    challenges: ChallengeManagerContract
    batches: BatchRegistryContract
    outbox: Outbox
    state_file: Path
    start_block: int
    rpc_deadline_s: float = RPC_DEADLINE_S
    send_deadline_s: float = SEND_DEADLINE_S
    poll_s: float = 2.0
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=1.0, max_s=30.0))
    rng: Callable[[], float] = random.random
    clock: Callable[[], float] = time.monotonic
    log_chunk_blocks: int = LOG_CHUNK_BLOCKS
    #: checked after the claims, at most once per ``stake_watch_interval_s`` (its failure
    #: never stops claim answering)
    stake_watch: OperatorStakeWatch | None = None
    stake_watch_interval_s: float = STAKE_WATCH_INTERVAL_S

    def __post_init__(self) -> None:
        if self.challenges.sender is None:
            raise ClaimStateError("the claim responder needs the operator's account to send "
                                  "answerUnpublished")
        self.operator = self.challenges.sender.address
        self._step_lock = threading.Lock()  # one step at a time
        self._data_lock = threading.Lock()  # brief: the claims map and counters (/metrics)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_try: dict[int, float] = {}
        self._stake_watched_at: float | None = None
        self._errors = 0
        self.last_error: str | None = None
        self.cursor, self.claims = self._load()

    @classmethod
    def connect(cls, rpc_url: str, deployment: Path, *, private_key: bytes, outbox: Outbox,
                state_dir: Path, **kw: Any) -> ClaimResponder:
        """The responder of the account of ``private_key`` on ``deployment`` over ``rpc_url``,
        its state in ``state_dir`` (the operator directory)."""
        dep = Deployment.load(deployment)
        rpc_deadline = float(kw.get("rpc_deadline_s", RPC_DEADLINE_S))
        w3 = bounded_web3(rpc_url, deadline_s=rpc_deadline)
        send_deadline = float(kw.get("send_deadline_s", SEND_DEADLINE_S))
        sender = TxSender(w3, Account.from_key(private_key), timeout=send_deadline * 0.8)
        kw.setdefault("stake_watch", OperatorStakeWatch(
            w3, StakeRegistryContract(w3, dep.stake_registry),
            ProtocolConfigContract(w3, dep.protocol_config), sender.address))
        return cls(w3, ChallengeManagerContract(w3, dep.challenge_manager, sender),
                   BatchRegistryContract(w3, dep.batch_registry), outbox,
                   state_path(state_dir, dep.challenge_manager), dep.deployed_block, **kw)

    # ---- state -----------------------------------------------------------------------------
    def _load(self) -> tuple[int, dict[int, TrackedClaim]]:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return self.start_block - 1, {}
        except (OSError, ValueError) as e:
            raise ClaimStateError(f"cannot read the claims state {self.state_file}: {e}"
                                  ) from e
        try:
            if raw["version"] != STATE_VERSION:
                raise ClaimStateError(f"{self.state_file}: state version {raw['version']}, "
                                      f"this code knows {STATE_VERSION}")
            if str(raw["operator"]).lower() != self.operator.lower():
                raise ClaimStateError(f"{self.state_file} tracks the claims of operator "
                                      f"{raw['operator']}, not {self.operator}")
            claims = {int(k): TrackedClaim(**v) for k, v in raw["claims"].items()}
            return int(raw["cursor"]), claims
        except (KeyError, TypeError, ValueError) as e:
            raise ClaimStateError(f"{self.state_file} is malformed: {e}") from e

    def _save(self) -> None:
        data = {"version": STATE_VERSION, "operator": self.operator,
                "challenge_manager": self.challenges.address, "cursor": self.cursor,
                "claims": {str(k): asdict(v) for k, v in sorted(self.claims.items())}}
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.state_file)

    def counts(self) -> ClaimCounts:
        with self._data_lock:
            states = [c.state for c in self.claims.values()]
            return ClaimCounts(len(states), states.count(ANSWERED), states.count(FAILED),
                               states.count(OPEN), self._errors)

    # ---- one step --------------------------------------------------------------------------
    def step(self) -> None:
        """Scan new ClaimOpened events, then move every open claim on by at most one call."""
        with self._step_lock:
            head = self._head()
            self._scan(int(head["number"]))
            with self._data_lock:
                pending = [c for c in self.claims.values() if c.state == OPEN]
            for c in pending:
                self._advance(c, int(head["timestamp"]))
            if self.stake_watch is not None:
                self._watch_stake()

    def _watch_stake(self) -> None:
        assert self.stake_watch is not None
        now = self.clock()
        if self._stake_watched_at is not None and \
                now - self._stake_watched_at < self.stake_watch_interval_s:
            return
        self._stake_watched_at = now
        try:
            self._bounded("stake watch", self.stake_watch.check)
        except Exception as e:  # the watch never holds up claim answering (no step backoff)
            msg = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
            with self._data_lock:
                self._errors += 1
            log.warning("operator stake watch: cannot read the operator minimum: %s", msg)

    def scan(self) -> list[TrackedClaim]:
        """Only the first half of a step: record (and persist) the claims opened since the
        cursor; returns the new ones."""
        with self._step_lock:
            return self._scan(int(self._head()["number"]))

    def _head(self) -> Any:
        return self._bounded("eth_getBlock", lambda: self.w3.eth.get_block("latest"))

    def _scan(self, head: int) -> list[TrackedClaim]:
        new: list[TrackedClaim] = []
        ev = self.challenges.contract.events.ClaimOpened()
        lo = max(self.start_block, self.cursor + 1 - REORG_OVERLAP_BLOCKS)
        while lo <= head:
            hi = min(head, lo + self.log_chunk_blocks - 1)
            logs = self._bounded("eth_getLogs(ClaimOpened)", _logs_of(ev, self.operator, lo, hi))
            for entry in logs:
                a = entry["args"]
                cid = int(a["id"])
                if cid in self.claims or str(a["operator"]).lower() != self.operator.lower():
                    continue
                c = TrackedClaim(cid, to_hex(bytes(a["receiptDigest"])), int(a["publishBy"]),
                                 int(a["responseDeadline"]), int(entry["blockNumber"]))
                with self._data_lock:
                    self.claims[cid] = c
                new.append(c)
                log.warning("unpublished claim %d on receipt %s by %s: answer due by %d "
                            "(chain time)", cid, c.receipt_digest, a["claimant"],
                            c.response_deadline)
            if hi > self.cursor or new:
                self.cursor = max(self.cursor, hi)
                self._save()  # INVARIANT: the cursor moves only past claims already persisted
            lo = hi + 1
        return new

    def _advance(self, c: TrackedClaim, chain_ts: int) -> None:
        if self.clock() < self._next_try.get(c.claim_id, 0.0):
            return
        try:
            info = self._bounded("claim", lambda: self.challenges.claim(c.claim_id))
            if info.status is ClaimStatus.NONE:  # a reorg took it away: nothing to answer
                with self._data_lock:
                    del self.claims[c.claim_id]
                self._save()
                log.warning("unpublished claim %d is no longer on chain (reorg)", c.claim_id)
                return
            if info.status is not ClaimStatus.OPEN:
                ok = info.status is ClaimStatus.ANSWERED
                self._finish(c, ANSWERED if ok else FAILED,
                             None if ok else f"claim ended {info.status.name}")
                return
            if chain_ts > info.response_deadline:
                self._finish(c, FAILED, c.last_error or "response period over")
                return
            if info.receipt_digest != parse_hex(c.receipt_digest, 32, "receipt digest"):
                # a reorg gave the id to another claim: the chain's record is the one to answer
                c.receipt_digest, c.publish_by = to_hex(info.receipt_digest), info.publish_by
                c.response_deadline = info.response_deadline
            proof = self._proof(info.receipt_digest, info.publish_by)
            c.attempts += 1
            self._bounded("answerUnpublished", lambda: self.challenges.answer_unpublished(
                c.claim_id, proof.root, proof.index, proof.siblings),
                deadline_s=self.send_deadline_s)
        except _NotAnswerable as e:
            if e.final:
                self._finish(c, FAILED, e.reason)
            else:
                self._retry(c, e.reason)
            return
        except ContractRevertError as e:
            # ClaimNotOpen: answered meanwhile (e.g. our earlier send was mined after its
            # deadline); the next step reads the status. Anything else is retried.
            self._retry(c, f"answerUnpublished reverted: {e.error_name}{e.error_args}",
                        soon=e.error_name == "ClaimNotOpen")
            return
        except (VerinferError, OSError, ValueError) as e:
            msg = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
            self._retry(c, msg)
            return
        c.answered_by_us = True
        self._finish(c, ANSWERED, None)

    def _proof(self, digest: bytes, publish_by: int) -> _Proof:
        found = self.outbox.entry_state(digest)
        if found is None:
            raise _NotAnswerable("the receipt is not in this operator's outbox (never signed "
                                 "here, or the outbox was lost)", final=True)
        state, _, batch_id = found
        row = None if batch_id is None else self.outbox.batch(batch_id)
        if row is None:
            raise _NotAnswerable(f"the receipt is in no batch yet (outbox state {state})",
                                 final=False)
        try:
            proof = inclusion_proof(row.manifest, digest)
        except ManifestError as e:
            raise _NotAnswerable(f"batch {row.id}'s stored manifest: {e.message}",
                                 final=True) from e
        on_chain = self._bounded("batchOf", lambda: self.batches.batch_of(self.operator,
                                                                           row.root))
        if not on_chain.exists:
            raise _NotAnswerable(f"batch {to_hex(row.root)} is not committed on chain yet",
                                 final=False)
        if on_chain.committed_at > publish_by:
            # INVARIANT: only a commit by publishBy answers a claim; none can be made later.
            raise _NotAnswerable(f"batch {to_hex(row.root)} was committed at "
                                 f"{on_chain.committed_at}, after the deadline {publish_by}",
                                 final=True)
        return _Proof(row.root, proof.index, proof.siblings)

    def _retry(self, c: TrackedClaim, reason: str, *, soon: bool = False) -> None:
        with self._data_lock:
            self._errors += 1
        c.last_error = reason[:500]
        delay = 0.0 if soon else self.backoff.delay(max(1, c.attempts), self.rng)
        self._next_try[c.claim_id] = self.clock() + delay
        self._save()
        log.warning("unpublished claim %d: not answered yet, retry in %.1f s: %s",
                    c.claim_id, delay, reason)

    def _finish(self, c: TrackedClaim, state: str, reason: str | None) -> None:
        with self._data_lock:
            c.state, c.last_error = state, reason
        self._next_try.pop(c.claim_id, None)
        self._save()
        if state == ANSWERED:
            log.warning("unpublished claim %d answered%s", c.claim_id,
                        "" if c.answered_by_us else " (by someone else)")
        else:
            log.error("unpublished claim %d FAILED (stake at risk): %s", c.claim_id, reason)

    def _bounded(self, what: str, fn: Callable[[], T], *, deadline_s: float | None = None
                 ) -> T:
        """``fn()`` within a whole-call deadline (the HTTP timeout bounds one request only: a
        node trickling answers, or a transaction never mined, would hold the step)."""
        limit = self.rpc_deadline_s if deadline_s is None else deadline_s
        return call_within(what, fn, limit, thread_name="claims-rpc")

    # ---- the loop --------------------------------------------------------------------------
    def start(self) -> ClaimResponder:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="claim-responder",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is not None
                              else self.send_deadline_s + self.rpc_deadline_s)
            self._thread = None

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self.step()
                failures = 0
                self.last_error = None
            except Exception as e:  # keep watching: an RPC outage must not end the responder
                failures += 1
                with self._data_lock:
                    self._errors += 1
                msg = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
                self.last_error = msg
                log.warning("claim responder step failed (%d in a row): %s", failures, msg)
            wait = self.poll_s if failures == 0 else max(
                self.poll_s, self.backoff.delay(failures, self.rng))
            self._stop.wait(wait)


def _logs_of(event: Any, operator: str, lo: int, hi: int) -> Callable[[], list[Any]]:
    """The ClaimOpened logs naming ``operator`` in blocks ``lo..hi`` (a call for _bounded)."""
    return lambda: list(event.get_logs(argument_filters={"operator": operator},
                                       from_block=lo, to_block=hi))


def state_path(state_dir: Path, challenge_manager: str) -> Path:
    """One state file per deployment (a new deployment starts from its own first block)."""
    return state_dir / f"claims-{challenge_manager.lower()}.json"


__all__ = ["ClaimCounts", "ClaimResponder", "ClaimStateError", "TrackedClaim", "state_path"]

