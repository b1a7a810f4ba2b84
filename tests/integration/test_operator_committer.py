"""The batch committer of serving replicas (issue 37) against real Redis (127.0.0.1:6379, a
key prefix of its own per test) and a real anvil: two replicas publish signed receipts to the
operator's receipt stream, two `verinfer operator commit` processes share it through the lease,
and the active one is SIGKILLed mid-run. Every receipt published ends in exactly one batch
committed on chain, none twice, and every batch's manifest (read back from DA) has the root
the chain holds. The in-process tests pin the windows a crash can hit: after the send (the
next holder reads the chain and sends nothing), and a committer whose lease lapsed (it can
neither decide nor send; the next holder commits its receipts once)."""

from __future__ import annotations

import collections
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import BatchRegistryContract, ChallengeManagerContract, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.events import batches_committed
from verinfer.chain.sink import ChainBatchSink
from verinfer.chain.structs import ETHER, ClaimStatus, Role, default_params
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.sinks import BatchCommitment
from verinfer.operator.claims import ClaimResponder, state_path
from verinfer.operator.committer import (
    BatchCommitter,
    CommitterStep,
    Lease,
    LeaseLostError,
    StreamBatchIndex,
)
from verinfer.operator.config import create_keystore, write_config
from verinfer.operator.receipts_api import ReceiptNotFoundError, stream_receipt_status
from verinfer.operator.stream import BoundedRedis, ReceiptStream, ReceiptStreamError, StreamKeys
from verinfer.ports import free_port
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Domain
from verinfer.receipts.signed import SignedReceipt
from verinfer.testing.sample import sample_signed_receipt

pytestmark = [pytest.mark.anvil, pytest.mark.redis, pytest.mark.process]

SHARED = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Net:
    node: Anvil
    w3: Web3
    d: Deployment
    operator: LocalAccount
    stranger: LocalAccount

    @property
    def domain(self) -> Domain:
        return Domain(self.d.chain_id, self.d.challenge_manager)

    def registry(self, send: bool = False) -> BatchRegistryContract:
        return BatchRegistryContract(self.w3, self.d.batch_registry,
                                     TxSender(self.w3, self.operator) if send else None)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with Anvil() as node:
        w3 = node.web3()
        accts = dev_accounts(3)
        d = deploy_all(w3, accts[0], default_params())
        n = Net(node, w3, d, accts[1], accts[2])
        d.bind(w3, TxSender(w3, n.operator)).stakes.register(Role.OPERATOR, 5 * ETHER)
        yield n


@pytest.fixture
def keys(net: Net) -> Iterator[StreamKeys]:
    k = StreamKeys(f"verinfer:test:{uuid.uuid4().hex}:", str(net.operator.address))
    yield k
    r = redis.Redis.from_url(SHARED)
    found = list(r.scan_iter(match=k.prefix + "*"))
    if found:
        r.delete(*found)
    r.close()


class Replica:
    """A serving replica's side of the stream: signs receipts with the operator key (shared
    by the replicas until the on-chain signer set exists) and publishes them, a response's
    choices (1-3) in one call."""

    def __init__(self, net: Net, keys: StreamKeys, name: str, url: str = SHARED) -> None:
        self.net, self.name = net, name
        self.stream = ReceiptStream(BoundedRedis(url, deadline_s=2.0), keys, replica=name)
        self.published: list[bytes] = []
        self.signed: list[SignedReceipt] = []
        self.payloads: list[bytes] = []

    def publish(self, n: int) -> None:
        now = int(self.net.w3.eth.get_block("latest")["timestamp"])
        items, digests = [], []
        for _ in range(n):
            payload = f"{self.name} ciphertext {uuid.uuid4().hex}".encode()
            s = sample_signed_receipt(payload, issued_at=now, key=self.net.operator.key,
                                      domain=self.net.domain)
            items.append((s.to_bytes(), payload))
            digests.append(s.digest)
            self.signed.append(s)
            self.payloads.append(payload)
        self.stream.publish(items)
        self.published += digests


def _committed_digests(net: Net, da_dir: Path, from_block: int) -> tuple[collections.Counter[
        bytes], int]:
    """Every receipt digest in a batch this operator committed since ``from_block``, counted,
    after checking each batch's manifest against the chain: its root is the root committed,
    its leaf count the one committed, every signature the operator's."""
    da = LocalDAClient(da_dir)
    seen: collections.Counter[bytes] = collections.Counter()
    reg = net.registry()
    if from_block > net.w3.eth.block_number:  # nothing mined since (anvil refuses the range)
        return seen, 0
    batches = [b for b in batches_committed(reg, from_block)
               if b.operator.lower() == net.operator.address.lower()]
    for b in batches:
        m = parse_manifest(da.get(Pointer.parse(b.da_pointer)), net.domain)
        assert m.root == b.root and m.leaf_count == b.leaf_count
        m.verify_signatures(net.domain)
        assert reg.batch_of(net.operator.address, b.root).exists
        seen.update(m.digests)
    return seen, len(batches)


def _wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _operator_dir(tmp: Path, net: Net, keys: StreamKeys, redis_url: str = SHARED) -> Path:
    d = tmp / "op"
    d.mkdir()
    create_keystore(d / "operator.keystore.json", net.operator.key, "pw", light=True)
    (d / "pw").write_text("pw\n")
    net.d.save(d / "deployment.json")
    write_config(d, {
        "keystore": "operator.keystore.json", "password_file": "pw",
        "chain_id": net.d.chain_id, "challenge_manager": net.d.challenge_manager,
        "epochs_file": "unused-by-the-committer.json", "key_epoch": 1,
        "outbox": "outbox.sqlite", "da": {"backend": "local", "local_store": "da"},
        "batch": {"max_entries": 16, "max_age_s": 0.2},
        "sink": {"kind": "chain", "rpc_url": net.node.url,
                 "deployment": str(d / "deployment.json")},
        "stream": {"redis_url": redis_url, "prefix": keys.prefix, "lease_ttl_s": 2.0,
                   "call_deadline_s": 0.5}})
    return d


def _committer(op: Path, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "verinfer", "operator", "commit",
                                 str(op), "--name", name], stdout=out, stderr=out, env=env)


def _holder(r: redis.Redis, keys: StreamKeys) -> str | None:
    v = r.get(keys.lease)
    return None if v is None else v.decode().split("|", 1)[1]


def test_two_replicas_two_committers_active_one_sigkilled(net: Net, keys: StreamKeys,
                                                          tmp_path: Path) -> None:
    op = _operator_dir(tmp_path, net, keys)
    r = redis.Redis.from_url(SHARED)
    first_block = net.w3.eth.block_number + 1
    a = _committer(op, "A", tmp_path / "A.log")
    b: subprocess.Popen[bytes] | None = None
    try:
        _wait(lambda: _holder(r, keys) == "A", 60, "committer A never took the lease")
        b = _committer(op, "B", tmp_path / "B.log")  # the standby
        replicas = [Replica(net, keys, "r1"), Replica(net, keys, "r2")]
        stop = threading.Event()

        def feed(rep: Replica, seed: int) -> None:
            i = 0
            while not stop.is_set() and len(rep.published) < 150:
                rep.publish(1 + (i + seed) % 3)
                i += 1
                time.sleep(0.02)

        feeders = [threading.Thread(target=feed, args=(rep, i)) for i, rep in
                   enumerate(replicas)]
        for t in feeders:
            t.start()
        # SIGKILL the active committer once it has committed a few batches, mid-stream
        _wait(lambda: r.xlen(keys.committed) >= 3, 90, "A committed no batches")
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        _wait(lambda: _holder(r, keys) == "B", 30, "the standby never took over")
        for t in feeders:
            t.join(timeout=120)
        published = [d for rep in replicas for d in rep.published]
        assert len(published) >= 300
        _wait(lambda: r.xlen(keys.stream) == 0 and r.scard(keys.open_batches) == 0, 120,
              "the standby did not commit everything published")
        seen, n_batches = _committed_digests(net, op / "da", first_block)
        assert set(seen) == set(published), (len(set(published) - set(seen)), "missing")
        twice = {d.hex(): n for d, n in seen.items() if n > 1}
        assert not twice, twice
        assert n_batches == r.xlen(keys.committed)  # the Redis record matches the chain
        assert b.poll() is None  # the standby is still serving as the active committer
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        r.close()
    # B took the lease with a new fencing token (A's pending entries, if A died holding any,
    # were claimed then: "took over N receipt(s)" in B's log)
    assert re.search(r"committer lease taken by B \(fencing token [2-9]\d*\)",
                     (tmp_path / "B.log").read_text())


def _inproc(net: Net, keys: StreamKeys, da_dir: Path, name: str, *, sink: object = None,
            max_age_s: float = 0.0, claims_dir: Path | None = None) -> BatchCommitter:
    rds = BoundedRedis(SHARED, deadline_s=0.5)
    real = ChainBatchSink(net.registry(send=True), net.operator.address)
    da = LocalDAClient(da_dir)
    claims = None if claims_dir is None else ClaimResponder(
        net.w3, ChallengeManagerContract(net.w3, net.d.challenge_manager,
                                         TxSender(net.w3, net.operator)),
        net.registry(), StreamBatchIndex(rds, keys, da),  # type: ignore[arg-type]
        state_path(claims_dir, net.d.challenge_manager), net.w3.eth.block_number + 1,
        poll_s=0.1)
    return BatchCommitter(rds, keys, da, sink or real,  # type: ignore[arg-type]
                          Lease(rds, keys, name, ttl_s=1.6), domain=net.domain, consumer=name,
                          batch_max_entries=8, batch_max_age_s=max_age_s, claims=claims,
                          claims_every_s=0.1)


class _Crash(Exception):
    """The committer process dies here."""


class CrashAfterSend:
    """The real chain sink; the process dies right after the transaction was mined, before
    the batch is finished in Redis."""

    def __init__(self, inner: ChainBatchSink) -> None:
        self.inner = inner

    def commit(self, batch: BatchCommitment) -> None:
        self.inner.commit(batch)
        raise _Crash


def _until_leader(c: BatchCommitter, timeout_s: float = 10.0) -> CommitterStep:
    deadline = time.monotonic() + timeout_s
    while True:
        rep = c.step(flush=True)
        if rep.leader:
            return rep
        assert time.monotonic() < deadline, f"{c.consumer} never took the lease"
        time.sleep(0.1)


def test_restart_after_send_reads_the_chain_and_sends_nothing(net: Net, keys: StreamKeys,
                                                              tmp_path: Path) -> None:
    first_block = net.w3.eth.block_number + 1
    rep = Replica(net, keys, "r1")
    for _ in range(4):
        rep.publish(3)
    a = _inproc(net, keys, tmp_path / "da", "A", sink=CrashAfterSend(
        ChainBatchSink(net.registry(send=True), net.operator.address)))
    with pytest.raises(_Crash):
        a.step(flush=True)  # the first batch of 8 is on chain; A dies before finishing it
    seen, n = _committed_digests(net, tmp_path / "da", first_block)
    assert n == 1 and sum(seen.values()) == 8
    b = _inproc(net, keys, tmp_path / "da", "B")
    _until_leader(b)  # after A's lease lapsed: finishes A's batch, commits the rest
    while b.step(flush=True).progressed:
        pass
    seen, n = _committed_digests(net, tmp_path / "da", first_block)
    assert n == 2, n  # A's batch once (B read the chain and sent nothing), then the last 4
    assert set(seen) == set(rep.published) and max(seen.values()) == 1
    r = redis.Redis.from_url(SHARED)
    assert r.xlen(keys.stream) == 0 and r.scard(keys.open_batches) == 0
    assert r.xlen(keys.committed) == 2
    r.close()


def test_a_committer_that_lost_its_lease_neither_decides_nor_sends(
        net: Net, keys: StreamKeys, tmp_path: Path) -> None:
    first_block = net.w3.eth.block_number + 1
    rep = Replica(net, keys, "r2")
    for _ in range(3):
        rep.publish(2)
    a = _inproc(net, keys, tmp_path / "da", "A", max_age_s=3600.0)
    assert a.step().leader  # A holds the lease and has read the 6 entries; nothing is due
    assert len(a._buffer) == 6  # (a batch is 8 entries or an hour old)
    time.sleep(1.8)  # A stalls (a long GC pause, a partition) past its lease's TTL
    b = _inproc(net, keys, tmp_path / "da", "B")
    assert b.lease.ensure()  # the standby takes the lease before A wakes up
    with pytest.raises(LeaseLostError):
        a._commit_one(CommitterStep())  # A's decision is fenced off: its token is stale
    r = redis.Redis.from_url(SHARED)
    assert r.scard(keys.open_batches) == 0  # nothing decided: no receipt assigned by A
    assert not any(r.exists(keys.receipt(d)) for d in rep.published)
    r.close()
    seen, n = _committed_digests(net, tmp_path / "da", first_block)
    assert n == 0  # nothing sent
    assert not a.step(flush=True).leader  # and A stays out
    while b.step(flush=True).progressed:  # B claims A's pending entries and commits them
        pass
    seen, n = _committed_digests(net, tmp_path / "da", first_block)
    assert set(seen) == set(rep.published) and max(seen.values()) == 1


def test_the_committer_answers_an_unpublished_claim_on_any_replicas_receipt(
        net: Net, keys: StreamKeys, tmp_path: Path) -> None:
    """A stranger claims a committed receipt of each replica unpublished: the lease holder's
    claim responder finds its batch in the committer's records and answers both in time (the
    operator's stake is untouched); a replica's own outbox knows nothing of them."""
    r1, r2 = Replica(net, keys, "r1"), Replica(net, keys, "r2")
    r1.publish(2)
    r2.publish(3)
    c = _inproc(net, keys, tmp_path / "da", "A", claims_dir=tmp_path)
    while c.step(flush=True).progressed:
        pass
    view = net.d.bind(net.w3)
    before = view.stakes.account_of(net.operator.address)
    p = default_params()
    latest = max(s.receipt.issued_at for s in r1.signed + r2.signed)
    increase_time(net.w3, latest + p.publication_deadline + 1 - int(
        net.w3.eth.get_block("latest")["timestamp"]))
    stranger = net.d.bind(net.w3, TxSender(net.w3, net.stranger)).challenges
    cids = [stranger.claim_unpublished(s.receipt, s.signature, p.challenge_bond)
            for s in (r1.signed[1], r2.signed[0])]
    stop = threading.Event()
    t = threading.Thread(target=c.run, args=(stop,))
    t.start()
    try:
        for cid in cids:
            _wait(lambda cid=cid: view.challenges.claim(cid).status is ClaimStatus.ANSWERED,
                  30, f"claim {cid} never answered")
    finally:
        stop.set()
        t.join(timeout=30)
    after = view.stakes.account_of(net.operator.address)
    assert after.stake == before.stake and after.locked == before.locked


def test_the_committer_rides_out_a_redis_crash(net: Net, keys: StreamKeys,
                                               tmp_path: Path) -> None:
    """Redis (its own server here, appendonly with appendfsync always, as docs/deploy.md asks)
    is SIGKILLed while a replica publishes and the committer commits: publishes fail (those
    receipts were never handed out), the committer backs off, and once Redis is back every
    receipt it had taken is committed, once."""
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "yes", "--appendfsync", "always", "--dir", str(tmp_path)]

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: _pings(port), 10, "redis-server did not start")
        return p

    url = f"redis://127.0.0.1:{port}/0"
    srv = start()
    op = _operator_dir(tmp_path, net, keys, url)
    first_block = net.w3.eth.block_number + 1
    committer = _committer(op, "A", tmp_path / "A.log")
    rep = Replica(net, keys, "r1", url)
    try:
        r = redis.Redis(port=port)
        _wait(lambda: _pings(port) and _holder(r, keys) == "A", 60, "no lease taken")
        for _ in range(20):
            rep.publish(2)
        srv.send_signal(signal.SIGKILL)
        srv.wait(timeout=10)
        with pytest.raises(ReceiptStreamError):
            rep.publish(1)  # a replica now refuses to sign (503)
        time.sleep(2.5)  # the committer's calls fail meanwhile; it keeps retrying
        srv = start()
        for _ in range(10):
            rep.publish(2)
        r = redis.Redis(port=port)
        _wait(lambda: r.xlen(keys.stream) == 0 and r.scard(keys.open_batches) == 0, 90,
              "the committer did not resume after Redis came back")
        seen, _ = _committed_digests(net, op / "da", first_block)
        assert set(seen) == set(rep.published) and max(seen.values()) == 1
        assert committer.poll() is None
    finally:
        if committer.poll() is None:
            committer.terminate()
            committer.wait(timeout=30)
        srv.terminate()
        srv.wait(timeout=10)
    assert "committer step failed" in (tmp_path / "A.log").read_text()


def _pings(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def test_a_receipt_published_twice_is_committed_once(net: Net, keys: StreamKeys,
                                                     tmp_path: Path) -> None:
    """A replica whose publish timed out after Redis took it retries (or two replicas carry the
    same receipt): the second entry is acknowledged as a duplicate, in the same batch or after
    the first one's batch is committed, never a second leaf."""
    first_block = net.w3.eth.block_number + 1
    rep = Replica(net, keys, "r1")
    rep.publish(3)
    again = [(s.to_bytes(), p) for s, p in zip(rep.signed, rep.payloads, strict=True)]
    rep.stream.publish(again[:1])  # the same batch's head holds it twice
    c = _inproc(net, keys, tmp_path / "da", "A")
    while c.step(flush=True).progressed:
        pass
    rep.stream.publish(again)  # all three again, after their batch is on chain
    reps = []
    while (step := c.step(flush=True)).progressed:
        reps.append(step)
    assert sum(s.duplicates for s in reps) == 3 and sum(s.batches_committed for s in reps) == 0
    seen, n = _committed_digests(net, tmp_path / "da", first_block)
    assert n == 1 and set(seen) == set(rep.published) and max(seen.values()) == 1
    r = redis.Redis.from_url(SHARED)
    assert r.xlen(keys.stream) == 0
    r.close()


def test_receipt_status_on_any_replica_keeps_to_the_paying_key(net: Net, keys: StreamKeys,
                                                              tmp_path: Path) -> None:
    """GET /v1/receipts in stream mode (``stream_receipt_status``): a replica that never saw
    the receipt answers it from the committer's records once batched — to the API key that
    paid for it only; any other key gets the same 404 as an unknown id."""
    rep = Replica(net, keys, "r1")
    payer, other = hashlib.sha256(b"key-1").digest(), hashlib.sha256(b"key-2").digest()
    s = sample_signed_receipt(b"paid for", issued_at=int(time.time()), key=net.operator.key,
                              domain=net.domain)
    rep.stream.publish([(s.to_bytes(), b"paid for")], owner=(payer, [s.digest]))
    c = _inproc(net, keys, tmp_path / "da", "A")
    while c.step(flush=True).progressed:
        pass
    index = StreamBatchIndex(c.redis, keys, LocalDAClient(tmp_path / "da"))
    with Outbox(tmp_path / "replica2-outbox.sqlite") as empty:  # another replica's: no copy
        got = stream_receipt_status(index, empty, net.domain, to_hex(s.digest), owner=payer)
        assert got["state"] == "committed" and got["batch"]["state"] == "committed"
        assert got["signature"] == to_hex(s.signature)
        assert got["da_pointer"] == str(Pointer.for_blob("local", b"paid for"))
        for who in (other, None):
            if who is None:  # an open API: anyone may read it
                assert stream_receipt_status(index, empty, net.domain, to_hex(s.digest))
                continue
            with pytest.raises(ReceiptNotFoundError):
                stream_receipt_status(index, empty, net.domain, to_hex(s.digest), owner=who)
        with pytest.raises(ReceiptNotFoundError):  # never published: unknown everywhere
            stream_receipt_status(index, empty, net.domain, "0x" + "11" * 32)
