"""Committee nodes against the real stack: anvil + contracts, 5 KMS shard processes (t = 3)
that read committees from the chain, the local DA store, the tiny engine; 4 VerifierNodes
(threads, in-process SoftwareEnclave). Honest receipts are dismissed, cheats slashed,
unpublished claim upheld; an offline member does not block a verdict; revealing without a
commitment, or copying one, gains nothing."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from web3 import Web3

from verinfer.chain.anvil import Anvil
from verinfer.chain.bindings import vote_commitment
from verinfer.chain.deploy import Deployment
from verinfer.chain.errors import ContractRevertError
from verinfer.chain.structs import ETHER, ClaimStatus, Role, Status
from verinfer.da_client.local import LocalDAClient
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
from verinfer.kms.local_cluster import ChainSource, ShardProcesses
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.testing.chain_clock import MiningNode, TimeTravelChallenger
from verinfer.testing.evidence import EvidenceFactory, chat_body
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.challenger import Challenger, locate
from verinfer.verifier.enclave_judge import EnclaveConfig, EnclaveJudge
from verinfer.verifier.node import NodeConfig, VerifierNode


@dataclass
class Stack:
    w3: Web3
    d: Deployment
    r: Roles
    da: LocalDAClient
    factory: EvidenceFactory
    nodes: list[VerifierNode]
    threads: dict[int, tuple[threading.Thread, threading.Event]]
    tmp: Path

    def challenger(self) -> Challenger:
        return TimeTravelChallenger(ChainView(self.w3, self.d, bind(self.w3, self.d)),
                                    bind(self.w3, self.d, self.r.challenger), self.da)

    def start(self, i: int) -> None:
        stop = threading.Event()
        t = threading.Thread(target=self.nodes[i].run, args=(stop.is_set, 0.1), daemon=True)
        t.start()
        self.threads[i] = (t, stop)

    def stop(self, i: int) -> None:
        t, stop = self.threads.pop(i)
        stop.set()
        t.join(timeout=30)


def _tagged_log(i: int) -> Callable[[str], None]:
    return lambda m: print(f"[v{i}] {m}", flush=True)


@pytest.fixture(scope="module")
def stack(tiny_engine: Engine, tiny_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    with Anvil() as node:
        w3 = node.web3()
        r = roles(4)
        d = deploy_network(w3, r, tiny_engine, devnet_params(committee_size=4))
        d.save(tmp / "deployment.json")
        lay = provision_kms(tmp / "kms", tiny_engine)
        rec = register_epoch(w3, d, r, lay)
        da = LocalDAClient(tmp / "da")
        view = ChainView(w3, d, bind(w3, d))
        factory = EvidenceFactory(tiny_engine, ReceiptSigner(r.operator.key),
                                  Domain(d.chain_id, d.challenge_manager), key_epoch=1,
                                  epoch_public_key=epoch_public_key(rec),
                                  now=lambda: view.head()[1])
        cfg = EnclaveConfig(lay.root_key, lay.directory, lay.registry, CONTAINER_DIGEST,
                            CODE_HASH, tiny_path)
        nodes = []
        for i, acct in enumerate(r.verifiers):
            vw3 = Web3(Web3.HTTPProvider(node.url))
            c = bind(vw3, d, acct)
            n = MiningNode(ChainView(vw3, d, c), c, acct,
                           EnclaveJudge(cfg, acct, da, tiny_engine).judge, da,
                           NodeConfig(tmp / f"v{i}.json"),
                             log=_tagged_log(i))
            assert n.ensure_registered(ETHER)
            assert n.ensure_declared([(tiny_engine.fingerprint.hash,
                                       tiny_engine.model_id)]).declared
            nodes.append(n)
        # the shards read committees from the chain (ChainCommitteeOracle)
        with ShardProcesses(lay, chain=ChainSource(node.url, tmp / "deployment.json"),
                            extra_args=["--rate-capacity", "100", "--rate-refill", "10"]
                            ) as shards:
            shards.start()
            s = Stack(w3, d, r, da, factory, nodes, {}, tmp)
            for i in range(len(nodes)):
                s.start(i)
            yield s
            for i in list(s.threads):
                s.stop(i)


def _challenge(s: Stack, ev_ref: str) -> tuple[int, Status]:
    ch = s.challenger()
    loc = locate(ch.view, s.da, ev_ref)
    kind, cid = ch.open(loc)
    assert kind == "challenge"
    return cid, ch.wait(cid, timeout_s=float(os.environ.get("VI_WAIT", "240")))


def test_honest_receipts_are_dismissed_and_the_bond_pays_the_committee(stack: Stack) -> None:
    evs = [stack.factory.honest(chat_body(f"honest {i}", max_tokens=6, seed=i)) for i in range(3)]
    op = bind(stack.w3, stack.d, stack.r.operator)
    publish_batch(stack.da, op, evs)
    view = bind(stack.w3, stack.d)
    stake = view.stakes.account_of(stack.r.operator.address).stake
    for ev in evs[:2]:
        cid, status = _challenge(stack, "0x" + ev.digest.hex())
        assert status is Status.DISMISSED
        info = view.challenges.challenge(cid)
        assert info.majority_out_hash == ev.signed.receipt.out_hash
        assert info.reveals == info.members == 4
    assert view.stakes.account_of(stack.r.operator.address).stake == stake  # 0 slashes


def test_tampered_output_is_slashed(stack: Stack) -> None:
    ev = stack.factory.unsafe_tampered_text(chat_body("tamper", max_tokens=6, seed=5))
    publish_batch(stack.da, bind(stack.w3, stack.d, stack.r.operator), [ev])
    _cid, status = _challenge(stack, "0x" + ev.digest.hex())
    assert status is Status.SLASHED
    assert bind(stack.w3, stack.d).challenges.receipt_slashed(ev.digest)


def test_withheld_receipt_claim_is_upheld(stack: Stack) -> None:
    ev = stack.factory.honest(chat_body("never published", max_tokens=4, seed=6))
    f = stack.tmp / "withheld.json"
    import json
    f.write_text(json.dumps(ev.signed.to_json()))
    ch = stack.challenger()
    kind, claim_id = ch.open(locate(ch.view, stack.da, str(f)))
    assert kind == "claim"
    assert ch.settle_claim(claim_id) is ClaimStatus.SLASHED


def test_offline_member_and_free_riders_gain_nothing(stack: Stack) -> None:
    ev = stack.factory.honest(chat_body("offline member", max_tokens=6, seed=8))
    publish_batch(stack.da, bind(stack.w3, stack.d, stack.r.operator), [ev])
    stack.stop(3)
    offline = stack.r.verifiers[3]
    try:
        ch = stack.challenger()
        _kind, cid = ch.open(locate(ch.view, stack.da, "0x" + ev.digest.hex()))
        ch.stall_s = 3.0
        # a member that never committed cannot reveal; copying a commitment cannot be revealed
        # (the commitment binds the voter), so the copier is penalized like a non-revealer
        c_off = bind(stack.w3, stack.d, offline)
        import time
        deadline = time.monotonic() + 120
        while c_off.challenges.challenge(cid).status is not Status.VOTING:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with pytest.raises(ContractRevertError) as e:
            c_off.challenges.reveal_vote(cid, ev.signed.receipt.out_hash, b"\x00" * 32)
        assert e.value.error_name in ("NotCommitted", "RevealPhaseNotOpen")
        other = stack.r.verifiers[0].address
        while c_off.challenges.vote(cid, other).state.name == "MEMBER":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        copied = c_off.challenges.vote(cid, other).value
        c_off.challenges.commit_vote(cid, copied)
        assert copied != vote_commitment(cid, offline.address, ev.signed.receipt.out_hash,
                                         b"\x00" * 32)
        status = ch.wait(cid, timeout_s=240)
        assert status is Status.DISMISSED  # 3 of 4 honest reveals reach τ = 2/3
        view = bind(stack.w3, stack.d)
        assert view.challenges.credits(offline.address) == 0
        acct = view.stakes.account_of(offline.address)
        assert acct.stake == ETHER - devnet_params().non_reveal_penalty
        assert acct.role is Role.VERIFIER
    finally:
        stack.start(3)
