"""The committee member node: follows the chain, and when drawn for a challenge runs the
enclave flow, commits, then reveals its vote within the deadlines, resolves challenges that
are ready, and withdraws its rewards.

Each ``step()`` reads the chain once and moves every known challenge forward by at most one
transaction, so a node that restarts continues where it stopped: its votes and salts are kept
in a JSON state file (a salt must survive until the reveal, or the member is penalized).

Fault classes (docs/verifier.md §4): whatever the operator controls (manifest, ciphertext,
envelope, request body, ExecRequest) and gets wrong is an OperatorFault and becomes an
INVALID_EVIDENCE vote — abstaining would hand a cheating operator an inconclusive challenge for
free. Only this node's own side (RPC, DA connection, KMS quorum, enclave) is a LocalFault: it
is retried with exponential backoff for as long as the commit window is open.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eth_account.signers.local import LocalAccount

from verinfer.chain.bindings import Contracts, vote_commitment
from verinfer.chain.errors import ChainError, ContractRevertError
from verinfer.chain.stake import Declared, ensure_declared
from verinfer.chain.structs import FINAL, INVALID_EVIDENCE, Role, Status, VoteState
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S, Receipt
from verinfer.verifier.chain_view import ChainView, OpenedChallenge
from verinfer.verifier.enclave_judge import BlobSource
from verinfer.verifier.errors import CannotJudgeError, LocalFault, OperatorFault
from verinfer.verifier.votes import Verdict


class JudgeFn(Protocol):
    def __call__(self, receipt: Receipt, pointer: str | None, *, purpose: str,
                 challenge_id: str, absent_is_fault: bool = True) -> Verdict: ...


@dataclass
class NodeConfig:
    state_file: Path
    resolve: bool = True  # settle challenges whose votes are in
    claim_rewards: bool = True
    retry_initial_s: float = 1.0  # first wait after a local fault; doubles per failure
    retry_max_s: float = 30.0  # cap: a long outage is still retried every 30 s until the deadline


def absent_is_final(chain_ts: int, issued_at: int, publication_deadline: int,
                    commit_deadline: int, commit_period: int) -> bool:
    """Whether "DA has no such blob" is the operator's fault yet (then it is voted on).
    Inside the publication window it may be DA propagation lag, so it is retried; it becomes
    final once the window has passed — or when only a quarter of the commit window is left, so
    that an operator cannot run the clock out (committing a batch asserts its data is
    published). Every honest member applies the same chain-time thresholds."""
    return (chain_ts > issued_at + publication_deadline
            or chain_ts >= commit_deadline - commit_period // 4)


@dataclass
class NodeStats:
    judged: int = 0
    operator_faults: int = 0  # voted INVALID_EVIDENCE without decrypting (manifest, ...)
    local_faults: int = 0  # retried (RPC, DA connection, KMS quorum)
    committed: int = 0
    revealed: int = 0
    resolved: int = 0
    withdrawn_wei: int = 0
    errors: list[str] = field(default_factory=list)


class VerifierNode:
    def __init__(self, view: ChainView, contracts: Contracts, account: LocalAccount,
                 judge: JudgeFn, da: BlobSource, cfg: NodeConfig, *,
                 salt: Callable[[], bytes] = lambda: secrets.token_bytes(32),
                 log: Callable[[str], None] = lambda s: None,
                 tx_lock: threading.Lock | None = None) -> None:
        self.view, self.c, self.account, self.judge, self.da = view, contracts, account, judge, da
        self.cfg, self.salt, self.log = cfg, salt, log
        self.tx_lock = tx_lock or threading.Lock()
        self.me = str(account.address)
        self.stats = NodeStats()
        self._state: dict[str, dict[str, Any]] = self._load()
        self._finished: set[int] = set()
        self._abstained: set[int] = set()  # this verifier cannot judge (not its model)
        self.retries: dict[int, tuple[int, float]] = {}  # cid -> (local faults, next try)
        self.clock: Callable[[], float] = time.monotonic

    # ---- persistent votes --------------------------------------------------------------------
    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data: dict[str, dict[str, Any]] = json.loads(self.cfg.state_file.read_text())
            return data
        except FileNotFoundError:
            return {}

    def _save(self) -> None:
        tmp = self.cfg.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=1, sort_keys=True))
        tmp.replace(self.cfg.state_file)

    # ---- registration ------------------------------------------------------------------------
    def ensure_registered(self, stake_wei: int) -> bool:
        """Registers as a verifier with ``stake_wei`` unless already registered."""
        if self.c.stakes.account_of(self.me).role is Role.VERIFIER:
            return False
        with self.tx_lock:
            self.c.stakes.register(Role.VERIFIER, stake_wei)
        return True

    def ensure_declared(self, pairs: Iterable[tuple[bytes, bytes]]) -> Declared:
        """Declares the (engine fingerprint hash, model id) pairs this verifier re-executes
        (the approved ones it does not cover yet): committees of a receipt are drawn only from
        verifiers declared for its (fingerprint, model), so a verifier that never declares is
        never drawn, and one holding model A is never drawn for a receipt of model B.
        A pending undeclaration is kept (a restart must not undo a decision to leave):
        ``verinfer chain verifier declare`` is the explicit way to cancel one."""
        with self.tx_lock:
            return ensure_declared(self.c, self.me, pairs, keep_leaving=True)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, stop: Callable[[], bool], poll_s: float = 0.25) -> None:
        failures = 0  # consecutive failed steps: this node's RPC is down or lying
        while not stop():
            try:
                self.step()
                failures = 0
            except VerinferError as e:
                failures += 1
                self._error(f"step: {e.message}")
            except Exception as e:  # keep serving: one bad RPC answer must not end the node
                failures += 1
                self._error(f"step: {type(e).__name__}: {e}")
            # a local outage is retried with backoff (capped), still watching for stop
            wait = poll_s if failures == 0 else min(poll_s * 2 ** failures, self.cfg.retry_max_s)
            until = time.monotonic() + wait
            while not stop() and time.monotonic() < until:
                time.sleep(min(poll_s, 0.2))

    def _error(self, msg: str) -> None:
        self.stats.errors.append(msg)
        self.log(msg)

    def step(self) -> None:
        number, ts = self.view.head()
        for oc in self.view.opened():
            if oc.challenge_id not in self._finished:
                self._advance(oc, number, ts)
        if self.cfg.claim_rewards and self.c.challenges.credits(self.me) > 0:
            amount = self.c.challenges.credits(self.me)
            if self._send(lambda: self.c.challenges.withdraw_credits(), "withdrawCredits"):
                self.stats.withdrawn_wei += amount

    def awaiting_block(self, target_block: int, number: int) -> None:
        """A challenge waits for the chain to pass ``target_block`` (its committee's draw
        block); the head is ``number``. A real chain gets there by itself, so the node only
        waits. (A devnet's anvil mines only on transactions: the devnet mines for it, in a
        process of its own or with ``verinfer.testing.chain_clock.MiningNode``.)"""

    def _send(self, fn: Callable[[], object], what: str) -> bool:
        try:
            with self.tx_lock:
                fn()
            return True
        except ContractRevertError as e:  # someone else was first, or a deadline passed
            self.log(f"{what}: {e.error_name}{e.error_args}")
        except ChainError as e:
            self.log(f"{what}: {e.message}")
        return False

    def _advance(self, oc: OpenedChallenge, number: int, ts: int) -> None:
        cid = oc.challenge_id
        info = self.c.challenges.challenge(cid)
        if info.status in FINAL:
            self._finished.add(cid)
            return
        if info.status is Status.AWAITING_DRAW:
            if number > info.target_block:
                if self._send(lambda: self.c.challenges.draw_committee(cid), "drawCommittee"):
                    self.log(f"challenge {cid}: committee drawn")
            else:
                self.awaiting_block(info.target_block, number)
            return
        vote = self.c.challenges.vote(cid, self.me)
        if vote.state is VoteState.NONE:
            if self.cfg.resolve and (info.reveals == info.members or ts > info.reveal_deadline):
                self._resolve(cid)
            return
        if vote.state is VoteState.MEMBER:
            if ts <= info.commit_deadline:
                self._commit(oc, info, ts)
            return
        if vote.state is VoteState.COMMITTED:
            reveal_open = info.commits == info.members or ts > info.commit_deadline
            if reveal_open and ts <= info.reveal_deadline:
                self._reveal(cid)
            return
        if self.cfg.resolve and (info.reveals == info.members or ts > info.reveal_deadline):
            self._resolve(cid)

    def _commit(self, oc: OpenedChallenge, info: Any, ts: int) -> None:
        cid = oc.challenge_id
        key = str(cid)
        if key not in self._state:
            if cid in self._abstained:
                return
            failures, next_try = self.retries.get(cid, (0, 0.0))
            if self.clock() < next_try:
                return
            try:
                verdict = self._judge(oc, info, ts)
            except CannotJudgeError as e:  # not this verifier's model: a legitimate abstention
                self._abstained.add(cid)
                self._error(f"challenge {cid}: abstains: {e.message}")
                return
            except Exception as e:  # LocalFault, RPC errors: anything of ours
                # Operator faults never get here (they are verdicts), so what is left is this
                # verifier's own side: retry with backoff while the commit window is open.
                delay = min(self.cfg.retry_initial_s * 2 ** failures, self.cfg.retry_max_s)
                self.retries[cid] = (failures + 1, self.clock() + delay)
                self.stats.local_faults += 1
                msg = e.message if isinstance(e, VerinferError) else f"{type(e).__name__}: {e}"
                self._error(f"challenge {cid}: local fault, retry in {delay:.1f}s: {msg}")
                return
            self.retries.pop(cid, None)
            self.stats.judged += 1
            self._state[key] = {"vote": to_hex(verdict.vote), "salt": to_hex(self.salt()),
                                "reason": verdict.reason, "phase": "judged"}
            self._save()
            self.log(f"challenge {cid}: vote {verdict.reason} "
                     f"({'agrees' if verdict.agrees else 'disagrees'} with the receipt)")
        st = self._state[key]
        commitment = vote_commitment(cid, self.me, parse_hex(st["vote"], 32, "vote"),
                                     parse_hex(st["salt"], 32, "salt"))
        if self._send(lambda: self.c.challenges.commit_vote(cid, commitment), "commitVote"):
            st["phase"] = "committed"
            self._save()
            self.stats.committed += 1

    def _judge(self, oc: OpenedChallenge, info: Any, ts: int) -> Verdict:
        """This member's verdict; OperatorFault becomes an INVALID_EVIDENCE vote here."""
        p = self.c.config.params()
        out_hash = bytes(info.receipt_out_hash)
        issued_at = (oc.signed.receipt.issued_at if oc.signed is not None
                     else self._latest_issued_at(oc))
        try:
            entry = self.view.challenged_entry(
                self.da, oc, absent_is_fault=absent_is_final(
                    ts, issued_at, p.publication_deadline, info.commit_deadline,
                    p.commit_period))
            receipt = entry.signed.receipt
            return self.judge(receipt, str(entry.ciphertext), purpose="full_challenge",
                              challenge_id=str(oc.challenge_id),
                              absent_is_fault=absent_is_final(
                                  ts, receipt.issued_at, p.publication_deadline,
                                  info.commit_deadline, p.commit_period))
        except OperatorFault as f:
            self.stats.operator_faults += 1
            return Verdict(INVALID_EVIDENCE, f.reason, out_hash, detail=f.message[:200])

    def _latest_issued_at(self, oc: OpenedChallenge) -> int:
        """The latest issuedAt the challenged receipt can have, from chain state, for a
        challenge whose receipt the node could not read from the calldata (opened through a
        contract). openChallenge slashes at open a receipt dated after its batch's commit +
        MAX_CLOCK_SKEW, so a challenge that reached a committee has issuedAt <= that bound:
        measuring the manifest's absence from it never accuses before the receipt's own
        publication window has closed (from issuedAt 0 it would accuse at once, issue 31
        finding 5), and the commit-deadline rule of absent_is_final still decides in time."""
        committed_at = self.c.batches.batch(oc.batch_id).committed_at
        if committed_at == 0:  # the chain opened a challenge on it: our RPC is behind
            raise LocalFault(f"batch 0x{oc.batch_id.hex()} is not committed on chain "
                             "(RPC behind?)")
        return committed_at + MAX_ISSUED_AT_SKEW_S

    def _reveal(self, cid: int) -> None:
        st = self._state.get(str(cid))
        if st is None:
            self._error(f"challenge {cid}: committed but no stored vote (state file lost)")
            self._finished.add(cid)
            return
        if self._send(lambda: self.c.challenges.reveal_vote(
                cid, parse_hex(st["vote"], 32, "vote"), parse_hex(st["salt"], 32, "salt")),
                "revealVote"):
            st["phase"] = "revealed"
            self._save()
            self.stats.revealed += 1

    def _resolve(self, cid: int) -> None:
        if self._send(lambda: self.c.challenges.resolve(cid), "resolve"):
            self.stats.resolved += 1
            self.log(f"challenge {cid}: resolved")
