"""Issue 13.5 and 24.2 (operator side), on a real anvil with the real contracts.

* An operator whose engine fingerprint (or model) is not approved on chain, or whose fingerprint
  no verifier declared, would sign receipts
  that are slashable at challenge open: it must refuse (503, /health says why) and become
  ready by itself once governance approves — the hash it waits for covers only what decides
  the bits, so a host move or library upgrade does not change it.
* An operator configured for another chain id than the connected chain's must not start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.servers import launched_server, operator_init
from verinfer.chain.anvil import Anvil, dev_accounts
from verinfer.chain.bindings import TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.structs import Kind, Role, default_params
from verinfer.engine.fingerprint import engine_fingerprint
from verinfer.receipts.eip712 import Receipt

CHAT = {"model": "tiny", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Anvil, Path]]:
    with Anvil() as node:
        # coverage read at issuedAt itself: the operator signs right after a verifier declares
        d = deploy_all(node.web3(), dev_accounts(1)[0], default_params(), coverage_notice_s=0)
        dep = tmp_path_factory.mktemp("chain") / "deployment.json"
        d.save(dep)
        yield node, dep


def _operator(directory: Path, node: Anvil, dep: Path) -> None:
    os.environ["VI_TEST_OPERATOR_KEY"] = dev_accounts(3)[2].key.hex()
    operator_init(directory, "--private-key-env", "VI_TEST_OPERATOR_KEY", "--rpc-url",
                  node.url, "--deployment", str(dep))


def test_unapproved_identity_is_refused_until_governance_approves(
        chain: tuple[Anvil, Path], tiny_path: Path, tmp_path: Path) -> None:
    node, dep = chain
    _operator(tmp_path / "op", node, dep)
    cfg = json.loads((tmp_path / "op" / "operator.json").read_text())
    cfg["backpressure"] = {"check_interval_s": 0.2}
    (tmp_path / "op" / "operator.json").write_text(json.dumps(cfg))
    with launched_server(tiny_path, "--operator-dir", str(tmp_path / "op"),
                         env=dict(os.environ)) as server, \
            httpx.Client(base_url=server.base, timeout=60) as c:
        health = c.get("/health").json()
        assert not health["ready"]
        reason = health["not_ready"]["identity"]
        assert "engine fingerprint" in reason and "model id" in reason
        refused = c.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "operator_not_ready"
        assert refused.json()["error"]["type"] == "server_error"
        assert "Retry-After" in refused.headers

        gov = Deployment.load(dep).bind(node.web3(), TxSender(node.web3(), dev_accounts(1)[0]))
        gov.config.approve(Kind.MODEL, bytes.fromhex(health["model_id"][2:]))
        time.sleep(0.6)  # the model alone is not enough
        assert "engine fingerprint" in c.get("/health").json()["not_ready"]["identity"]
        fp_hash = health["engine_fingerprint"]["hash"]
        gov.config.approve(Kind.ENGINE_FINGERPRINT, bytes.fromhex(fp_hash[2:]))
        deadline = time.monotonic() + 20
        # approved, but no verifier could judge its receipts: invalid at open, so no signing
        while "no verifier is declared" not in (h := c.get("/health").json()).get(
                "not_ready", {}).get("identity", ""):
            assert time.monotonic() < deadline, h
            time.sleep(0.1)
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 503
        verifier = Deployment.load(dep).bind(node.web3(),
                                             TxSender(node.web3(), dev_accounts(4)[3]))
        verifier.stakes.register(Role.VERIFIER, gov.config.params().min_verifier_stake)
        verifier.stakes.declare_fingerprint(bytes.fromhex(fp_hash[2:]),
                                            bytes.fromhex(health["model_id"][2:]))
        while not c.get("/health").json()["ready"]:
            assert time.monotonic() < deadline, c.get("/health").json()
            time.sleep(0.1)
        ok = c.post("/v1/chat/completions", json=CHAT)
        assert ok.status_code == 200, ok.text
        receipt = Receipt.from_json(ok.json()["verification"]["receipt"]["message"])
        assert "0x" + receipt.engine_fingerprint_hash.hex() == fp_hash
        assert receipt.chain_id == node.web3().eth.chain_id


def test_reported_fields_do_not_change_the_approved_hash() -> None:
    """A host move or library upgrade (CPU model string, torch/numpy/verinfer versions) must
    not change the hash governance approved; what decides the bits must."""
    fp = engine_fingerprint("invariant", "avx2", "fma-seq-v2")
    moved = dataclasses.replace(fp, reported={**fp.reported, "device": "Other CPU 9000",
                                              "torch": "9.9.9", "numpy": "3.0.0",
                                              "verinfer": "7.0", "kernel_isa": "scalar",
                                              "host": "elsewhere"})
    assert moved.hash == fp.hash and moved.canonical() == fp.canonical()
    assert engine_fingerprint("invariant", "avx512", "fma-seq-v2").hash == fp.hash
    for changed in (dataclasses.replace(fp, sampler="vi-sample-v3"),
                    dataclasses.replace(fp, linear_order="other-order"),
                    dataclasses.replace(fp, container_digest="sha256:" + "1" * 64),
                    engine_fingerprint("fast", "none", "fma-seq-v2")):
        assert changed.hash != fp.hash
    assert not {"device", "torch", "numpy", "verinfer", "cpu_flags"} & set(fp.approved())


def test_operator_for_another_chain_refuses_to_start(
        chain: tuple[Anvil, Path], tiny_path: Path, tmp_path: Path) -> None:
    """Receipts with chainId 1 on chain 31337 verify off chain but can never be challenged."""
    node, dep = chain
    _operator(tmp_path / "op", node, dep)
    cfg = json.loads((tmp_path / "op" / "operator.json").read_text())
    cfg["chain_id"] = 1
    (tmp_path / "op" / "operator.json").write_text(json.dumps(cfg))
    with pytest.raises(RuntimeError, match="refusing to sign receipts for another chain"), \
            launched_server(tiny_path, "--operator-dir", str(tmp_path / "op"),
                            env=dict(os.environ)):
        pass


def test_unsafe_setups_need_an_explicit_flag(tiny_path: Path, tmp_path: Path) -> None:
    """`operator init` without a deployment and `serve` of such a set-up refuse without
    --unsafe-dev; the KMS provisioning helper refuses without its unsafe flag."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init",
                        str(tmp_path / "plain"), "--light-kdf"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--unsafe-dev" in r.stderr
    assert not (tmp_path / "plain" / "operator.json").exists()
    operator_init(tmp_path / "demo")
    with pytest.raises(RuntimeError, match="unsafe for production"), \
            launched_server(tiny_path, "--operator-dir", str(tmp_path / "demo"),
                            unsafe_dev=False):
        pass
    from verinfer.kms.local_cluster import provision

    with pytest.raises(ValueError, match="unsafe_single_tree"):
        provision(tmp_path / "kms", epoch=1, threshold=2, shares=3, measurements=[])
