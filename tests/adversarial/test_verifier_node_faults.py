"""Forced abstention, committee side (issue 14 item 3, issue 24 item 1, issue 13 item 6), on the
real contracts (anvil), the real Redis DA backend and real VerifierNodes with the in-process
enclave judge: every fault the operator controls ends in an INVALID_EVIDENCE vote and a slash;
this verifier's own DA/KMS outage is retried with backoff and never voted.

No KMS shard runs here on purpose: the operator faults below are decided before any key is
released (so a KMS outage cannot turn them into abstentions), and the last test shows that an
unreachable KMS quorum — like an unreachable DA — is a local fault: retried, not voted."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, increase_time
from verinfer.chain.bindings import Contracts
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import ETHER, INVALID_EVIDENCE, Status, VoteState
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.redis_backend import RedisDAClient
from verinfer.devnet.network import (
    CODE_HASH,
    CONTAINER_DIGEST,
    Roles,
    bind,
    deploy_network,
    devnet_params,
    epoch_public_key,
    provision_kms,
    publish_batch,
    register_epoch,
    roles,
)
from verinfer.engine.engine import Engine
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.merkle import build_tree
from verinfer.testing.chain_clock import MiningNode
from verinfer.testing.evidence import Evidence, EvidenceFactory, chat_body
from verinfer.verifier.audit_cli import report_problem
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.enclave_judge import EnclaveConfig, EnclaveJudge
from verinfer.verifier.node import NodeConfig, VerifierNode
from verinfer.verifier.reports import AuditReport, SignedAuditReport
from verinfer.verifier.votes import Verdict

BOMB = b"[" * 95_000 + b"]" * 95_000  # 190 KB: a SIGSEGV in the stdlib decoder at limit 100000
PARAMS = devnet_params(committee_size=3)


@dataclass
class Net:
    w3: Web3
    d: Deployment
    r: Roles
    da: RedisDAClient
    factory: EvidenceFactory
    cfg: EnclaveConfig
    engine: Engine
    tmp: Path
    nodes: list[VerifierNode]

    def node(self, i: int, da: RedisDAClient | None = None, tag: str = "") -> VerifierNode:
        """A fresh node for verifier i (a restart: new ChainView, no caches)."""
        acct = self.r.verifiers[i]
        src = da or self.da
        c = bind(self.w3, self.d, acct)
        return MiningNode(ChainView(self.w3, self.d, c), c, acct,
                          EnclaveJudge(self.cfg, acct, src, self.engine).judge, src,
                          NodeConfig(self.tmp / f"v{i}{tag}.json",
                                     retry_initial_s=0.2, retry_max_s=2.0))

    @property
    def view(self) -> Contracts:
        return bind(self.w3, self.d)


@pytest.fixture(scope="module")
def net(tiny_engine: Engine, tiny_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("node-faults")
    with Anvil() as node:
        w3 = node.web3()
        r = roles(3)
        d = deploy_network(w3, r, tiny_engine, PARAMS)
        lay = provision_kms(tmp / "kms", tiny_engine)
        rec = register_epoch(w3, d, r, lay)
        da = RedisDAClient(prefix=f"vi-test-nodefaults-{uuid.uuid4().hex}:", retention_s=600)
        view = ChainView(w3, d, bind(w3, d))
        factory = EvidenceFactory(tiny_engine, ReceiptSigner(r.operator.key),
                                  Domain(d.chain_id, d.challenge_manager), key_epoch=1,
                                  epoch_public_key=epoch_public_key(rec),
                                  now=lambda: view.head()[1])
        cfg = EnclaveConfig(lay.root_key, lay.directory, lay.registry, CONTAINER_DIGEST,
                            CODE_HASH, tiny_path, http_timeout_s=1.0)
        net = Net(w3, d, r, da, factory, cfg, tiny_engine, tmp, [])
        net.nodes = [net.node(i) for i in range(3)]
        for n in net.nodes:
            assert n.ensure_registered(ETHER)
            assert n.ensure_declared([(tiny_engine.fingerprint.hash,
                                       tiny_engine.model_id)]).declared
        yield net


@pytest.fixture
def eth_account_recursion_limit() -> Iterator[None]:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    yield
    sys.setrecursionlimit(before)


def _evidence(net: Net, tag: str) -> Evidence:
    return net.factory.honest(chat_body(f"node faults {tag}", max_tokens=3, seed=len(tag)))


def _commit(net: Net, evs: list[Evidence], manifest_pointer: str) -> bytes:
    """The operator commits the root of ``evs`` naming ``manifest_pointer`` (whatever is there)."""
    root = build_tree([e.digest for e in evs]).root
    bind(net.w3, net.d, net.r.operator).batches.commit_batch(root, len(evs), manifest_pointer)
    return root


def _open(net: Net, evs: list[Evidence], i: int, root: bytes) -> int:
    proof = build_tree([e.digest for e in evs]).proof(i)
    ch = bind(net.w3, net.d, net.r.challenger)
    return ch.challenges.open_challenge(evs[i].signed.receipt, evs[i].signed.signature, root,
                                        proof.index, proof.siblings, PARAMS.challenge_bond)


def _drive(net: Net, cid: int, nodes: list[VerifierNode], timeout_s: float = 120) -> Status:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for n in nodes:
            n.step()
        status = net.view.challenges.challenge(cid).status
        if status in (Status.SLASHED, Status.DISMISSED, Status.INCONCLUSIVE):
            return status
        time.sleep(0.05)
    raise AssertionError(f"challenge {cid} not resolved")


def _votes(net: Net, cid: int, nodes: list[VerifierNode]) -> list[tuple[bytes, str]]:
    return [(bytes.fromhex(n._state[str(cid)]["vote"][2:]), n._state[str(cid)]["reason"])
            for n in nodes if str(cid) in n._state]


def test_the_vote_is_the_contracts_invalid_evidence_constant(net: Net) -> None:
    on_chain = net.view.challenges.contract.functions.INVALID_EVIDENCE().call()
    assert bytes(on_chain) == INVALID_EVIDENCE


def test_nested_json_manifest_is_voted_by_every_member_and_a_restarted_node(
        net: Net, eth_account_recursion_limit: None) -> None:
    """A dishonest operator publishes a 190 KB [[[…]]] manifest. Before: every member judging
    the challenge died (SIGSEGV), and died again on restart while the challenge was open."""
    evs = [_evidence(net, "bomb")]
    root = _commit(net, evs, str(net.da.put(BOMB)))
    increase_time(net.w3, PARAMS.publication_deadline + 1)
    cid = _open(net, evs, 0, root)
    first = net.nodes[0]
    while not _votes(net, cid, [first]):  # one member judges the open challenge...
        first.step()
    restarted = [net.node(0), net.node(1, tag="-restarted"), net.nodes[2]]  # ...then restarts
    assert _drive(net, cid, restarted) is Status.SLASHED
    votes = _votes(net, cid, restarted)
    assert votes and all(v == (INVALID_EVIDENCE, "manifest_invalid") for v in votes)
    assert net.view.challenges.receipt_slashed(evs[0].digest)


def test_manifest_whose_root_is_not_the_on_chain_root_is_voted(net: Net) -> None:
    """The manifest parses and is signed, but lists other receipts than the committed root."""
    a, b = _evidence(net, "root-a"), _evidence(net, "root-b")
    other = build_manifest([ManifestEntry(b.signed, net.da.put(b.blob))])
    root = _commit(net, [a], str(net.da.put(other.to_bytes())))
    increase_time(net.w3, PARAMS.publication_deadline + 1)
    cid = _open(net, [a], 0, root)
    assert _drive(net, cid, net.nodes) is Status.SLASHED
    assert set(_votes(net, cid, net.nodes)) == {(INVALID_EVIDENCE, "manifest_invalid")}


def test_absent_manifest_is_retried_in_the_window_then_voted(net: Net) -> None:
    ev = _evidence(net, "no-manifest")
    never = Pointer.for_blob("redis", b"a manifest the operator never published")
    root = _commit(net, [ev], str(never))
    cid = _open(net, [ev], 0, root)
    # inside the publication window DA may lag: no vote yet, a retry is scheduled
    deadline = time.monotonic() + 60
    while not all(cid in n.retries for n in net.nodes):
        assert time.monotonic() < deadline
        for n in net.nodes:
            n.step()
    assert not _votes(net, cid, net.nodes)
    assert all(net.view.challenges.vote(cid, n.me).state is VoteState.MEMBER for n in net.nodes)
    # The publication window (600 s) outlasts this commit window (300 s): the operator must not
    # win by running the clock out, so absence becomes final with a quarter of the window left.
    _, ts = net.nodes[0].view.head()
    info = net.view.challenges.challenge(cid)
    increase_time(net.w3, info.commit_deadline - PARAMS.commit_period // 4 - ts)
    for n in net.nodes:
        n.retries.clear()
    assert _drive(net, cid, net.nodes) is Status.SLASHED
    assert set(_votes(net, cid, net.nodes)) == {(INVALID_EVIDENCE, "manifest_unavailable")}


def test_absent_ciphertext_after_the_window_is_voted(net: Net) -> None:
    """The manifest lists the ciphertext's pointer but the operator never put the blob on DA."""
    ev = _evidence(net, "no-ciphertext")
    m = build_manifest([ManifestEntry(ev.signed, Pointer.for_blob("redis", ev.blob))])
    root = _commit(net, [ev], str(net.da.put(m.to_bytes())))
    increase_time(net.w3, PARAMS.publication_deadline + 1)
    cid = _open(net, [ev], 0, root)
    assert _drive(net, cid, net.nodes) is Status.SLASHED
    assert set(_votes(net, cid, net.nodes)) == {(INVALID_EVIDENCE, "ciphertext_unavailable")}


def test_manifest_on_another_da_backend_counts_as_absent(net: Net) -> None:
    """The operator names a backend the network does not use (here: local files on a Redis
    network): no member can fetch it. Retrying would end in abstention, so it is voted."""
    ev = _evidence(net, "other-backend")
    m = build_manifest([ManifestEntry(ev.signed, net.da.put(ev.blob))])
    root = _commit(net, [ev], str(Pointer.for_blob("local", m.to_bytes())))
    increase_time(net.w3, PARAMS.publication_deadline + 1)
    cid = _open(net, [ev], 0, root)
    assert _drive(net, cid, net.nodes) is Status.SLASHED
    assert set(_votes(net, cid, net.nodes)) == {(INVALID_EVIDENCE, "manifest_unavailable")}


def test_local_da_and_kms_outages_are_retried_with_backoff_not_voted(net: Net) -> None:
    """Honest evidence; the members' own DA connection is down (connection refused), later
    their KMS quorum is unreachable (no shard runs). Neither is the operator's doing: no vote,
    retries with growing delays while the commit window is open."""
    ev = _evidence(net, "honest-outage")
    publish_batch(net.da, bind(net.w3, net.d, net.r.operator), [ev])
    dead = RedisDAClient("redis://127.0.0.1:1/0", prefix=net.da.prefix, socket_timeout_s=1.0)
    cut_off = [net.node(i, da=dead, tag="-outage") for i in range(3)]
    bl = build_tree([ev.digest])
    cid = _open(net, [ev], 0, bl.root)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 6:
        for n in cut_off:
            n.step()
        time.sleep(0.05)
    for n in cut_off:
        failures, _ = n.retries[cid]
        # backoff 0.2, 0.4, 0.8, 1.6, 2 s...: a handful of tries in 6 s, not one per step
        assert 3 <= failures <= 6, failures
        assert n.stats.local_faults == failures
        assert not _votes(net, cid, [n])
        assert net.view.challenges.vote(cid, n.me).state is VoteState.MEMBER
    # DA back, KMS unreachable: still local, still no vote
    back = [net.node(i, tag="-kms-down") for i in range(3)]
    for n in back:
        n.step()
        assert n.stats.local_faults == 1 and cid in n.retries and not _votes(net, cid, [n])
    assert any("enclave/KMS" in e for e in back[0].stats.errors)
    assert net.view.challenges.challenge(cid).status is Status.VOTING


def test_escalation_counts_only_reports_of_registered_verifiers_within_the_skew(
        net: Net) -> None:
    """`verinfer audit --escalate` opens challenges with the caller's bond on 'mismatch'
    reports read from a shared stream: a self-signed report from any key used to count."""
    ev = _evidence(net, "audit-report")
    now = int(time.time())
    mismatch = Verdict(INVALID_EVIDENCE, "ciphertext_unavailable", ev.signed.receipt.out_hash)

    def report(acct: LocalAccount, issued_at: int = now) -> SignedAuditReport:
        rep = AuditReport("job-1", ev.digest, acct.address, mismatch, issued_at)
        if issued_at >= 2**53:  # not canonicalizable, so not signable: a forged entry
            return SignedAuditReport(rep, b"\x00" * 65)
        return SignedAuditReport.sign(rep, acct)

    is_verifier = net.view.stakes.is_verifier
    assert report_problem(report(net.r.verifiers[0]), ev.signed, is_verifier, now) is None
    stranger = Account.create()  # signs its own report perfectly well, but stakes nothing
    why = report_problem(report(stranger), ev.signed, is_verifier, now)
    assert why is not None and "not a registered verifier" in why
    why = report_problem(report(net.r.operator), ev.signed, is_verifier, now)  # the operator
    assert why is not None and "not a registered verifier" in why
    for future in (now + 301, 2**64 - 1):
        why = report_problem(report(net.r.verifiers[0], future), ev.signed, is_verifier, now)
        assert why is not None and "issuedAt" in why
    other = _evidence(net, "another receipt")
    why = report_problem(report(net.r.verifiers[0]), other.signed, is_verifier, now)
    assert why is not None and "another receipt" in why


def test_rpc_outage_keeps_the_node_serving_with_backoff(net: Net) -> None:
    """This node's RPC refuses connections: every step fails, the node neither dies nor votes,
    and it backs off instead of hammering (0.1 s poll: ~4 tries in 3 s, not ~30)."""
    acct = net.r.verifiers[0]
    w3 = Web3(Web3.HTTPProvider("http://127.0.0.1:1", request_kwargs={"timeout": 1}))
    c = bind(w3, net.d, acct)
    n = VerifierNode(ChainView(w3, net.d, c), c, acct,
                     EnclaveJudge(net.cfg, acct, net.da, net.engine).judge, net.da,
                     NodeConfig(net.tmp / "v0-rpc.json", retry_max_s=2.0))
    t0 = time.monotonic()
    n.run(lambda: time.monotonic() - t0 > 3.0, poll_s=0.1)
    assert 2 <= len(n.stats.errors) <= 6, n.stats.errors
    assert n.stats.judged == n.stats.committed == 0
