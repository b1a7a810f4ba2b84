"""The receipt keeper: follows every receipt the verified client accepted until it is safe, and
files the unpublished claim when its operator misses the publication deadline.

Each kept receipt (:mod:`verinfer.client.receipt_store`) moves through

``pending``    signed and accepted; its batch must be committed by issuedAt +
               publicationDeadline (chain time)
``batched``    found in a batch of its operator committed on chain by that deadline, with a
               Merkle proof (from the batch manifest on DA) that verifies against the root
               the chain committed
``available``  its ciphertext is on DA and hashes to the receipt's ciphertextHash (by the
               availability deadline: max(deadline, committedAt) + ``da_grace_s``)
``final``      the challenge window (committedAt + challengeWindow) closed

and, when the operator fails it, ``claimed`` (the keeper filed ``claimUnpublished`` with the
challenge bond) then ``slashed`` (nobody proved publication within the response period: the
keeper called ``resolveUnpublished``; the bond comes back with α of the slash), or
``unavailable`` / ``late`` (docs/client.md says what each means and what to do).

The decisions are :func:`decide`, a pure function of the kept row, the chain time and what the
chain and DA answered (an :class:`Observation`): a failed or timed-out read is no answer, so it
never moves a receipt to ``final`` or a fault; it is retried with backoff. Every chain and DA
call runs under a whole-call deadline (:func:`bounded`). Time (``clock``), sleeping and the
jitter's randomness (``rng``) are injectable.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.events import batches_committed
from verinfer.chain.rpc import (
    LOG_CHUNK_BLOCKS,
    REORG_OVERLAP_BLOCKS,
    bounded_web3,
    call_within,
)
from verinfer.chain.structs import ClaimStatus, Params, publication_deadline
from verinfer.client.receipt_store import (
    TERMINAL,
    BatchRow,
    Kept,
    Leaf,
    ReceiptStore,
    State,
    StoreConflictError,
)
from verinfer.client.verify import Checked
from verinfer.da_client.errors import (
    BlobNotFoundError,
    CommitmentMismatchError,
    MalformedPointerError,
    ManifestError,
)
from verinfer.da_client.manifest import max_manifest_bytes, parse_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.publisher import Backoff
from verinfer.errors import BadInputError, VerinferError
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.merkle import verify_proof
from verinfer.receipts.signed import SignedReceipt
from verinfer.verifier.enclave_judge import BlobSource

log = logging.getLogger(__name__)
T = TypeVar("T")



class KeeperConfigError(BadInputError):
    """The keeper was set up wrong (no chain, no DA, claims asked for without an account)."""

    code = "receipt_keeper_config"


@dataclass(frozen=True)
class KeeperPolicy:
    """``file_claims``: file ``claimUnpublished`` (the challenge bond, from the keeper's
    account) when a deadline passes unmet; False: watch only (the receipt ends ``late``).
    ``da_grace_s``: how long after the publication deadline (or the batch's commit, if later)
    the ciphertext may take to appear on DA. Deadlines are whole-call, in seconds."""

    file_claims: bool = True
    da_grace_s: int = 600
    rpc_deadline_s: float = 20.0
    send_deadline_s: float = 90.0
    da_deadline_s: float = 20.0
    poll_s: float = 5.0
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=1.0, max_s=60.0))
    log_chunk_blocks: int = LOG_CHUNK_BLOCKS

    def __post_init__(self) -> None:
        for name in ("rpc_deadline_s", "send_deadline_s", "da_deadline_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise KeeperConfigError(f"{name} must be > 0", param=name)
        if self.da_grace_s < 0 or self.log_chunk_blocks < 1:
            raise KeeperConfigError("da_grace_s must be >= 0 and log_chunk_blocks >= 1",
                                    param="policy")


# ---- the decisions (pure) ------------------------------------------------------------------------
@dataclass(frozen=True)
class Terms:
    """The protocol parameters the deadlines come from (read from ProtocolConfig) and the
    keeper's DA grace."""

    publication_deadline: int
    challenge_window: int
    claim_window: int
    da_grace_s: int

    @classmethod
    def of(cls, p: Params, da_grace_s: int) -> Terms:
        return cls(p.publication_deadline, p.challenge_window, p.claim_window, da_grace_s)


class DA(StrEnum):
    """What DA said about a ciphertext: there with the right hash, definitely not (not found,
    other bytes), or no answer (unreachable, deadline: decides nothing)."""

    AVAILABLE = "available"
    ABSENT = "absent"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Observation:
    """What the chain and DA answered for one receipt this step (None: not asked or no
    answer). ``found``: the earliest batch of its operator holding it, proof verified;
    ``unread_batches``: batches of its operator committed by its deadline whose manifests
    could not be read yet (DA trouble): a claim waits for them. ``claim``: (status,
    responseDeadline) of its claim."""

    found: Leaf | None = None
    unread_batches: int = 0
    da: DA | None = None
    claim: tuple[ClaimStatus, int] | None = None


Action = Literal["wait", "move", "claim", "resolve"]


@dataclass(frozen=True)
class Decision:
    action: Action
    kept: Kept  # the row as it should be written ("move"), or as it was


def decide(k: Kept, now: int, terms: Terms, obs: Observation, *, can_claim: bool) -> Decision:
    """The next step for receipt ``k`` at chain time ``now``. Only what was observed moves a
    receipt: an absent answer (None, DA.UNKNOWN) waits."""
    publish_by = publication_deadline(k.issued_at, terms.publication_deadline)
    k = replace(k, publish_by=publish_by)
    if k.state in TERMINAL:
        return Decision("wait", k)
    if k.state is State.PENDING:
        f = obs.found
        if f is not None and f.committed_at <= publish_by:
            avail_by = max(publish_by, f.committed_at) + terms.da_grace_s
            return _move(k, State.BATCHED, f"in batch {f.root} (leaf {f.leaf_index}, "
                         f"committed at {f.committed_at}); proof verified against the root",
                         batch_root=f.root, leaf_index=f.leaf_index,
                         committed_at=f.committed_at, ciphertext=f.ciphertext,
                         deadline=avail_by)
        if now <= publish_by:
            return Decision("wait", replace(k, deadline=publish_by))
        if k.claim_answered:
            # its operator proved on chain that a batch committed in time holds it, but no
            # manifest on DA shows it: past the DA grace it is unavailable
            avail_by = publish_by + terms.da_grace_s
            if now > avail_by:
                return _move(k, State.UNAVAILABLE, "the operator answered the claim with an "
                             "inclusion proof, but no manifest on DA lists the receipt")
            return Decision("wait", replace(k, deadline=avail_by))
        if obs.unread_batches:
            return Decision("wait", replace(k, deadline=publish_by,
                                            note=f"deadline {publish_by} passed; "
                                            f"{obs.unread_batches} batch manifest(s) of its "
                                            "operator not readable yet"))
        late = "committed after" if f is not None else "in no batch committed by"
        if now > publish_by + terms.claim_window:
            return _move(k, State.LATE, f"{late} its deadline {publish_by}, and the claim "
                         f"window closed at {publish_by + terms.claim_window}")
        if not can_claim:
            return _move(k, State.LATE, f"{late} its deadline {publish_by}; no claim filed "
                         "(watch-only keeper)")
        return Decision("claim", replace(k, note=f"{late} its deadline {publish_by}: filing "
                                         "the unpublished claim"))
    if k.state is State.BATCHED:
        assert k.committed_at is not None
        avail_by = max(publish_by, k.committed_at) + terms.da_grace_s
        final_after = k.committed_at + terms.challenge_window
        if obs.da is DA.AVAILABLE:
            return _move(k, State.AVAILABLE, f"ciphertext {k.ciphertext} on DA, sha256 = "
                         "ciphertextHash", deadline=final_after, final_after=final_after)
        if obs.da is DA.ABSENT and now > avail_by:
            return _move(k, State.UNAVAILABLE, f"ciphertext {k.ciphertext} not on DA (or not "
                         f"with the receipt's hash) by {avail_by}: open a full challenge "
                         f"before {final_after}")
        return Decision("wait", replace(k, deadline=avail_by))
    if k.state is State.AVAILABLE:
        assert k.final_after is not None and k.committed_at is not None
        # the window the chain has now (the contract reads it when a challenge opens; it
        # only grows), not the one it had when the receipt became available
        final_after = max(k.final_after, k.committed_at + terms.challenge_window)
        if now > final_after:
            return _move(k, State.FINAL, f"challenge window closed at {final_after}",
                         deadline=None, final_after=final_after)
        return Decision("wait", replace(k, deadline=final_after, final_after=final_after))
    if k.state is State.CLAIMED:
        if obs.claim is None:
            return Decision("wait", k)
        status, response_deadline = obs.claim
        if status is ClaimStatus.NONE:  # a reorg took the claim away: decide afresh
            return _move(k, State.PENDING, f"claim {k.claim_id} is no longer on chain (a "
                         "reorg): deciding again", claim_id=None, deadline=publish_by)
        if status is ClaimStatus.SLASHED:
            return _move(k, State.SLASHED, f"claim {k.claim_id} upheld: the operator was "
                         "slashed; the bond and α of the slash are credited to the claimant",
                         deadline=None)
        if status is ClaimStatus.ANSWERED:
            return _move(k, State.PENDING, f"claim {k.claim_id} answered: the operator proved "
                         "the receipt is in a batch committed in time (the bond went to it)",
                         claim_answered=True, deadline=publish_by + terms.da_grace_s)
        if status is ClaimStatus.OPEN and now > response_deadline:
            return Decision("resolve", replace(k, deadline=response_deadline))
        return Decision("wait", replace(k, deadline=response_deadline))
    raise AssertionError(f"unhandled state {k.state}")


def _move(k: Kept, state: State, note: str, **fields: Any) -> Decision:
    return Decision("move", replace(k, state=state, note=note, failures=0, last_error=None,
                                    **fields))


# ---- status --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeeperStatus:
    counts: dict[str, int]
    next_deadline: dict[str, Any] | None  # {"receipt", "state", "deadline"}: the soonest
    failures: list[dict[str, Any]]  # faulted receipts, receipts whose calls fail, bad batches
    cursor: int | None
    path: str

    def to_json(self) -> dict[str, Any]:
        return {"store": self.path, "counts": self.counts, "next_deadline": self.next_deadline,
                "failures": self.failures, "cursor": self.cursor}


def status_of(store: ReceiptStore) -> KeeperStatus:
    """Progress from the store alone (no chain call): counts per state, the soonest deadline
    of a receipt still in flight, every fault and every receipt whose calls keep failing."""
    counts = {str(s): n for s, n in store.counts().items()}
    live = [k for k in store.receipts() if k.state not in TERMINAL and k.deadline is not None]
    nxt = min(live, key=lambda k: k.deadline or 0, default=None)
    failures = [{"receipt": k.id, "state": str(k.state), "note": k.note,
                 "claim_id": k.claim_id, "error": k.last_error, "failures": k.failures}
                for k in store.receipts()
                if k.state in (State.SLASHED, State.UNAVAILABLE, State.LATE, State.CLAIMED)
                or k.last_error]
    failures += [{"batch": b.root, "operator": b.operator, "error": b.error}
                 for b in store.batch_errors()]
    cursor = store.meta("cursor")
    return KeeperStatus(counts, None if nxt is None else
                        {"receipt": nxt.id, "state": str(nxt.state), "deadline": nxt.deadline},
                        failures, None if cursor is None else int(cursor), str(store.path))


# ---- the keeper ----------------------------------------------------------------------------------
@dataclass
class StepReport:
    head: int = 0
    chain_time: int = 0
    batches_seen: int = 0
    moved: int = 0
    claims_filed: int = 0
    errors: int = 0


class Keeper:
    """Follows the receipts of ``store`` on the chain of ``contracts`` (a sender is needed to
    file claims) and DA ``da``. ``start_block``: the first block scanned for batches (default:
    the deployment's)."""

    def __init__(self, store: ReceiptStore, w3: Web3, deployment: Deployment,
                 contracts: Contracts, da: BlobSource, *, policy: KeeperPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random,
                 start_block: int | None = None) -> None:
        self.store, self.w3, self.deployment, self.c, self.da = store, w3, deployment, contracts, da
        self.policy = policy or KeeperPolicy()
        if self.policy.file_claims and contracts.challenges.sender is None:
            raise KeeperConfigError("a keeper that files claims needs an account (the bond "
                                    "is paid from it); or set file_claims=False",
                                    param="account")
        self.clock, self.rng = clock, rng
        self.domain = Domain(deployment.chain_id, deployment.challenge_manager)
        self.start_block = deployment.deployed_block if start_block is None else start_block
        store.bind_deployment(deployment.chain_id, deployment.challenge_manager)
        self._next_try: dict[str, float] = {}
        self._terms: Terms | None = None
        self._bond = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_lock = threading.Lock()
        self.last_error: str | None = None

    @classmethod
    def connect(cls, store: ReceiptStore, rpc_url: str, deployment: Deployment | str | Path,
                da: BlobSource, *, account: LocalAccount | None = None,
                policy: KeeperPolicy | None = None, **kw: Any) -> Keeper:
        """A keeper over ``rpc_url`` (every request under the policy's RPC deadline)."""
        pol = policy or KeeperPolicy(file_claims=account is not None)
        dep = deployment if isinstance(deployment, Deployment) else Deployment.load(
            Path(deployment))
        w3 = bounded_web3(rpc_url, deadline_s=pol.rpc_deadline_s)
        sender = None if account is None else TxSender(w3, account,
                                                        timeout=pol.send_deadline_s * 0.8)
        return cls(store, w3, dep, dep.bind(w3, sender), da, policy=pol, **kw)

    # ---- what to keep ------------------------------------------------------------------------
    def track(self, receipts: Iterable[Checked | SignedReceipt]) -> int:
        """Keeps receipts (the verified client's :class:`Checked` or signed receipts of this
        deployment); returns how many were new."""
        n = 0
        for r in receipts:
            s = r if isinstance(r, SignedReceipt) else SignedReceipt(r.receipt, r.domain,
                                                                      r.signature)
            if s.domain != self.domain:
                raise KeeperConfigError(f"receipt 0x{s.digest.hex()} is signed for "
                                        f"{s.domain.to_json()}, not this keeper's chain",
                                        param="receipt")
            n += self.store.add(s)
        return n

    # ---- one step ----------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        return call_within(what, fn, self.policy.rpc_deadline_s if deadline_s is None
                           else deadline_s, thread_name="keeper")

    def terms(self) -> Terms:
        """ProtocolConfig's parameters as the chain has them now, read at every step:
        governance changes them (the bond at any time, the deadlines and windows upward), and
        a claim pays the bond and is judged by the deadline the contract reads when it opens,
        so terms kept from an earlier step would pay a bond the contract refuses or claim a
        receipt whose batch met the deadline (the bond lost to its operator)."""
        p = self._call("params", self.c.config.params)
        self._terms, self._bond = Terms.of(p, self.policy.da_grace_s), p.challenge_bond
        return self._terms

    def step(self) -> StepReport:
        """Scan new batches, read the manifests that may hold kept receipts, then move every
        receipt in flight on by at most one chain or DA call. A failure to read the head or
        the batches raises (nothing moves); a failure about one receipt is retried later."""
        with self._step_lock:
            rep = StepReport()
            head = self._call("eth_getBlock", lambda: self.w3.eth.get_block("latest"))
            rep.head, rep.chain_time = int(head["number"]), int(head["timestamp"])
            terms = self.terms()
            live = self.store.receipts([s for s in State if s not in TERMINAL])
            rep.batches_seen = self._scan(rep.head)
            waiting = {k.operator for k in live if k.state is State.PENDING}
            self._read_manifests(waiting, rep.chain_time, terms)
            for k in live:
                if self.clock() < self._next_try.get(k.id, 0.0):
                    continue
                try:
                    self._advance(k, rep, terms)
                    self._next_try.pop(k.id, None)
                except StoreConflictError:
                    continue  # another writer moved it: decided again next step
                except (VerinferError, OSError, ValueError) as e:
                    rep.errors += 1
                    self._failed(k, e)
            return rep

    def _scan(self, head: int) -> int:
        cursor_s = self.store.meta("cursor")
        cursor = self.start_block - 1 if cursor_s is None else int(cursor_s)
        lo = max(self.start_block, cursor + 1 - REORG_OVERLAP_BLOCKS)
        seen = 0
        while lo <= head:
            hi = min(head, lo + self.policy.log_chunk_blocks - 1)
            found = self._call("eth_getLogs(BatchCommitted)",
                               partial(batches_committed, self.c.batches, lo, hi))
            self.store.add_batches((BatchRow(to_hex(b.root), b.operator, b.leaf_count,
                                             b.da_pointer, b.block_number) for b in found),
                                   max(hi, cursor))
            seen += len(found)
            lo = hi + 1
        return seen

    def _read_manifests(self, operators: set[str], now: int, terms: Terms) -> None:
        for b in self.store.unread_batches(operators):
            committed_at = b.committed_at
            try:
                info = self._call("batchOf", partial(
                    self.c.batches.batch_of, Web3.to_checksum_address(b.operator),
                    parse_hex(b.root, 32, "root")))
                if not info.exists:
                    self.store.batch_failed(b, "not committed on chain (a reorg?)", final=True)
                    continue
                committed_at = info.committed_at
                pointer = Pointer.parse(b.pointer)
                blob = self._call("DA get(manifest)", partial(self.da.get, pointer),
                                  self.policy.da_deadline_s)
                if len(blob) > max_manifest_bytes(b.leaf_count):
                    raise ManifestError(f"{len(blob)} bytes: more than a manifest of "
                                        f"{b.leaf_count} receipts")
                m = parse_manifest(blob, self.domain)
                root = parse_hex(b.root, 32, "root")
                if m.leaf_count != b.leaf_count:
                    raise ManifestError(f"lists {m.leaf_count} receipts, the batch "
                                        f"{b.leaf_count}")
                leaves = []
                for i, e in enumerate(m.entries):
                    if e.signed.receipt.operator.lower() != b.operator.lower():
                        continue  # the contract looks receipts up under their own operator
                    proof = m.proof(e.signed.digest)
                    if not verify_proof(e.signed.digest, proof, root):
                        raise ManifestError(f"entry {i}'s proof does not lead to the committed "
                                            f"root {b.root}")
                    leaves.append(Leaf(to_hex(e.signed.digest), b.operator, b.root,
                                       proof.index, tuple(to_hex(s) for s in proof.siblings),
                                       str(e.ciphertext), info.committed_at))
                self.store.batch_read(b, leaves, info.committed_at)
            except (ManifestError, CommitmentMismatchError, MalformedPointerError) as e:
                self.store.batch_failed(b, f"manifest {b.pointer[:90]}: {_msg(e)}", final=True,
                                        committed_at=committed_at)
            except BlobNotFoundError as e:
                # not on DA (yet): after the grace it never will be (the claim decides)
                final = committed_at is not None and now > committed_at + terms.da_grace_s
                self.store.batch_failed(b, f"manifest {b.pointer[:90]} not on DA: {_msg(e)}",
                                        final=final, committed_at=committed_at)
            except (VerinferError, OSError, ValueError) as e:
                self.store.batch_failed(b, f"manifest {b.pointer[:90]}: {_msg(e)}", final=False,
                                        committed_at=committed_at)

    def _observe(self, k: Kept, terms: Terms) -> Observation:
        if k.state is State.PENDING:
            leaves = self.store.leaves_of(k.id, k.operator)
            publish_by = publication_deadline(k.issued_at, terms.publication_deadline)
            found = next((lf for lf in leaves if lf.committed_at <= publish_by),
                         leaves[0] if leaves else None)
            unread = [b for b in self.store.unread_batches([k.operator])
                      if b.committed_at is None or b.committed_at <= publish_by]
            return Observation(found=found, unread_batches=len(unread))
        if k.state is State.BATCHED:
            return Observation(da=self._availability(k))
        if k.state is State.CLAIMED:
            assert k.claim_id is not None
            cl = self._call("claim", lambda: self.c.challenges.claim(int(k.claim_id or 0)))
            return Observation(claim=(cl.status, cl.response_deadline))
        return Observation()

    def _availability(self, k: Kept) -> DA:
        assert k.ciphertext is not None
        try:
            pointer = Pointer.parse(k.ciphertext)
            blob = self._call("DA get(ciphertext)", lambda: self.da.get(pointer),
                              self.policy.da_deadline_s)
        except (BlobNotFoundError, CommitmentMismatchError, MalformedPointerError):
            return DA.ABSENT
        if hashlib.sha256(blob).digest() != k.signed.receipt.ciphertext_hash:
            return DA.ABSENT
        return DA.AVAILABLE

    def _advance(self, k: Kept, rep: StepReport, terms: Terms) -> None:
        obs = self._observe(k, terms)
        d = decide(k, rep.chain_time, terms, obs, can_claim=self.policy.file_claims)
        if d.action == "move" or (d.action == "wait" and _changed(k, d.kept)):
            # an answer came: the failures before it are over
            self.store.update(k, replace(d.kept, failures=0, last_error=None))
            rep.moved += d.action == "move"
            if d.action == "move":
                log.info("receipt %s: %s -> %s (%s)", k.id, k.state, d.kept.state, d.kept.note)
        elif d.action == "claim":
            try:
                cid, response_deadline = self._file_claim(k)
            except _AlreadySlashed:
                self.store.update(k, replace(d.kept, state=State.SLASHED, deadline=None,
                                             note="already slashed for being unpublished "
                                             "(someone else's claim was upheld)"))
                rep.moved += 1
                return
            rep.claims_filed += 1
            self.store.update(k, replace(d.kept, state=State.CLAIMED, claim_id=cid,
                                         deadline=response_deadline, failures=0,
                                         last_error=None,
                                         note=f"{d.kept.note}: claim {cid} filed, the "
                                         f"operator may answer until {response_deadline}"))
            log.warning("receipt %s: unpublished claim %d filed", k.id, cid)
        elif d.action == "resolve":
            assert k.claim_id is not None
            cid = k.claim_id
            try:
                self._call("resolveUnpublished",
                           lambda: self.c.challenges.resolve_unpublished(cid),
                           self.policy.send_deadline_s)
            except ContractRevertError as e:
                if e.error_name != "ClaimNotOpen":  # resolved by someone else: read next step
                    raise
            self.store.update(k, replace(d.kept, note=f"claim {cid}: response period over, "
                                         "resolveUnpublished sent"))

    def _file_claim(self, k: Kept) -> tuple[int, int]:
        """Files ``claimUnpublished`` (idempotent: a claim already live on the receipt — ours,
        sent before a crash or a deadline, or anyone's — is adopted, not paid for again)."""
        digest = k.signed.digest
        rs = self._call("receiptState", lambda: self.c.challenges.receipt_state(digest))
        live = rs.live_claim
        if live == 0 and rs.unpublished_slashed:
            raise _AlreadySlashed()
        if live == 0:
            # a deadline here leaves the claim perhaps mined: the retry reads receiptState first
            live = self._call("claimUnpublished", lambda: self.c.challenges.claim_unpublished(
                k.signed.receipt, k.signed.signature, self._bond), self.policy.send_deadline_s)
        cl = self._call("claim", lambda: self.c.challenges.claim(live))
        return live, cl.response_deadline

    def _failed(self, k: Kept, e: BaseException) -> None:
        msg = _msg(e)
        n = k.failures + 1
        self._next_try[k.id] = self.clock() + self.policy.backoff.delay(n, self.rng)
        log.warning("receipt %s (%s): %s (attempt %d)", k.id, k.state, msg, n)
        with contextlib.suppress(StoreConflictError):
            self.store.update(k, replace(k, failures=n, last_error=msg[:500]))

    # ---- running -----------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, *,
            sleep: Callable[[float], None] | None = None, until: Callable[[], bool] | None = None
            ) -> None:
        """Steps every ``poll_s`` until ``stop`` is set (or ``until()`` is true); a failed
        step backs off (with jitter) and never ends the loop."""
        stop = stop or self._stop
        wait = sleep or (lambda s: stop.wait(s) and None)
        failures = 0
        while not stop.is_set() and not (until is not None and until()):
            try:
                self.step()
                failures, self.last_error = 0, None
            except Exception as e:  # keep following: an RPC outage must not end the keeper
                failures += 1
                self.last_error = _msg(e)
                log.warning("keeper step failed (%d in a row): %s", failures, self.last_error)
            wait(self.policy.poll_s if failures == 0 else
                 max(self.policy.poll_s, self.policy.backoff.delay(failures, self.rng)))

    def start(self) -> Keeper:
        """Runs :meth:`run` in a daemon thread (the app's background follower)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="receipt-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is not None else
                              self.policy.send_deadline_s + self.policy.rpc_deadline_s)
            self._thread = None

    async def run_async(self, stop: asyncio.Event) -> None:
        """:meth:`run` for an asyncio app: each step in a worker thread, until ``stop``."""
        failures = 0
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.step)
                failures, self.last_error = 0, None
            except Exception as e:
                failures += 1
                self.last_error = _msg(e)
                log.warning("keeper step failed (%d in a row): %s", failures, self.last_error)
            delay = (self.policy.poll_s if failures == 0 else
                     max(self.policy.poll_s, self.policy.backoff.delay(failures, self.rng)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def status(self) -> KeeperStatus:
        return status_of(self.store)


class _AlreadySlashed(Exception):
    """The receipt's operator was already slashed for not publishing it: no claim is due."""


def _changed(a: Kept, b: Kept) -> bool:
    return ((a.deadline, a.publish_by, a.note) != (b.deadline, b.publish_by, b.note)
            or a.failures != 0 or a.last_error is not None)


def _msg(e: BaseException) -> str:
    return e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"


__all__ = ["DA", "Decision", "Keeper", "KeeperConfigError", "KeeperPolicy",
           "KeeperStatus", "Observation", "StepReport", "Terms", "decide",
           "status_of"]
