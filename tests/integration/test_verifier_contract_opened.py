"""A challenge opened through a contract (issue 31, finding 5), against a real anvil.

The committee node reads the challenged receipt from the openChallenge calldata; a challenge
sent through another contract (here a forwarder that drops a 4-byte prefix, as any wrapper,
multisig or batcher does) has calldata the node cannot decode, so it does not know the
receipt's issuedAt. It used to measure the manifest's absence from issuedAt 0 and vote
``manifest_unavailable`` (INVALID_EVIDENCE) at once, while the manifest was still inside its
publication window: an honest operator whose manifest was still propagating was slashed. Now the
node bounds issuedAt from chain state (the batch's commit time + MAX_CLOCK_SKEW, which
openChallenge enforces), so it waits like for any other challenge — and still votes against a
manifest that stays absent before the commit deadline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time, mine
from verinfer.chain.bindings import Contracts, TxSender, receipt_tuple
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.structs import (
    COVERAGE_NOTICE,
    ETHER,
    INVALID_EVIDENCE,
    Kind,
    Role,
    Status,
    VoteState,
    default_params,
)
from verinfer.da_client.local import LocalDAClient
from verinfer.protocol.hexutil import parse_hex
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.node import NodeConfig, VerifierNode
from verinfer.verifier.votes import Verdict

MODEL = hashlib.sha256(b"contract-opened model").digest()
FINGERPRINT = hashlib.sha256(b"contract-opened fingerprint").digest()


def forwarder_initcode(target: str) -> bytes:
    """EVM code of a contract that forwards calldata[4:] with the call's value to ``target``
    and returns (or reverts with) its answer: the call reaches the ChallengeManager from a
    contract, with transaction input that is not openChallenge's."""
    addr = bytes.fromhex(target[2:])
    size = bytes.fromhex("600436" "03")  # calldatasize - 4
    runtime = (size + bytes.fromhex("6004" "5f" "37")  # calldatacopy(0, 4, size)
               + bytes.fromhex("5f5f") + size + bytes.fromhex("5f" "34" "73") + addr
               + bytes.fromhex("5a" "f1")  # call(gas, target, value, 0, size, 0, 0)
               + bytes.fromhex("3d5f5f3e"))  # returndatacopy(0, 0, returndatasize)
    ok = len(runtime) + 6  # after PUSH1 ok, JUMPI, revert(0, returndatasize)
    runtime += bytes([0x60, ok, 0x57]) + bytes.fromhex("3d5ffd") + bytes.fromhex("5b3d5ff3")
    assert runtime[ok] == 0x5B
    return bytes([0x60, len(runtime), 0x80, 0x60, 9, 0x5F, 0x39, 0x5F, 0xF3]) + runtime


def _send_raw(w3: Web3, who: LocalAccount, to: str | None, data: bytes, value: int = 0
              ) -> dict[str, Any]:
    tx: dict[str, Any] = {"from": who.address, "data": data, "value": value,
                             "chainId": w3.eth.chain_id,
                             "nonce": w3.eth.get_transaction_count(who.address, "pending"),
                             "gasPrice": w3.eth.gas_price}
    if to is not None:
        tx["to"] = to
    tx["gas"] = w3.eth.estimate_gas(tx) * 2  # type: ignore[arg-type]
    signed = who.sign_transaction(tx)
    receipt = w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(
        signed.raw_transaction), timeout=30)
    assert receipt["status"] == 1, receipt
    return dict(receipt)


def _never_judge(receipt: Receipt, pointer: str | None, **kw: object) -> Verdict:
    raise AssertionError("the enclave judge ran although the manifest is absent")


@pytest.fixture
def chain() -> Iterator[tuple[Web3, Deployment, list[LocalAccount]]]:
    with Anvil() as node:
        w3 = node.web3()
        accts = dev_accounts(4)  # governance, operator, challenger, verifier
        d = deploy_all(w3, accts[0], default_params())
        gov = d.bind(w3, TxSender(w3, accts[0]))
        gov.config.approve(Kind.MODEL, MODEL)
        gov.config.approve(Kind.ENGINE_FINGERPRINT, FINGERPRINT)
        gov.config.register_key_epoch(1, b"\x04" * 32, b"\x11" * 32, 2, 3)
        d.bind(w3, TxSender(w3, accts[1])).stakes.register(Role.OPERATOR, 5 * ETHER)
        verifier = d.bind(w3, TxSender(w3, accts[3]))
        verifier.stakes.register(Role.VERIFIER, ETHER)
        verifier.stakes.declare_fingerprint(FINGERPRINT, MODEL)
        increase_time(w3, COVERAGE_NOTICE)
        yield w3, d, accts


def test_contract_opened_challenge_is_not_accused_inside_the_publication_window(
        chain: tuple[Web3, Deployment, list[LocalAccount]], tmp_path: Path) -> None:
    w3, d, accts = chain
    _, operator, challenger, verifier = accts
    p = default_params()
    domain = Domain(d.chain_id, d.challenge_manager)
    now = int(w3.eth.get_block("latest")["timestamp"])
    receipt = Receipt(operator=operator.address, chain_id=d.chain_id,
                      model_id=MODEL, engine_fingerprint_hash=FINGERPRINT,
                      req_hash=hashlib.sha256(b"req").digest(),
                      out_hash=hashlib.sha256(b"out").digest(), key_epoch=1,
                      ciphertext_hash=hashlib.sha256(b"ct").digest(), issued_at=now)
    tree = build_tree([receipt.digest(domain)])
    # committed; its manifest is not on DA yet (still propagating, inside the window)
    op: Contracts = d.bind(w3, TxSender(w3, operator))
    op.batches.commit_batch(tree.root, 1, "da://local/0x" + hashlib.sha256(b"m").hexdigest())
    fwd = _send_raw(w3, challenger, None, forwarder_initcode(d.challenge_manager)
                    )["contractAddress"]
    view_c: Contracts = d.bind(w3)
    proof = tree.proof(0)
    calldata = parse_hex(view_c.challenges.contract.encode_abi("openChallenge", args=[
        receipt_tuple(receipt), sign_receipt_typed(receipt, domain, operator), tree.root,
        proof.index, list(proof.siblings)]), None, "calldata")
    _send_raw(w3, challenger, str(fwd), b"\xde\xad\xbe\xef" + calldata, p.challenge_bond)
    cid = view_c.challenges.contract.functions.challengeCount().call()
    assert view_c.challenges.challenge(cid).status is Status.AWAITING_DRAW
    mine(w3, p.draw_delay_blocks + 1)
    view_c.challenges.with_sender(TxSender(w3, verifier)).draw_committee(cid)
    assert [m.account for m in view_c.challenges.committee(cid)] == [verifier.address]

    view = ChainView(w3, d, view_c)
    [oc] = [o for o in view.opened() if o.challenge_id == cid]
    assert oc.signed is None  # the node cannot read this receipt from the calldata
    node = VerifierNode(view, d.bind(w3, TxSender(w3, verifier)),
                        verifier, _never_judge, LocalDAClient(tmp_path / "da"),
                        NodeConfig(tmp_path / "votes.json", resolve=False, claim_rewards=False,
                                   retry_initial_s=0.0))
    node.step()
    # inside the publication window: no vote, retried like any absent-but-young manifest
    assert str(cid) not in node._state, node._state
    assert view_c.challenges.vote(cid, verifier.address).state is VoteState.MEMBER
    assert node.stats.local_faults == 1 and node.stats.operator_faults == 0
    assert "publication window open" in node.stats.errors[-1]

    # a manifest still absent with a quarter of the commit window left is the operator's
    # fault whatever the receipt: the contract-opened challenge cannot be run out either
    info = view_c.challenges.challenge(cid)
    ts = int(w3.eth.get_block("latest")["timestamp"])
    increase_time(w3, info.commit_deadline - p.commit_period // 4 - ts)
    node.step()
    assert node._state[str(cid)]["reason"] == "manifest_unavailable"
    assert parse_hex(node._state[str(cid)]["vote"], 32, "vote") == INVALID_EVIDENCE
    assert view_c.challenges.vote(cid, verifier.address).state is VoteState.COMMITTED
