"""The operator's claim responder against a real anvil (issue 31, finding 1): a stranger's
``claimUnpublished`` on a receipt the operator published and committed in time is answered
with the Merkle proof from the operator's own outbox (claim Answered, stake untouched, the
claimant's bond to the operator), also across a restart; a receipt that really was never
published stays unanswered and is slashed; a stuck RPC node cannot hold a step past its
whole-call deadline.

The receipts are real signed receipts going through the real outbox, publisher, local DA and
BatchRegistry sink, as `verinfer operator serve` runs them."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import (
    BatchRegistryContract,
    ChallengeManagerContract,
    Contracts,
    TxSender,
)
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.errors import ContractRevertError, RpcDeadlineError
from verinfer.chain.sink import ChainBatchSink
from verinfer.chain.structs import ETHER, ClaimStatus, Role, default_params
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Backoff, Publisher
from verinfer.operator.claims import ClaimResponder, state_path
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.sample import sample_signed_receipt


@dataclass
class Net:
    w3: Web3
    d: Deployment
    operator: LocalAccount
    stranger: LocalAccount

    def as_(self, who: LocalAccount) -> Contracts:
        return self.d.bind(self.w3, TxSender(self.w3, who))

    @property
    def domain(self) -> Domain:
        return Domain(self.d.chain_id, self.d.challenge_manager)

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with Anvil() as node:
        w3 = node.web3()
        accts = dev_accounts(3)
        d = deploy_all(w3, accts[0], default_params())
        n = Net(w3, d, accts[1], accts[2])
        n.as_(n.operator).stakes.register(Role.OPERATOR, 5 * ETHER)
        yield n


@dataclass
class Operator:
    """The operator's side as `serve` builds it: outbox, local DA, publisher, chain sink."""

    net: Net
    dir: Path
    outbox: Outbox
    publisher: Publisher
    first_block: int  # the responders of this test scan from here (earlier tests' claims
    # belong to other operator directories)

    def sign(self, tag: bytes, issued_at: int | None = None) -> SignedReceipt:
        payload = b"ciphertext of " + tag
        s = sample_signed_receipt(payload, issued_at=self.net.now() if issued_at is None
                                  else issued_at, key=self.net.operator.key,
                                  domain=self.net.domain)
        self.outbox.enqueue(s.digest, s.to_bytes(), payload)
        return s

    def responder(self, **kw: Any) -> ClaimResponder:
        w3, d = self.net.w3, self.net.d
        return ClaimResponder(
            w3, ChallengeManagerContract(w3, d.challenge_manager, TxSender(w3, self.net.operator)),
            BatchRegistryContract(w3, d.batch_registry), self.outbox,
            state_path(self.dir, d.challenge_manager), self.first_block, poll_s=0.1, **kw)


@pytest.fixture
def op(net: Net, tmp_path: Path) -> Iterator[Operator]:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    sink = ChainBatchSink(BatchRegistryContract(net.w3, net.d.batch_registry,
                                                TxSender(net.w3, net.operator)),
                          net.operator.address)
    publisher = Publisher(outbox, LocalDAClient(tmp_path / "da"), sink, put_workers=1)
    yield Operator(net, tmp_path, outbox, publisher, net.w3.eth.block_number + 1)
    publisher.close()
    outbox.close()


def _claim(net: Net, s: SignedReceipt) -> int:
    """The stranger claims ``s`` unpublished once its publication deadline is past."""
    p = default_params()
    wait = s.receipt.issued_at + p.publication_deadline + 1 - net.now()
    if wait > 0:
        increase_time(net.w3, wait)
    return net.as_(net.stranger).challenges.claim_unpublished(s.receipt, s.signature,
                                                              p.challenge_bond)


def _wait_status(net: Net, cid: int, status: ClaimStatus, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := net.d.bind(net.w3).challenges.claim(cid).status) is not status:
        assert time.monotonic() < deadline, f"claim {cid} still {got.name}"
        time.sleep(0.1)


def test_claim_on_a_published_receipt_is_answered(net: Net, op: Operator) -> None:
    signed = [op.sign(b"a"), op.sign(b"b"), op.sign(b"c")]
    assert op.publisher.drain(timeout_s=60)  # one batch of 3, committed on chain
    view = net.d.bind(net.w3)
    p = default_params()
    before = view.stakes.account_of(net.operator.address)
    op_credits = view.challenges.credits(net.operator.address)
    stranger_credits = view.challenges.credits(net.stranger.address)
    cid = _claim(net, signed[1])
    assert view.stakes.account_of(net.operator.address).locked == before.locked + p.slash_amount
    responder = op.responder().start()
    try:
        _wait_status(net, cid, ClaimStatus.ANSWERED)
    finally:
        responder.stop()
    after = view.stakes.account_of(net.operator.address)
    assert after.stake == before.stake and after.locked == before.locked
    assert view.challenges.credits(net.operator.address) == op_credits + p.challenge_bond
    assert view.challenges.credits(net.stranger.address) == stranger_credits
    # after the response period nothing is left to resolve: the stake cannot be taken
    increase_time(net.w3, p.response_period + 1)
    with pytest.raises(ContractRevertError) as e:
        net.as_(net.stranger).challenges.resolve_unpublished(cid)
    assert e.value.error_name == "ClaimNotOpen"
    counts = responder.counts()
    assert (counts.seen, counts.answered, counts.failed, counts.open) == (1, 1, 0, 0)
    state = json.loads(state_path(op.dir, net.d.challenge_manager).read_text())
    assert state["claims"][str(cid)]["state"] == "answered"
    assert state["claims"][str(cid)]["answered_by_us"] is True


def test_a_restarted_responder_answers_claims_opened_while_it_was_down(
        net: Net, op: Operator) -> None:
    early, late = op.sign(b"restart 1"), op.sign(b"restart 2")
    assert op.publisher.drain(timeout_s=60)
    first = op.responder()
    first.step()  # scanned to the head: no claim yet
    cursor = json.loads(first.state_file.read_text())["cursor"]
    assert cursor >= net.w3.eth.block_number - 1
    cid_seen = _claim(net, early)
    assert [c.claim_id for c in first.scan()] == [cid_seen]  # seen and persisted...
    del first  # ...then the process dies before answering
    cid_down = _claim(net, late)  # opened while nothing runs
    second = op.responder()  # a new process: state from the operator directory
    assert second.cursor > cursor and cid_seen in second.claims
    second.step()
    view = net.d.bind(net.w3).challenges
    assert view.claim(cid_seen).status is ClaimStatus.ANSWERED
    assert view.claim(cid_down).status is ClaimStatus.ANSWERED
    for cid in (cid_seen, cid_down):
        assert second.claims[cid].state == "answered" and second.claims[cid].answered_by_us


def test_a_claim_moved_by_a_reorg_is_answered_as_the_chain_has_it(net: Net,
                                                                   op: Operator) -> None:
    """A ClaimOpened the responder saw is undone by a reorg (anvil snapshot/revert) and claim
    id is given to a claim on another receipt, in a block under the cursor: the vanished claim
    is dropped, the new one found by the overlap re-scan and answered as the chain records it."""
    first, second = op.sign(b"reorg 1"), op.sign(b"reorg 2")
    assert op.publisher.drain(timeout_s=60)
    p = default_params()
    increase_time(net.w3, first.receipt.issued_at + p.publication_deadline + 1 - net.now())
    snap = net.w3.provider.make_request("evm_snapshot", [])["result"]  # type: ignore[arg-type]
    cid = _claim(net, first)
    r = op.responder()
    assert [c.claim_id for c in r.scan()] == [cid]
    assert net.w3.provider.make_request("evm_revert", [snap])["result"]  # type: ignore[arg-type]
    r.step()
    assert cid not in r.claims  # no such claim on chain any more: nothing to answer
    assert _claim(net, second) == cid  # the same id, another receipt, below the cursor
    r.step()
    assert net.d.bind(net.w3).challenges.claim(cid).status is ClaimStatus.ANSWERED
    assert r.claims[cid].receipt_digest == "0x" + second.digest.hex()


def test_a_receipt_never_published_is_not_answerable(net: Net, op: Operator) -> None:
    p = default_params()
    view = net.d.bind(net.w3)
    # signed and queued but never batched (the publisher never ran): not published
    s = op.sign(b"never published", issued_at=net.now() - p.publication_deadline - 10)
    stake_before = view.stakes.account_of(net.operator.address).stake
    cid = _claim(net, s)
    responder = op.responder(backoff=Backoff(base_s=0.0, jitter=0.0))  # retry at each step
    for _ in range(3):
        responder.step()
    assert view.challenges.claim(cid).status is ClaimStatus.OPEN
    c = responder.claims[cid]
    assert c.state == "open" and "in no batch" in (c.last_error or ""), c
    assert responder.counts().errors >= 1
    # publishing it now is too late: a batch committed after publishBy answers nothing
    assert op.publisher.drain(timeout_s=60)
    responder.step()
    assert view.challenges.claim(cid).status is ClaimStatus.OPEN
    assert responder.claims[cid].state == "failed"
    assert "after the deadline" in (responder.claims[cid].last_error or "")
    increase_time(net.w3, p.response_period + 1)
    net.as_(net.stranger).challenges.resolve_unpublished(cid)
    assert view.challenges.claim(cid).status is ClaimStatus.SLASHED
    assert view.stakes.account_of(net.operator.address).stake == stake_before - p.slash_amount
    assert responder.counts().failed == 1


def test_a_stuck_rpc_node_cannot_hold_a_step(net: Net, op: Operator) -> None:
    """A node that accepts the connection and never answers: each step gives up at the
    whole-call deadline (the HTTP timeout alone would wait 30 s per request)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{silent.getsockname()[1]}",
                                    request_kwargs={"timeout": 30}))
        d = net.d
        r = ClaimResponder(
            w3, ChallengeManagerContract(w3, d.challenge_manager, TxSender(w3, net.operator)),
            BatchRegistryContract(w3, d.batch_registry), op.outbox,
            state_path(op.dir, d.challenge_manager), d.deployed_block, rpc_deadline_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(RpcDeadlineError, match=r"within 0\.5 s"):
            r.step()
        assert time.monotonic() - t0 < 2.0
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        silent.close()


def test_two_senders_of_one_account_never_reuse_a_nonce(net: Net) -> None:
    """The batch sink and the claim responder send as the operator from two threads: each
    nonce read + send is one turn per account (before, both threads read the same pending
    nonce and one transaction was refused or replaced)."""
    errors: list[Exception] = []
    start = threading.Barrier(2)

    def commit(tag: bytes) -> None:
        reg = BatchRegistryContract(net.w3, net.d.batch_registry,
                                    TxSender(net.w3, net.operator))
        start.wait()
        for i in range(8):
            try:
                reg.commit_batch(hashlib.sha256(tag + bytes([i])).digest(), 1,
                                 "da://local/0x" + "cd" * 32)
            except Exception as e:  # collected: the assertion below names them
                errors.append(e)

    threads = [threading.Thread(target=commit, args=(t,)) for t in (b"sink", b"claims")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    view = net.d.bind(net.w3).batches
    assert all(view.batch_of(net.operator.address,
                             hashlib.sha256(tag + bytes([i])).digest()).exists
               for tag in (b"sink", b"claims") for i in range(8))
