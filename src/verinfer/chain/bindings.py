"""Thin typed bindings over web3.py for the verinfer contracts.

Transactions are signed locally by a `LocalAccount` and sent raw, so any JSON-RPC node works
(no unlocked node accounts). A revert is raised as `ContractRevertError` carrying the decoded
custom error (name and arguments).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from eth_abi import encode as abi_encode
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractFunction
from web3.exceptions import ContractCustomError, ContractLogicError, TimeExhausted
from web3.logs import DISCARD
from web3.types import TxReceipt

from verinfer.chain.artifacts import decode_revert, load_artifact
from verinfer.chain.errors import ChainError, ContractRevertError
from verinfer.chain.structs import (
    BatchInfo,
    ChallengeInfo,
    ClaimInfo,
    Kind,
    Member,
    Params,
    ReceiptState,
    Role,
    StakeAccount,
    Vote,
    VoteState,
)
from verinfer.protocol.hexutil import parse_hex
from verinfer.receipts.eip712 import Receipt


def _revert_data(exc: Exception) -> bytes:
    data = getattr(exc, "data", None)
    if isinstance(data, str) and data.startswith("0x"):
        return parse_hex(data, None, "revert data")
    if isinstance(data, bytes):
        return data
    return b""


def _raise_revert(exc: Exception, what: str) -> None:
    data = _revert_data(exc)
    name, args = decode_revert(data)
    raise ContractRevertError(f"{what} reverted: {name}{args!r}", error_name=name,
                              error_args=args, data=data) from exc


_NONCE_LOCKS: dict[str, threading.Lock] = {}
_NONCE_LOCKS_GUARD = threading.Lock()


def _nonce_lock(address: str) -> threading.Lock:
    """One lock per sending account in this process: two threads sending as the same account
    (the operator's batch sink and its claim responder) must not read the same pending nonce."""
    with _NONCE_LOCKS_GUARD:
        return _NONCE_LOCKS.setdefault(address.lower(), threading.Lock())


class TxSender:
    """Signs and sends transactions for one account; waits for them to be mined. Senders of
    the same account in one process take turns from the nonce read to the send (not while
    waiting to be mined), so concurrent threads never reuse a nonce."""

    def __init__(self, w3: Web3, account: LocalAccount, *, timeout: float = 60.0) -> None:
        self.w3 = w3
        self.account = account
        self.timeout = timeout
        self._nonce_lock = _nonce_lock(str(account.address))

    @property
    def address(self) -> str:
        return str(self.account.address)

    def send(self, fn: ContractFunction, *, value: int = 0, what: str = "") -> TxReceipt:
        what = what or fn.fn_name
        base: dict[str, Any] = {"from": self.address, "value": value}
        try:
            gas = fn.estimate_gas(base)  # type: ignore[arg-type]
        except (ContractCustomError, ContractLogicError) as e:
            _raise_revert(e, what)
        with self._nonce_lock:
            tx: dict[str, Any] = fn.build_transaction({  # type: ignore[arg-type,assignment]
                **base, "gas": gas + gas // 5 + 10_000, "chainId": self.w3.eth.chain_id,
                "nonce": self.w3.eth.get_transaction_count(self.account.address, "pending")})
            tx_hash = self._send_raw(tx)
        return self._wait(tx_hash, what)

    def deploy(self, name: str, *args: object) -> tuple[str, TxReceipt]:
        art = load_artifact(name)
        factory = self.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        with self._nonce_lock:
            tx: dict[str, Any] = factory.constructor(*args).build_transaction({
                "from": self.address, "chainId": self.w3.eth.chain_id,
                "nonce": self.w3.eth.get_transaction_count(self.account.address, "pending")})
            tx_hash = self._send_raw(tx)
        receipt = self._wait(tx_hash, f"deploy {name}")
        address = receipt["contractAddress"]
        if address is None:
            raise ChainError(f"deploy {name}: no contract address in receipt")
        return str(address), receipt

    def _send_raw(self, tx: dict[str, Any]) -> Any:
        signed = self.account.sign_transaction(tx)
        return self.w3.eth.send_raw_transaction(signed.raw_transaction)

    def _wait(self, tx_hash: Any, what: str) -> TxReceipt:
        try:
            receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=self.timeout)
        except TimeExhausted as e:
            raise ChainError(f"{what}: transaction {tx_hash.hex()} not mined in time") from e
        if receipt["status"] != 1:
            raise ChainError(f"{what}: transaction {tx_hash.hex()} failed on chain")
        return receipt


class _Bound:
    NAME = ""

    def __init__(self, w3: Web3, address: str, sender: TxSender | None = None) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.contract: Contract = w3.eth.contract(address=self.address,
                                                  abi=load_artifact(self.NAME).abi)
        self.sender = sender

    def _send(self, fn: ContractFunction, *, value: int = 0) -> TxReceipt:
        if self.sender is None:
            raise ChainError(f"{self.NAME}: read-only binding (no account) cannot send")
        return self.sender.send(fn, value=value, what=f"{self.NAME}.{fn.fn_name}")

    def _call(self, fn: ContractFunction) -> Any:
        try:
            return fn.call()
        except (ContractCustomError, ContractLogicError) as e:
            _raise_revert(e, f"{self.NAME}.{fn.fn_name}")

    def with_sender(self, sender: TxSender) -> Any:
        return type(self)(self.w3, self.address, sender)


class ProtocolConfigContract(_Bound):
    NAME = "ProtocolConfig"

    def params(self) -> Params:
        return Params.from_tuple(self._call(self.contract.functions.params()))

    def set_params(self, p: Params) -> TxReceipt:
        return self._send(self.contract.functions.setParams(p.as_tuple()))

    def approve(self, kind: Kind, item: bytes) -> TxReceipt:
        return self._send(self.contract.functions.approve(int(kind), item))

    def revoke(self, kind: Kind, item: bytes) -> TxReceipt:
        return self._send(self.contract.functions.revoke(int(kind), item))

    def is_approved(self, kind: Kind, item: bytes) -> bool:
        return bool(self._call(self.contract.functions.isApproved(int(kind), item)))

    def approval_history(self, kind: Kind, item: bytes) -> list[tuple[int, int]]:
        """Every approval interval ``(since, until)`` of an entry, oldest first (until 0: open;
        an ``until`` in the future is a revocation still in its notice)."""
        return [(int(s), int(u)) for s, u in
                self._call(self.contract.functions.approvalHistory(int(kind), item))]

    def min_draw_period(self, draw_delay_blocks: int) -> int:
        """The shortest drawPeriod setParams accepts with ``draw_delay_blocks`` (seconds; sized
        for 12 s blocks with margin, else DrawPeriodTooShort)."""
        return int(self._call(self.contract.functions.minDrawPeriod(draw_delay_blocks)))

    def governance_notice(self) -> int:
        """Seconds between a revocation / key retirement and its effect (immutable)."""
        return int(self._call(self.contract.functions.governanceNotice()))

    def register_key_epoch(self, epoch: int, public_key: bytes, commitments_hash: bytes,
                           threshold: int, shard_count: int) -> TxReceipt:
        return self._send(self.contract.functions.registerKeyEpoch(
            epoch, public_key, commitments_hash, threshold, shard_count))

    def retire_key_epoch(self, epoch: int) -> TxReceipt:
        return self._send(self.contract.functions.retireKeyEpoch(epoch))

    def is_key_epoch_live_at(self, epoch: int, at: int) -> bool:
        return bool(self._call(self.contract.functions.isKeyEpochLiveAt(epoch, at)))


class StakeRegistryContract(_Bound):
    NAME = "StakeRegistry"

    def register(self, role: Role, stake_wei: int) -> TxReceipt:
        return self._send(self.contract.functions.register(int(role)), value=stake_wei)

    def bond(self, amount_wei: int) -> TxReceipt:
        return self._send(self.contract.functions.bond(), value=amount_wei)

    def request_unbond(self, amount_wei: int) -> TxReceipt:
        return self._send(self.contract.functions.requestUnbond(amount_wei))

    def withdraw(self) -> TxReceipt:
        return self._send(self.contract.functions.withdraw())

    def set_challenge_manager(self, address: str) -> TxReceipt:
        return self._send(self.contract.functions.setChallengeManager(address))

    def account_of(self, who: str) -> StakeAccount:
        return StakeAccount.from_tuple(self._call(self.contract.functions.accountOf(who)))

    def sync_params(self) -> TxReceipt:
        """Copy the minimum stakes from ProtocolConfig (anyone may): a lower minimum applies at
        once, a raise is recorded as pending (MinimumRaisePending) and applied by a sync after
        its effective time."""
        return self._send(self.contract.functions.syncParams())

    def min_operator_stake(self) -> int:
        """The operator minimum in force (what commitBatch checks the active stake against)."""
        return int(self._call(self.contract.functions.minOperatorStake()))

    def pending_min_operator_stake(self) -> tuple[int, int]:
        """A raised operator minimum waiting for its notice: (amount, effective chain time);
        (0, 0) when none."""
        return (int(self._call(self.contract.functions.pendingMinOperatorStake())),
                int(self._call(self.contract.functions.pendingMinOperatorStakeAt())))

    def is_active_operator(self, who: str) -> bool:
        return bool(self._call(self.contract.functions.isActiveOperator(who)))

    def is_verifier(self, who: str) -> bool:
        return bool(self._call(self.contract.functions.isVerifier(who)))

    def total_stake(self) -> int:
        return int(self._call(self.contract.functions.totalStake()))

    def weight_of(self, who: str) -> int:
        """`who`'s committee-draw weight now (active stake if >= the verifier minimum, else 0)."""
        return int(self._call(self.contract.functions.weightOf(who)))

    def total_weight_at(self, block: int) -> int:
        """Sum of draw weights as of the end of `block`."""
        return int(self._call(self.contract.functions.totalWeightAt(block)))

    def verifier_count(self) -> int:
        """Verifiers holding a draw slot (weight > 0) now."""
        return int(self._call(self.contract.functions.verifierCount()))

    # ---- fingerprint declarations (committees are drawn from the receipt's fingerprint pool)

    def declare_fingerprint(self, fingerprint_hash: bytes, model_id: bytes) -> TxReceipt:
        """Declare that this verifier re-executes receipts of model `model_id` under
        `fingerprint_hash` (both approved): it joins the pool `pool_key(fingerprint_hash,
        model_id)`, is drawn for those receipts and penalised like any abstainer if it does not
        reveal."""
        return self._send(self.contract.functions.declareFingerprint(fingerprint_hash, model_id))

    def undeclare_fingerprint(self, fingerprint_hash: bytes, model_id: bytes) -> TxReceipt:
        """Stop covering (`fingerprint_hash`, `model_id`) now; stay drawable for it until
        `leaveAt` (now + maxDisputeSpan), then `complete_undeclare`."""
        return self._send(self.contract.functions.undeclareFingerprint(fingerprint_hash, model_id))

    def complete_undeclare(self, account: str, fingerprint_hash: bytes,
                           model_id: bytes) -> TxReceipt:
        return self._send(self.contract.functions.completeUndeclare(account, fingerprint_hash,
                                                                     model_id))

    def declarations_of(self, who: str) -> dict[bytes, int]:
        """`who`'s declared pool keys (structs.pool_key(fingerprint, model)) -> leaveAt
        (0 = staying)."""
        fps, leave = self._call(self.contract.functions.declarationsOf(who))
        return {bytes(f): int(t) for f, t in zip(fps, leave, strict=True)}

    def coverage_at(self, pool: bytes, at: int) -> int:
        """Verifiers declared for pool `pool` (a pool key: structs.pool_key), with
        weight, not leaving, at time `at`."""
        return int(self._call(self.contract.functions.coverageAt(pool, at)))

    def coverage_weight_at(self, pool: bytes, at: int) -> int:
        """Summed draw weight of the verifiers counted by `coverage_at` at time `at`."""
        return int(self._call(self.contract.functions.coverageWeightAt(pool, at)))

    def verifier_weight_at_time(self, at: int) -> int:
        """Summed draw weight of all verifiers at time `at` (the coverage rule's denominator)."""
        return int(self._call(self.contract.functions.verifierWeightAtTime(at)))

    def min_coverage_bps(self) -> int:
        """Share of all verifier weight (basis points) a fingerprint's declared weight must
        reach for its receipts to be valid; immutable."""
        return int(self._call(self.contract.functions.minCoverageBps()))

    def is_covered_at(self, pool: bytes, issued_at: int) -> bool:
        """`pool` is a pool key (structs.pool_key(the receipt's engine fingerprint,
        its model)). A receipt of that pool issued at `issued_at` can be judged (else it is
        invalid on its face and slashed at open): the declared weight `coverage_notice()` before
        it was > 0 and at least `min_coverage_bps()` of all verifier weight then, so what an
        operator checks before signing is already final."""
        return bool(self._call(self.contract.functions.isCoveredAt(pool, issued_at)))

    def coverage_notice(self) -> int:
        return int(self._call(self.contract.functions.coverageNotice()))

    def pool_weight_at(self, pool: bytes, block: int) -> int:
        """Sum of draw weights in `pool`'s pool as of the end of `block`."""
        return int(self._call(self.contract.functions.poolWeightAt(pool, block)))


class BatchRegistryContract(_Bound):
    NAME = "BatchRegistry"

    @staticmethod
    def batch_id(operator: str, root: bytes) -> bytes:
        return keccak(abi_encode(["address", "bytes32"], [operator, root]))

    def commit_batch(self, root: bytes, leaf_count: int, da_pointer: str) -> TxReceipt:
        return self._send(self.contract.functions.commitBatch(root, leaf_count, da_pointer))

    def batch_of(self, operator: str, root: bytes) -> BatchInfo:
        t = self._call(self.contract.functions.batchOf(operator, root))
        return BatchInfo(int(t[0]), int(t[1]), int(t[2]))

    def batch(self, batch_id: bytes) -> BatchInfo:
        """The stored record of the batch with id ``batch_id`` (committed_at 0 = unknown)."""
        t = self._call(self.contract.functions.batch(batch_id))
        return BatchInfo(int(t[0]), int(t[1]), int(t[2]))


def receipt_tuple(r: Receipt) -> tuple[object, ...]:
    """The Solidity `ReceiptLib.Receipt` tuple, field order of the shared EIP-712 type."""
    return (r.version, r.operator, r.chain_id, r.model_id, r.engine_fingerprint_hash,
            r.req_hash, r.out_hash, r.key_epoch, r.ciphertext_hash, r.issued_at)


def vote_commitment(challenge_id: int, voter: str, out_hash: bytes, salt: bytes) -> bytes:
    """keccak256(abi.encode(id, voter, outHash, salt)), as ChallengeManager.voteCommitment."""
    return keccak(abi_encode(["uint256", "address", "bytes32", "bytes32"],
                             [challenge_id, voter, out_hash, salt]))


class ChallengeManagerContract(_Bound):
    NAME = "ChallengeManager"

    def domain_separator(self) -> bytes:
        return bytes(self._call(self.contract.functions.domainSeparator()))

    def receipt_digest(self, r: Receipt) -> bytes:
        return bytes(self._call(self.contract.functions.receiptDigest(receipt_tuple(r))))

    def open_challenge(self, r: Receipt, signature: bytes, batch_root: bytes, leaf_index: int,
                       siblings: tuple[bytes, ...] | list[bytes], bond_wei: int) -> int:
        receipt = self._send(self.contract.functions.openChallenge(
            receipt_tuple(r), signature, batch_root, leaf_index, list(siblings)), value=bond_wei)
        ev = self.contract.events.ChallengeOpened().process_receipt(receipt, errors=DISCARD)
        return int(ev[0]["args"]["id"])

    def draw_committee(self, challenge_id: int) -> TxReceipt:
        return self._send(self.contract.functions.drawCommittee(challenge_id))

    def commit_vote(self, challenge_id: int, commitment: bytes) -> TxReceipt:
        return self._send(self.contract.functions.commitVote(challenge_id, commitment))

    def reveal_vote(self, challenge_id: int, out_hash: bytes, salt: bytes) -> TxReceipt:
        return self._send(self.contract.functions.revealVote(challenge_id, out_hash, salt))

    def resolve(self, challenge_id: int) -> TxReceipt:
        return self._send(self.contract.functions.resolve(challenge_id))

    def claim_unpublished(self, r: Receipt, signature: bytes, bond_wei: int) -> int:
        receipt = self._send(self.contract.functions.claimUnpublished(receipt_tuple(r), signature),
                             value=bond_wei)
        ev = self.contract.events.ClaimOpened().process_receipt(receipt, errors=DISCARD)
        return int(ev[0]["args"]["id"])

    def answer_unpublished(self, claim_id: int, batch_root: bytes, leaf_index: int,
                           siblings: tuple[bytes, ...] | list[bytes]) -> TxReceipt:
        return self._send(self.contract.functions.answerUnpublished(
            claim_id, batch_root, leaf_index, list(siblings)))

    def resolve_unpublished(self, claim_id: int) -> TxReceipt:
        return self._send(self.contract.functions.resolveUnpublished(claim_id))

    def withdraw_credits(self) -> TxReceipt:
        return self._send(self.contract.functions.withdrawCredits())

    def challenge(self, challenge_id: int) -> ChallengeInfo:
        return ChallengeInfo.from_tuple(self._call(self.contract.functions.challenge(challenge_id)))

    def committee(self, challenge_id: int) -> list[Member]:
        return [Member(str(m[0]), int(m[1]))
                for m in self._call(self.contract.functions.committee(challenge_id))]

    def vote(self, challenge_id: int, voter: str) -> Vote:
        t = self._call(self.contract.functions.vote(challenge_id, voter))
        return Vote(bytes(t[0]), VoteState(t[1]))

    def claim(self, claim_id: int) -> ClaimInfo:
        return ClaimInfo.from_tuple(self._call(self.contract.functions.claim(claim_id)))

    def credits(self, who: str) -> int:
        return int(self._call(self.contract.functions.credits(who)))

    def total_burnt(self) -> int:
        return int(self._call(self.contract.functions.totalBurnt()))

    def receipt_slashed(self, digest: bytes) -> bool:
        """True iff stake was taken for the receipt's content (re-execution or invalid receipt)."""
        return bool(self._call(self.contract.functions.receiptState(digest))[2])

    def receipt_state(self, digest: bytes) -> ReceiptState:
        return ReceiptState.from_tuple(self._call(self.contract.functions.receiptState(digest)))


class AuditLogContract(_Bound):
    NAME = "AuditLog"

    def record_audit(self, receipt_digest: bytes, observed_out_hash: bytes, matches: bool,
                     report_hash: bytes) -> TxReceipt:
        return self._send(self.contract.functions.recordAudit(
            receipt_digest, observed_out_hash, matches, report_hash))


@dataclass
class Contracts:
    """All bound contracts of one deployment, for one (optional) sending account."""

    config: ProtocolConfigContract
    stakes: StakeRegistryContract
    batches: BatchRegistryContract
    challenges: ChallengeManagerContract
    audits: AuditLogContract
