"""The explorer's in-memory index: what the contracts' events say, folded event by event.

The follower (``follower.py``) feeds it decoded logs in chain order (``apply``) and the batch
manifests it read from DA (``add_manifest``); pages only read it, under its lock, so a page
costs dictionary look-ups whatever the chain's length. ``version`` counts changes: the live
pages poll it and refresh when it moves.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verinfer.chain.bindings import BatchRegistryContract
from verinfer.chain.structs import ClaimStatus, Kind, Role, Status
from verinfer.da_client.manifest import BatchManifest
from verinfer.receipts.merkle import MerkleTree, build_tree
from verinfer.receipts.signed import SignedReceipt

#: ChallengeManager.Fault, by value (Unpublished: an unpublished claim upheld).
FAULTS = ("reexecution", "invalid receipt", "unpublished")


@dataclass(frozen=True)
class EventMeta:
    """Where a log sits on chain."""

    block: int
    time: int
    tx: bytes
    log_index: int


@dataclass
class StakePoint:
    block: int
    time: int
    stake: int
    what: str


@dataclass
class Slash:
    operator: str
    receipt_digest: bytes
    fault: str
    amount: int
    dispute_id: int
    block: int
    time: int


@dataclass
class Account:
    """A staked account (operator or verifier) as its StakeRegistry events describe it."""

    address: str
    role: Role = Role.NONE
    stake: int = 0
    unbonding: int = 0
    locked: int = 0
    weight: int = 0
    history: list[StakePoint] = field(default_factory=list)
    batches: list[bytes] = field(default_factory=list)
    challenges: list[int] = field(default_factory=list)  # opened against it (operators)
    claims: list[int] = field(default_factory=list)
    committees: list[int] = field(default_factory=list)  # sat on (verifiers)
    opened: list[int] = field(default_factory=list)  # challenges it opened (anyone)
    slashes: list[Slash] = field(default_factory=list)
    audits: int = 0  # light audits it recorded (verifiers)


@dataclass
class Batch:
    batch_id: bytes
    operator: str
    root: bytes
    leaf_count: int
    da_pointer: str
    block: int
    time: int
    receipts: list[bytes] = field(default_factory=list)
    manifest: str = "pending"  # pending | ok | unavailable | invalid
    manifest_error: str = ""
    _tree: MerkleTree | None = None

    def tree(self) -> MerkleTree:
        """The Merkle tree over the manifest's digests, built once on first use."""
        if self._tree is None:
            self._tree = build_tree(self.receipts)
        return self._tree


@dataclass
class ReceiptEntry:
    signed: SignedReceipt
    batch_id: bytes
    index: int
    ciphertext: str


@dataclass
class Vote:
    member: str
    weight: int
    commitment: bytes = b""
    committed_at: int = 0
    out_hash: bytes = b""
    revealed_at: int = 0
    penalty: int = 0


@dataclass
class Challenge:
    id: int
    receipt_digest: bytes
    operator: str
    challenger: str
    batch_id: bytes
    bond: int
    target_block: int
    opened_block: int
    opened_at: int
    drawn_at: int = 0
    commit_deadline: int = 0
    reveal_deadline: int = 0
    votes: dict[str, Vote] = field(default_factory=dict)
    rearmed: int = 0
    status: Status = Status.AWAITING_DRAW
    resolved_at: int = 0
    resolved_block: int = 0
    majority_out_hash: bytes = b""
    slashed: int = 0
    resolve_tx: bytes = b""

    @property
    def final(self) -> bool:
        return self.status in (Status.DISMISSED, Status.SLASHED, Status.INCONCLUSIVE)


@dataclass
class Claim:
    id: int
    receipt_digest: bytes
    operator: str
    claimant: str
    publish_by: int
    response_deadline: int
    opened_block: int
    opened_at: int
    status: ClaimStatus = ClaimStatus.OPEN
    answered_batch: bytes = b""
    slashed: int = 0
    settled_at: int = 0


@dataclass
class AuditRecord:
    receipt_digest: bytes
    auditor: str
    observed_out_hash: bytes
    matches: bool
    report_hash: bytes
    block: int
    time: int


@dataclass
class KeyEpoch:
    epoch: int
    public_key: bytes
    threshold: int
    shard_count: int
    registered_at: int
    retired_at: int = 0


@dataclass
class Approval:
    kind: Kind
    item: bytes
    since: int
    until: int = 0


class Index:
    """Everything the explorer knows, folded from events. Not thread-safe by itself: hold
    ``lock`` (the follower writes under it, the views read under it)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.version = 0
        self.indexed_block = -1  # every log up to this block is folded in
        self.head_block = -1
        self.head_time = 0
        self.params: dict[str, int] = {}
        # the StakeRegistry's operator minimum in force (ParamsSynced) and raises waiting for
        # their notice by role (MinimumRaisePending: pending minimum, effective chain time): a
        # governance raise (ParamsSet) does not make an operator inactive until it applies
        self.min_operator_stake_in_force: int | None = None
        self.pending_minimums: dict[Role, tuple[int, int]] = {}
        self.accounts: dict[str, Account] = {}
        self.batches: dict[bytes, Batch] = {}  # in commit order
        self.batch_by_pointer: dict[str, bytes] = {}
        self.batches_by_root: dict[bytes, list[bytes]] = {}
        self.receipts: dict[bytes, ReceiptEntry] = {}
        # every indexed receipt in the order its batch was read, and the same by model id and
        # by operator (the /receipts list and its filters page through these)
        self.receipt_order: list[bytes] = []
        self.receipts_by_model: dict[bytes, list[bytes]] = {}
        self.receipts_by_operator: dict[str, list[bytes]] = {}
        self.operators_by_model: dict[bytes, set[str]] = {}
        self.receipt_by_ciphertext: dict[str, bytes] = {}
        self.challenges: dict[int, Challenge] = {}
        self.challenges_by_receipt: dict[bytes, list[int]] = {}
        self.claims: dict[int, Claim] = {}
        self.claims_by_receipt: dict[bytes, list[int]] = {}
        self.slashes: list[Slash] = []
        self.audits: list[AuditRecord] = []
        self.audits_by_receipt: dict[bytes, list[int]] = {}
        self.approvals: dict[tuple[Kind, bytes], Approval] = {}
        self.epochs: dict[int, KeyEpoch] = {}
        self.credits_by_tx: dict[bytes, list[tuple[str, int]]] = {}
        self.burnt = 0
        self.unknown_events = 0
        self.follower_error = ""  # the chain follower's last failure ("" while it keeps up)

    # ---- writing ---------------------------------------------------------------------------
    def touch(self) -> None:
        self.version += 1

    def apply(self, name: str, args: Mapping[str, Any], meta: EventMeta) -> None:
        """Folds one decoded event in. Unknown event names are counted, not fatal: a newer
        contract may emit events this explorer does not show yet."""
        handler = getattr(self, f"_on_{name}", None)
        if handler is None:
            self.unknown_events += 1
            return
        handler(args, meta)
        self.touch()

    def account(self, address: str) -> Account:
        acct = self.accounts.get(address)
        if acct is None:
            acct = self.accounts[address] = Account(address)
        return acct

    def add_manifest(self, batch_id: bytes, manifest: BatchManifest) -> None:
        """The batch's receipts, from its manifest on DA (parsed and checked by the caller).
        A manifest whose root is not the committed root names no receipt of this batch."""
        b = self.batches[batch_id]
        if manifest.root != b.root:
            self.manifest_failed(batch_id, "invalid", f"the manifest's root 0x"
                                 f"{manifest.root.hex()} is not the committed root")
            return
        if manifest.leaf_count != b.leaf_count:
            self.manifest_failed(batch_id, "invalid", f"the manifest has {manifest.leaf_count} "
                                 f"receipts, the commitment says {b.leaf_count}")
            return
        b.receipts = list(manifest.digests)
        b.manifest, b.manifest_error, b._tree = "ok", "", None
        foreign = 0
        for i, e in enumerate(manifest.entries):
            d = e.signed.digest
            if e.signed.receipt.operator != b.operator:
                # The contract looks a receipt's batch up under the receipt's own operator:
                # another operator's receipt in this batch proves nothing, and indexing it
                # here would let anyone shadow that operator's receipts with a batch of theirs.
                foreign += 1
                continue
            # the first batch to commit a receipt holds it (the contract accepts any batch
            # of its operator that includes it; the first is what its deadline was met by)
            if d not in self.receipts:
                self.receipts[d] = ReceiptEntry(e.signed, batch_id, i, str(e.ciphertext))
                self.receipt_by_ciphertext.setdefault(str(e.ciphertext), d)
                self.receipt_order.append(d)
                self.receipts_by_model.setdefault(e.signed.receipt.model_id, []).append(d)
                self.receipts_by_operator.setdefault(b.operator, []).append(d)
                self.operators_by_model.setdefault(e.signed.receipt.model_id,
                                                   set()).add(b.operator)
        if foreign:
            b.manifest_error = (f"{foreign} receipt(s) name another operator: not indexed "
                                "under this batch")
        self.touch()

    def manifest_failed(self, batch_id: bytes, state: str, error: str) -> None:
        b = self.batches[batch_id]
        b.manifest, b.manifest_error = state, error[:500]
        self.touch()

    # ---- StakeRegistry ---------------------------------------------------------------------
    def _stake_point(self, acct: Account, meta: EventMeta, what: str) -> None:
        acct.history.append(StakePoint(meta.block, meta.time, acct.stake, what))

    def _on_Registered(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        acct = self.account(str(a["account"]))
        acct.role, acct.stake = Role(int(a["role"])), int(a["amount"])
        self._stake_point(acct, meta, "registered")

    def _on_Bonded(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        acct = self.account(str(a["account"]))
        acct.stake = int(a["newStake"])
        self._stake_point(acct, meta, f"bonded {int(a['amount'])}")

    def _on_UnbondRequested(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        acct = self.account(str(a["account"]))
        acct.stake = max(0, acct.stake - int(a["amount"]))
        acct.unbonding = int(a["totalUnbonding"])
        self._stake_point(acct, meta, f"unbond requested {int(a['amount'])}")

    def _on_Withdrawn(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        acct = self.account(str(a["account"]))
        acct.unbonding = max(0, acct.unbonding - int(a["amount"]))
        self._stake_point(acct, meta, f"withdrew {int(a['amount'])}")

    def _on_Locked(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        self.account(str(a["account"])).locked = int(a["totalLocked"])

    def _on_Unlocked(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        self.account(str(a["account"])).locked = int(a["totalLocked"])

    def _on_Slashed(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        acct = self.account(str(a["account"]))
        acct.stake = int(a["newStake"])
        # slashLocked releases the slashed liability without an Unlocked event (the amount
        # taken is the liability unless the stake ran out, when both end at zero)
        acct.locked = max(0, acct.locked - int(a["amount"])) if acct.stake else 0
        acct.unbonding = min(acct.unbonding, acct.stake)
        self._stake_point(acct, meta, f"slashed {int(a['amount'])}")

    def _on_WeightChanged(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        self.account(str(a["account"])).weight = int(a["weight"])

    # ---- ProtocolConfig --------------------------------------------------------------------
    def _on_ParamsSet(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        # the struct's camelCase names as the Params dataclass spells them (snake_case)
        p = a["params"]
        self.params = {_snake(k): int(v) for k, v in p.items()} if isinstance(p, Mapping) \
            else {}

    # ---- StakeRegistry: the minimums in force ---------------------------------------------
    def _on_ParamsSynced(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        self.min_operator_stake_in_force = int(a["minOperatorStake"])
        pending = self.pending_minimums.get(Role.OPERATOR)
        if pending is not None and (self.min_operator_stake_in_force >= pending[0]
                                    or meta.time >= pending[1]):
            del self.pending_minimums[Role.OPERATOR]  # applied, or replaced by a lower one

    def _on_MinimumRaisePending(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        try:
            role = Role(int(a["role"]))
        except ValueError:
            self.unknown_events += 1
            return
        self.pending_minimums[role] = (int(a["pending"]), int(a["effectiveAt"]))

    def _on_Approved(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        kind, item = Kind(int(a["kind"])), bytes(a["id"])
        self.approvals[(kind, item)] = Approval(kind, item, int(a["since"]))

    def _on_Revoked(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        key = (Kind(int(a["kind"])), bytes(a["id"]))
        if key in self.approvals:
            self.approvals[key].until = int(a["until"])

    def _on_KeyEpochRegistered(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        e = int(a["epoch"])
        self.epochs[e] = KeyEpoch(e, bytes(a["publicKey"]), int(a["threshold"]),
                                  int(a["shardCount"]), meta.time)

    def _on_KeyEpochRetired(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        e = self.epochs.get(int(a["epoch"]))
        if e is not None:
            e.retired_at = int(a["time"])

    # ---- BatchRegistry ---------------------------------------------------------------------
    def _on_BatchCommitted(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        op, root = str(a["operator"]), bytes(a["root"])
        bid = BatchRegistryContract.batch_id(op, root)
        self.batches[bid] = Batch(bid, op, root, int(a["leafCount"]), str(a["daPointer"]),
                                  meta.block, meta.time)
        self.batch_by_pointer.setdefault(str(a["daPointer"]), bid)
        self.batches_by_root.setdefault(root, []).append(bid)
        self.account(op).batches.append(bid)

    # ---- ChallengeManager ------------------------------------------------------------------
    def _on_ChallengeOpened(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        cid, digest, op = int(a["id"]), bytes(a["receiptDigest"]), str(a["operator"])
        self.challenges[cid] = Challenge(cid, digest, op, str(a["challenger"]),
                                         bytes(a["batchId"]), int(a["bond"]),
                                         int(a["targetBlock"]), meta.block, meta.time)
        self.challenges_by_receipt.setdefault(digest, []).append(cid)
        self.account(op).challenges.append(cid)
        self.account(str(a["challenger"])).opened.append(cid)

    def _on_DrawRearmed(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        c = self.challenges.get(int(a["id"]))
        if c is not None:
            c.rearmed += 1
            c.target_block = int(a["newTargetBlock"])

    def _on_CommitteeDrawn(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        c = self.challenges.get(int(a["id"]))
        if c is None:
            return
        c.status, c.drawn_at = Status.VOTING, meta.time
        c.commit_deadline, c.reveal_deadline = int(a["commitDeadline"]), int(a["revealDeadline"])
        for m, w in zip(a["members"], a["weights"], strict=False):
            c.votes[str(m)] = Vote(str(m), int(w))
            self.account(str(m)).committees.append(c.id)

    def _vote(self, a: Mapping[str, Any]) -> Vote | None:
        c = self.challenges.get(int(a["id"]))
        return None if c is None else c.votes.get(str(a.get("voter", a.get("member"))))

    def _on_VoteCommitted(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        v = self._vote(a)
        if v is not None:
            v.commitment, v.committed_at = bytes(a["commitment"]), meta.time

    def _on_VoteRevealed(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        v = self._vote(a)
        if v is not None:
            v.out_hash, v.revealed_at = bytes(a["outHash"]), meta.time

    def _on_MemberPenalized(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        v = self._vote(a)
        if v is not None:
            v.penalty += int(a["amount"])

    def _on_ChallengeResolved(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        c = self.challenges.get(int(a["id"]))
        if c is None:
            return
        c.status, c.majority_out_hash = Status(int(a["status"])), bytes(a["majorityOutHash"])
        c.slashed, c.resolved_at, c.resolved_block = int(a["slashed"]), meta.time, meta.block
        c.resolve_tx = meta.tx

    def _on_OperatorSlashed(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        fault = int(a["fault"])
        s = Slash(str(a["operator"]), bytes(a["receiptDigest"]),
                  FAULTS[fault] if 0 <= fault < len(FAULTS) else f"fault {fault}",
                  int(a["amount"]), int(a["disputeId"]), meta.block, meta.time)
        self.slashes.append(s)
        self.account(s.operator).slashes.append(s)

    def _on_ClaimOpened(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        cid, digest, op = int(a["id"]), bytes(a["receiptDigest"]), str(a["operator"])
        self.claims[cid] = Claim(cid, digest, op, str(a["claimant"]), int(a["publishBy"]),
                                 int(a["responseDeadline"]), meta.block, meta.time)
        self.claims_by_receipt.setdefault(digest, []).append(cid)
        self.account(op).claims.append(cid)

    def _on_ClaimAnswered(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        c = self.claims.get(int(a["id"]))
        if c is not None:
            c.status, c.answered_batch, c.settled_at = (ClaimStatus.ANSWERED,
                                                        bytes(a["batchId"]), meta.time)

    def _on_ClaimUpheld(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        c = self.claims.get(int(a["id"]))
        if c is not None:
            c.status, c.slashed, c.settled_at = ClaimStatus.SLASHED, int(a["slashed"]), meta.time

    def _on_Credited(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        # Credited names no dispute: it is tied to one by the transaction that resolved it
        self.credits_by_tx.setdefault(meta.tx, []).append((str(a["account"]), int(a["amount"])))

    def _on_CreditWithdrawn(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        pass  # money leaving the contract: nothing a page shows yet

    def _on_Burnt(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        self.burnt += int(a["amount"])

    # ---- AuditLog --------------------------------------------------------------------------
    def _on_AuditRecorded(self, a: Mapping[str, Any], meta: EventMeta) -> None:
        rec = AuditRecord(bytes(a["receiptDigest"]), str(a["auditor"]),
                          bytes(a["observedOutHash"]), bool(a["matches"]),
                          bytes(a["reportHash"]), meta.block, meta.time)
        self.audits_by_receipt.setdefault(rec.receipt_digest, []).append(len(self.audits))
        self.audits.append(rec)
        self.account(rec.auditor).audits += 1

    # ---- reading helpers -------------------------------------------------------------------
    def payouts(self, c: Challenge) -> list[tuple[str, int]]:
        return list(self.credits_by_tx.get(c.resolve_tx, [])) if c.resolve_tx else []

    def operators(self) -> list[Account]:
        return [a for a in self.accounts.values() if a.role is Role.OPERATOR]

    def verifiers(self) -> list[Account]:
        return [a for a in self.accounts.values() if a.role is Role.VERIFIER]

    def approved_models(self) -> list[Approval]:
        return [ap for ap in self.approvals.values() if ap.kind is Kind.MODEL]


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)
