"""The receipt keeper end to end, on the verified client's network (verinfer.testing.client_chain:
anvil with the contracts, a staked operator running the real `verinfer serve` bound to that
chain and publishing to its local DA, the same set-up as tests/e2e/test_client_verified.py).

- an honest answer, kept by VerifiedOpenAI, is followed by the keeper's background task through
  pending -> batched (the operator's real batch, proof checked against the committed root) ->
  available (its ciphertext on the operator's DA) -> final (the chain clock moved past the
  challenge window);
- an answer the operator signed and never published (the cheat factory, the operator's key,
  served over HTTP) is kept, and `verinfer client watch` files the unpublished claim once the
  deadline passed and resolves it after the response period: the operator is slashed, the
  claimant credited; `verinfer client status --json` shows it.

This module has its own chain: it moves anvil's clock by hours, which the other client tests'
receipts (signed on the wall clock, approvals read at issuedAt) must not see. The honest test
runs first: after the clock jumped, the operator's next batch would be committed after a
wall-clock receipt's deadline.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.client_evidence import cheating_operator
from support.servers import operator_init, running_server
from verinfer.chain.anvil import dev_accounts, increase_time
from verinfer.chain.structs import ClaimStatus
from verinfer.client import ClientModel, Keeper, KeeperPolicy, ReceiptStore, State, VerifiedOpenAI
from verinfer.da_client.local import LocalDAClient
from verinfer.engine.engine import Engine
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.client_chain import ClientChain, client_chain
from verinfer.testing.evidence import EvidenceFactory

pytestmark = [pytest.mark.anvil, pytest.mark.process, pytest.mark.loopback]

VI = [sys.executable, "-m", "verinfer"]
CHAT: dict[str, Any] = {"model": "tiny", "max_tokens": 5,
                        "messages": [{"role": "user", "content": "keep this receipt"}]}


@dataclass
class Net:
    chain: ClientChain
    base: str
    model: ClientModel
    op_dir: Path

    def client(self, store: ReceiptStore, base: str | None = None) -> VerifiedOpenAI:
        return VerifiedOpenAI(base_url=base or self.base + "/v1", api_key="unused",
                              max_retries=0, models=[self.model], rpc_url=self.chain.node.url,
                              deployment=self.chain.deployment_file, receipts=store)

    def chain_time(self) -> int:
        return int(self.chain.node.web3().eth.get_block("latest")["timestamp"])


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path, tiny_engine: Engine
        ) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("keeper")
    with client_chain(tmp) as chain, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPERATOR_KEY", chain.operator.key.hex())
        operator_init(tmp / "op", "--private-key-env", "OPERATOR_KEY", "--rpc-url",
                      chain.node.url, "--deployment", str(chain.deployment_file))
        with running_server(tiny_path, "--operator-dir", str(tmp / "op"),
                            env=dict(os.environ)) as base:
            health = httpx.get(base + "/health").json()
            chain.approve(bytes.fromhex(health["model_id"][2:]),
                          bytes.fromhex(health["engine_fingerprint"]["hash"][2:]))
            chain.approve(tiny_engine.model_id,
                          hashlib.sha256(tiny_engine.fingerprint.canonical()).digest())
            deadline = time.monotonic() + 60
            while not httpx.get(base + "/health").json()["ready"]:
                assert time.monotonic() < deadline, httpx.get(base + "/health").json()
                time.sleep(0.2)
            yield Net(chain, base, ClientModel.from_gguf(tiny_path, names=["tiny"]),
                      tmp / "op")


def _wait_state(store: ReceiptStore, rid: str, want: State, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while store.get(rid).state is not want:
        assert time.monotonic() < deadline, (store.get(rid), store.history(rid))
        time.sleep(0.2)


def test_an_honest_answer_ends_final(net: Net, tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "receipts.sqlite")
    r = net.client(store).chat.completions.create(**CHAT, seed=11)
    rid = r.model_extra["verification"]["receipt_id"]  # type: ignore[index]
    assert [k.id for k in store.receipts()] == [rid]
    keeper = Keeper.connect(store, net.chain.node.url, net.chain.deployment_file,
                            LocalDAClient(net.op_dir / "da"), account=None,
                            policy=KeeperPolicy(file_claims=False, poll_s=0.2)).start()
    try:
        _wait_state(store, rid, State.AVAILABLE)
        k = store.get(rid)
        assert k.committed_at is not None and k.committed_at <= (k.publish_by or 0)
        assert k.final_after == k.committed_at + 3600 and k.ciphertext
        assert net.chain_time() <= k.final_after  # not final before the window closes
        assert store.get(rid).state is State.AVAILABLE
        increase_time(net.chain.node.web3(), k.final_after - net.chain_time() + 1)
        _wait_state(store, rid, State.FINAL, timeout_s=30)
    finally:
        keeper.stop(timeout_s=30)
    assert [s for _, s, _ in store.history(rid)] == [State.PENDING, State.BATCHED,
                                                     State.AVAILABLE, State.FINAL]


def _watch_once(net: Net, receipts: Path, key: str) -> dict[str, Any]:
    out = subprocess.run(
        [*VI, "client", "watch", "--once", "--receipts", str(receipts), "--rpc-url",
         net.chain.node.url, "--deployment", str(net.chain.deployment_file), "--da-store",
         str(net.op_dir / "da")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "VERINFER_CHAIN_PRIVATE_KEY": key})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_withheld_receipt_is_claimed_and_the_operator_slashed(net: Net, tiny_engine: Engine,
                                                                tmp_path: Path) -> None:
    sk, pk = derive_epoch_keypair(hashlib.sha256(b"keeper e2e epoch").digest(),
                                  EnvelopeSuite.X25519)
    f = EvidenceFactory(tiny_engine, ReceiptSigner(bytes(net.chain.operator.key)),
                        net.chain.domain, key_epoch=1, epoch_public_key=pk, now=time.time)
    receipts = tmp_path / "receipts.sqlite"
    store = ReceiptStore(receipts)
    with cheating_operator(lambda b: (f.honest(b), None), sk) as base:
        net.client(store, base).chat.completions.create(**CHAT, seed=12)  # passes every check
    [k] = store.receipts()
    store.close()
    c = net.chain.bound(net.chain.operator)
    params = c.config.params()
    operator = net.chain.operator.address
    stake0 = c.stakes.account_of(operator).stake
    claimant = dev_accounts(5)[4]
    key = claimant.key.hex()
    w3 = net.chain.node.web3()
    publish_by = k.issued_at + params.publication_deadline
    if net.chain_time() < publish_by:
        _watch_once(net, receipts, key)
        status = _status(receipts)
        assert status["counts"]["pending"] == 1, status  # its deadline has not passed
        assert status["next_deadline"]["deadline"] == publish_by
        increase_time(w3, publish_by - net.chain_time() + 1)
    _watch_once(net, receipts, key)  # the deadline passed: the claim is filed
    with ReceiptStore(receipts) as s:
        kept = s.get(k.id)
    assert kept.state is State.CLAIMED and kept.claim_id, kept
    claim = c.challenges.claim(kept.claim_id)
    assert claim.status is ClaimStatus.OPEN and claim.claimant == claimant.address
    assert to_hex(claim.receipt_digest) == k.id
    _watch_once(net, receipts, key)  # within the response period: nothing to do
    assert c.challenges.claim(kept.claim_id).status is ClaimStatus.OPEN
    increase_time(w3, claim.response_deadline - net.chain_time() + 1)
    _watch_once(net, receipts, key)  # resolveUnpublished
    _watch_once(net, receipts, key)  # reads the claim: slashed
    assert c.challenges.claim(kept.claim_id).status is ClaimStatus.SLASHED
    assert c.challenges.receipt_state(k.signed.digest).unpublished_slashed
    assert c.stakes.account_of(operator).stake == stake0 - params.slash_amount
    assert c.challenges.credits(claimant.address) > params.challenge_bond
    status = _status(receipts)
    assert status["counts"]["slashed"] == 1 and status["next_deadline"] is None, status
    assert [f["receipt"] for f in status["failures"]] == [k.id]


def _status(receipts: Path) -> dict[str, Any]:
    out = subprocess.run([*VI, "client", "status", "--json", "--receipts", str(receipts)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]
