"""The operator against a real anvil: a served response's receipt lands in a batch that the
BatchRegistry holds, and the chain computes the same receipt digest the client got."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from support.servers import operator_init, running_server
from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.deploy import deploy_all
from verinfer.chain.structs import ETHER, default_params
from verinfer.receipts.eip712 import Receipt


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Anvil, Path]]:
    with Anvil() as node:
        w3 = node.web3()
        gov = dev_accounts(1)[0]
        # coverage read at issuedAt itself: the operator signs right after its verifier declares
        d = deploy_all(w3, gov, default_params(), coverage_notice_s=0)
        dep = tmp_path_factory.mktemp("chain") / "deployment.json"
        d.save(dep)
        yield node, dep


def approve_identity(node: Anvil, dep: Path, base: str, timeout_s: float = 30) -> None:
    """Governance approves the served model id and engine fingerprint (read from /health) and a
    verifier declares that fingerprint (the operator refuses to sign uncovered receipts);
    waits until the operator sees it and is ready."""
    from verinfer.chain.bindings import TxSender
    from verinfer.chain.deploy import Deployment
    from verinfer.chain.structs import Kind, Role

    health = httpx.get(base + "/health").json()
    fp = bytes.fromhex(health["engine_fingerprint"]["hash"][2:])
    w3 = node.web3()
    gov = Deployment.load(dep).bind(w3, TxSender(w3, dev_accounts(1)[0]))
    gov.config.approve(Kind.MODEL, bytes.fromhex(health["model_id"][2:]))
    gov.config.approve(Kind.ENGINE_FINGERPRINT, fp)
    deadline = time.monotonic() + timeout_s
    # approved but no verifier declared: the operator still refuses to sign
    while "no verifier is declared" not in (h := httpx.get(base + "/health").json()).get(
            "not_ready", {}).get("identity", ""):
        assert time.monotonic() < deadline, h
        time.sleep(0.2)
    verifier = Deployment.load(dep).bind(w3, TxSender(w3, dev_accounts(3)[2]))
    verifier.stakes.register(Role.VERIFIER, gov.config.params().min_verifier_stake)
    verifier.stakes.declare_fingerprint(fp, bytes.fromhex(health["model_id"][2:]))
    while not httpx.get(base + "/health").json()["ready"]:
        assert time.monotonic() < deadline, httpx.get(base + "/health").json()
        time.sleep(0.2)


def _stranger_claim_is_answered(node: Anvil, dep: Path, base: str,
                                v: dict[str, Any]) -> None:
    """Issue 31: once the publication deadline has passed a stranger claims the served,
    committed receipt unpublished; the serving operator's claim responder answers it with the
    batch's Merkle proof (stake untouched, the bond to the operator) and counts it in
    /metrics."""
    from verinfer.chain.bindings import TxSender
    from verinfer.chain.deploy import Deployment
    from verinfer.chain.structs import ClaimStatus
    from verinfer.protocol.hexutil import parse_hex

    w3 = node.web3()
    view = Deployment.load(dep).bind(w3)
    p = view.config.params()
    op = Receipt.from_json(v["receipt"]["message"]).operator
    stake, credits = view.stakes.account_of(op), view.challenges.credits(op)
    increase_time(w3, p.publication_deadline + 1)
    stranger = Deployment.load(dep).bind(w3, TxSender(w3, dev_accounts(4)[3]))
    cid = stranger.challenges.claim_unpublished(
        Receipt.from_json(v["receipt"]["message"]), parse_hex(v["signature"], 65, "signature"),
        p.challenge_bond)
    deadline = time.monotonic() + 30
    while view.challenges.claim(cid).status is ClaimStatus.OPEN:
        assert time.monotonic() < deadline, "the operator did not answer the claim"
        time.sleep(0.2)
    assert view.challenges.claim(cid).status is ClaimStatus.ANSWERED
    assert view.stakes.account_of(op) == stake
    assert view.challenges.credits(op) == credits + p.challenge_bond
    metrics = httpx.get(base + "/metrics").text
    assert 'verinfer_unpublished_claims_total{outcome="answered"} 1.0' in metrics, metrics


def _cli(*args: str) -> dict[str, int]:
    r = subprocess.run([sys.executable, "-m", "verinfer", "operator", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_served_receipt_is_committed_on_chain(chain: tuple[Anvil, Path], tiny_path: Path,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    node, dep = chain
    op = dev_accounts(2)[1]
    monkeypatch.setenv("OPERATOR_KEY", op.key.hex())
    info = operator_init(tmp_path / "op", "--private-key-env", "OPERATOR_KEY", "--rpc-url",
                         node.url, "--deployment", str(dep))
    assert info["operator"] == op.address
    staked = _cli("register", str(tmp_path / "op"), "--stake", "5")
    assert staked["stake_wei"] == 5 * ETHER
    with running_server(tiny_path, "--operator-dir", str(tmp_path / "op"),
                        env=dict(os.environ)) as base:
        approve_identity(node, dep, base)  # the operator signs only once it is approved
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
        v = (r.model_extra or {})["verification"]
        deadline = time.monotonic() + 60
        while (st := httpx.get(f"{base}/v1/receipts/{v['receipt_id']}").json())["state"] \
                != "committed" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert st["state"] == "committed", st
        _stranger_claim_is_answered(node, dep, base, v)
    w3 = node.web3()
    from verinfer.chain.deploy import Deployment

    contracts = Deployment.load(dep).bind(w3)
    root = bytes.fromhex(st["batch"]["root"][2:])
    info_on_chain = contracts.batches.batch_of(op.address, root)
    assert info_on_chain.exists and info_on_chain.leaf_count == st["batch"]["leaf_count"]
    receipt = Receipt.from_json(v["receipt"]["message"])
    assert "0x" + contracts.challenges.receipt_digest(receipt).hex() == v["receipt_id"]
    unbonding = _cli("unbond", str(tmp_path / "op"), "--amount", "1.5")
    assert unbonding["unbonding_wei"] == 3 * ETHER // 2
    assert unbonding["stake_wei"] == 5 * ETHER  # still slashable until withdrawn
