"""The devnet moves anvil; the verifier node only waits (issue 33).

anvil mines a block only for a transaction, so a challenge waits for its draw block until
something mines it. The node used to mine it itself under ``--unsafe-devnet-mine`` (anvil code
inside a service); now the node only waits, and the devnet's own process
(``verinfer devnet mine-draws``, :func:`verinfer.testing.chain_clock.mine_pending_draws`) mines
to the draw block. Real anvil, real contracts, the real CLI process.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.structs import (
    COVERAGE_NOTICE,
    ETHER,
    Kind,
    Role,
    Status,
    VoteState,
    default_params,
)
from verinfer.da_client.local import LocalDAClient
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree
from verinfer.testing.chain_clock import mine_pending_draws
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.node import NodeConfig, VerifierNode
from verinfer.verifier.votes import Verdict

MODEL = hashlib.sha256(b"draw miner model").digest()
FINGERPRINT = hashlib.sha256(b"draw miner fingerprint").digest()


def _no_judge(receipt: Receipt, pointer: str | None, **kw: object) -> Verdict:
    raise AssertionError("not judged in this test")


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[Anvil, Deployment, LocalAccount, int]]:
    """A deployment with one verifier and one challenge waiting for its draw block."""
    with Anvil() as node:
        w3 = node.web3()
        gov_a, operator, challenger, verifier = dev_accounts(4)
        d = deploy_all(w3, gov_a, default_params())
        gov = d.bind(w3, TxSender(w3, gov_a))
        gov.config.approve(Kind.MODEL, MODEL)
        gov.config.approve(Kind.ENGINE_FINGERPRINT, FINGERPRINT)
        gov.config.register_key_epoch(1, b"\x04" * 32, b"\x11" * 32, 2, 3)
        op: Contracts = d.bind(w3, TxSender(w3, operator))
        op.stakes.register(Role.OPERATOR, 5 * ETHER)
        v = d.bind(w3, TxSender(w3, verifier))
        v.stakes.register(Role.VERIFIER, ETHER)
        v.stakes.declare_fingerprint(FINGERPRINT, MODEL)
        increase_time(w3, COVERAGE_NOTICE)
        domain = Domain(d.chain_id, d.challenge_manager)
        receipt = Receipt(operator=operator.address, chain_id=d.chain_id, model_id=MODEL,
                          engine_fingerprint_hash=FINGERPRINT,
                          req_hash=hashlib.sha256(b"req").digest(),
                          out_hash=hashlib.sha256(b"out").digest(), key_epoch=1,
                          ciphertext_hash=hashlib.sha256(b"ct").digest(),
                          issued_at=int(w3.eth.get_block("latest")["timestamp"]))
        tree = build_tree([receipt.digest(domain)])
        op.batches.commit_batch(tree.root, 1, "da://local/0x" + hashlib.sha256(b"m").hexdigest())
        ch: Contracts = d.bind(w3, TxSender(w3, challenger))
        proof = tree.proof(0)
        ch.challenges.open_challenge(receipt, sign_receipt_typed(receipt, domain, operator),
                                     tree.root, proof.index, list(proof.siblings),
                                     default_params().challenge_bond)
        cid = int(ch.challenges.contract.functions.challengeCount().call())
        d.save(tmp_path / "deployment.json")
        yield node, d, verifier, cid


def _node(w3: Web3, d: Deployment, verifier: LocalAccount, tmp: Path) -> VerifierNode:
    c = d.bind(w3, TxSender(w3, verifier))
    return VerifierNode(ChainView(w3, d, d.bind(w3)), c, verifier, _no_judge,
                        LocalDAClient(tmp / "da"),
                        NodeConfig(tmp / "votes.json", resolve=False, claim_rewards=False))


def test_the_node_waits_and_the_devnet_mines(
        opened: tuple[Anvil, Deployment, LocalAccount, int], tmp_path: Path) -> None:
    anvil, d, verifier, cid = opened
    w3 = anvil.web3()
    view, contracts = ChainView(w3, d, d.bind(w3)), d.bind(w3)
    target = contracts.challenges.challenge(cid).target_block
    node = _node(w3, d, verifier, tmp_path)
    before = w3.eth.block_number
    assert before <= target
    for _ in range(3):  # the service moves nothing: no block, no draw
        node.step()
    assert w3.eth.block_number == before
    assert contracts.challenges.challenge(cid).status is Status.AWAITING_DRAW

    assert mine_pending_draws(view, contracts) == target - before + 1
    assert w3.eth.block_number == target + 1
    assert mine_pending_draws(view, contracts) == 0  # nothing waits any more
    node.step()  # past the draw block: the node draws
    assert contracts.challenges.challenge(cid).status is Status.VOTING
    assert contracts.challenges.vote(cid, verifier.address).state is VoteState.MEMBER


def test_devnet_mine_draws_is_a_process_of_the_devnet(
        opened: tuple[Anvil, Deployment, LocalAccount, int], tmp_path: Path) -> None:
    """What `verinfer devnet up` starts beside its verifiers."""
    anvil, d, _, cid = opened
    w3 = anvil.web3()
    target = d.bind(w3).challenges.challenge(cid).target_block
    proc = subprocess.Popen([sys.executable, "-m", "verinfer", "devnet", "mine-draws",
                             "--rpc-url", anvil.url, "--deployment",
                             str(tmp_path / "deployment.json"), "--interval-s", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while w3.eth.block_number <= target and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")[-2000:]
            time.sleep(0.2)
        assert w3.eth.block_number == target + 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
