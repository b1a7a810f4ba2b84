"""The KMS shards' ChainCommitteeOracle against a real anvil with the deployed contracts.

A drawn member of an open challenge is allowed; a registered verifier not drawn, everyone before
the draw, and the member after resolution are refused; light audits need a registered verifier
with the minimum active stake; an unreachable RPC raises the typed error (the shard answers 503
``committee_unavailable``, never a share). Then the same decisions through a shard's HTTP policy,
and `verinfer kms shard serve` with --rpc-url/--deployment as a real process."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from eth_account import Account
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from web3 import Web3

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.chain.anvil import Anvil, dev_accounts, increase_time, mine
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.structs import COVERAGE_NOTICE, ETHER, Kind, Role, Status, default_params
from verinfer.kms.chain_oracle import ChainCommitteeOracle, parse_challenge_id
from verinfer.kms.cli import app as kms_app
from verinfer.kms.errors import CommitteeUnavailableError, RegistryError
from verinfer.kms.identity import sign_eip191
from verinfer.kms.local_cluster import (
    ChainSource,
    ClusterLayout,
    ShardProcesses,
    build_shard_service,
    provision,
)
from verinfer.kms.protocol import ReleaseRequest, report_data, requester_digest
from verinfer.kms.release_log import verify_release_log
from verinfer.kms.shard_app import create_app, http_status
from verinfer.ports import free_port
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree

MODEL = hashlib.sha256(b"weights").digest()
FINGERPRINT = hashlib.sha256(b"engine fingerprint").digest()
M = measurement("sha256:" + "11" * 32, "code", "engine")
PARAMS = default_params()  # committee of 3 out of 5 verifiers


@dataclass
class Net:
    url: str
    w3: Web3
    d: Deployment
    deployment_file: Path
    gov: LocalAccount
    operator: LocalAccount
    challenger: LocalAccount
    verifiers: list[LocalAccount]
    outsider: LocalAccount
    oracle: ChainCommitteeOracle
    tmp: Path

    def as_(self, who: LocalAccount | None = None) -> Contracts:
        return self.d.bind(self.w3, TxSender(self.w3, who) if who is not None else None)

    def by_address(self, address: str) -> LocalAccount:
        return next(v for v in self.verifiers if v.address.lower() == address.lower())


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("chain-oracle")
    with Anvil() as node:
        w3 = node.web3()
        a = dev_accounts(10)
        d = deploy_all(w3, a[0], PARAMS)
        d.save(tmp / "deployment.json")
        n = Net(node.url, w3, d, tmp / "deployment.json", a[0], a[1], a[2], a[3:8], a[8],
                ChainCommitteeOracle.connect(node.url, tmp / "deployment.json"), tmp)
        gov = n.as_(n.gov)
        gov.config.approve(Kind.MODEL, MODEL)
        gov.config.approve(Kind.ENGINE_FINGERPRINT, FINGERPRINT)
        gov.config.register_key_epoch(1, b"\x04" * 32, b"\x11" * 32, 2, 3)
        n.as_(n.operator).stakes.register(Role.OPERATOR, 20 * ETHER)
        for v in n.verifiers:
            n.as_(v).stakes.register(Role.VERIFIER, ETHER)
            n.as_(v).stakes.declare_fingerprint(FINGERPRINT, MODEL)
        increase_time(w3, COVERAGE_NOTICE)
        yield n


def open_challenge(net: Net, tag: bytes) -> int:
    """A committed one-receipt batch and an open (not yet drawn) challenge of it."""
    domain = Domain(chain_id=net.d.chain_id, verifying_contract=net.d.challenge_manager)
    now = int(net.w3.eth.get_block("latest")["timestamp"])
    r = Receipt(operator=net.operator.address, chain_id=net.d.chain_id, model_id=MODEL,
                engine_fingerprint_hash=FINGERPRINT, req_hash=hashlib.sha256(tag).digest(),
                out_hash=hashlib.sha256(b"out" + tag).digest(), key_epoch=1,
                ciphertext_hash=hashlib.sha256(b"ct" + tag).digest(), issued_at=now)
    tree = build_tree([r.digest(domain)])
    net.as_(net.operator).batches.commit_batch(tree.root, 1, "da://local/0x" + "ab" * 32)
    proof = tree.proof(0)
    return net.as_(net.challenger).challenges.open_challenge(
        r, sign_receipt_typed(r, domain, net.operator), tree.root, proof.index, proof.siblings,
        PARAMS.challenge_bond)


def draw(net: Net, cid: int) -> tuple[list[str], list[str]]:
    """Draws the committee; returns (members, registered verifiers not drawn)."""
    mine(net.w3, PARAMS.draw_delay_blocks + 1)
    net.as_(net.challenger).challenges.draw_committee(cid)
    members = [m.account for m in net.as_().challenges.committee(cid)]
    assert len(members) == PARAMS.committee_size
    others = [v.address for v in net.verifiers if v.address not in members]
    assert others
    return members, others


def resolve(net: Net, cid: int) -> None:
    """Past the reveal deadline with no votes: resolved (inconclusive)."""
    increase_time(net.w3, PARAMS.commit_period + PARAMS.reveal_period + 1)
    net.as_(net.challenger).challenges.resolve(cid)
    assert net.as_().challenges.challenge(cid).status is Status.INCONCLUSIVE


def test_committee_membership_follows_the_chain(net: Net) -> None:
    o = net.oracle
    o.check()
    cid = open_challenge(net, b"membership")
    everyone = [v.address for v in net.verifiers]
    # open but not drawn: nobody is a member yet
    assert not any(o.is_committee_member(str(cid), v) for v in everyone)
    members, others = draw(net, cid)
    for m in members:  # any address spelling: checksummed or lower case
        assert o.is_committee_member(str(cid), m)
        assert o.is_committee_member(str(cid), m.lower())
    # a registered verifier not drawn, the challenger, an outsider: refused for this challenge
    for who in [*others, net.challenger.address, net.outsider.address]:
        assert not o.is_committee_member(str(cid), who)
    assert all(o.is_registered_verifier(v) for v in others)
    # the id is the canonical decimal string, nothing else names the challenge
    for alias in (f"0{cid}", f"+{cid}", f" {cid}", f"{cid} ", hex(cid), f"{cid}.0", "١",
                  str(cid + 1000), "0", "audit-1", str(2**256)):
        assert not o.is_committee_member(alias, members[0]), alias
    assert not o.is_committee_member(str(cid), "0xnot-an-address")
    resolve(net, cid)
    for m in members:
        assert not o.is_committee_member(str(cid), m)


def test_light_audits_need_a_staked_registered_verifier(net: Net) -> None:
    o = net.oracle
    for who in (net.outsider, net.operator, net.challenger, net.gov):
        assert not o.is_registered_verifier(who.address)
    assert not o.is_registered_verifier("0x" + "00" * 20)
    assert not o.is_registered_verifier("garbage")
    fresh = Account.create()
    net.w3.eth.send_transaction({"from": net.gov.address, "to": fresh.address,
                                 "value": 2 * ETHER})
    assert not o.is_registered_verifier(fresh.address)
    net.as_(fresh).stakes.register(Role.VERIFIER, PARAMS.min_verifier_stake)
    assert o.is_registered_verifier(fresh.address.lower())
    # unbonding below the minimum active stake ends light-audit access at once
    net.as_(fresh).stakes.request_unbond(1)
    assert not o.is_registered_verifier(fresh.address)


def test_unreachable_rpc_raises_the_typed_error(net: Net) -> None:
    dead = ChainCommitteeOracle.connect(f"http://127.0.0.1:{free_port()}", net.deployment_file)
    t0 = time.monotonic()
    with pytest.raises(CommitteeUnavailableError) as e:
        dead.is_committee_member("1", net.verifiers[0].address)
    assert http_status(e.value) == 503 and e.value.code == "committee_unavailable"
    assert "127.0.0.1" in e.value.message
    with pytest.raises(CommitteeUnavailableError):
        dead.is_registered_verifier(net.verifiers[0].address)
    with pytest.raises(CommitteeUnavailableError):
        dead.check()
    assert time.monotonic() - t0 < 15  # fails in seconds, not minutes
    # a node that accepts the connection and never answers: the whole call ends at its
    # deadline (verinfer.chain.rpc: RpcDeadlineExceeded)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        stuck = ChainCommitteeOracle.connect(f"http://127.0.0.1:{silent.getsockname()[1]}",
                                             net.deployment_file, timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(CommitteeUnavailableError, match=r"did not answer within 0\.5 s"):
            stuck.is_registered_verifier(net.verifiers[0].address)
        assert time.monotonic() - t0 < 5


def test_startup_check_refuses_a_wrong_deployment(net: Net) -> None:
    other_chain = ChainCommitteeOracle.connect(net.url, replace(net.d, chain_id=1))
    with pytest.raises(RegistryError, match="chain 31337"):
        other_chain.check()
    empty = "0x" + "12" * 20
    nothing_there = ChainCommitteeOracle.connect(net.url, replace(net.d, challenge_manager=empty))
    with pytest.raises(RegistryError, match="no ChallengeManager"):
        nothing_there.check()
    # a call to an address without code fails closed too
    with pytest.raises(CommitteeUnavailableError):
        nothing_there.is_committee_member("1", net.verifiers[0].address)


def test_parse_challenge_id() -> None:
    assert parse_challenge_id("0") == 0
    assert parse_challenge_id("17") == 17
    assert parse_challenge_id(str(2**256 - 1)) == 2**256 - 1
    for bad in ("", "01", "-1", "1e3", "0x1", "１", str(2**256), "9" * 79):
        assert parse_challenge_id(bad) is None, bad


# ---- through a shard's release policy -----------------------------------------------------
@pytest.fixture(scope="module")
def lay(net: Net) -> ClusterLayout:
    return provision(net.tmp / "kms", epoch=1, threshold=2, shares=3, measurements=[M],
                     unsafe_single_tree=True)


def release_body(lay: ClusterLayout, client: TestClient, signer: LocalAccount, *,
                 purpose: str, challenge_id: str) -> dict[str, Any]:
    grant = client.post("/v1/nonce").json()
    pub = X25519PrivateKey.generate().public_key().public_bytes_raw()
    requester = signer.address.lower()
    nonces = {int(grant["shard_index"]): bytes.fromhex(grant["nonce"][2:])}
    rd = report_data(epoch=1, purpose=purpose, challenge_id=challenge_id, requester=requester,
                     enclave_public_key=pub, nonces=nonces)
    att = SoftwareAttester(load_root_private(lay.root_key), M, time.time)
    return ReleaseRequest(epoch=1, purpose=purpose, challenge_id=challenge_id,
                          requester=requester,
                          requester_signature=sign_eip191(signer, requester_digest(rd)),
                          enclave_public_key=pub, nonces=nonces, quote=att.quote(rd)).to_json()


def test_shard_policy_reads_the_chain(net: Net, lay: ClusterLayout) -> None:
    client = TestClient(create_app(build_shard_service(
        lay, 1, now=time.time, rate_capacity=100, rate_refill_per_s=10, committee=net.oracle)))

    def post(signer: LocalAccount, purpose: str, cid: str) -> httpx.Response:
        return client.post("/v1/release", json=release_body(lay, client, signer,
                                                            purpose=purpose, challenge_id=cid))

    cid = open_challenge(net, b"shard policy")
    members, others = draw(net, cid)
    member, other = net.by_address(members[0]), net.by_address(others[0])
    assert post(member, "full_challenge", str(cid)).status_code == 200
    r = post(other, "full_challenge", str(cid))
    assert r.status_code == 403 and r.json()["error"]["reason"] == "not_committee_member"
    assert post(other, "light_audit", "audit-1").status_code == 200
    r = post(net.outsider, "light_audit", "audit-2")
    assert r.status_code == 403 and r.json()["error"]["reason"] == "not_committee_member"
    resolve(net, cid)
    r = post(member, "full_challenge", str(cid))
    assert r.status_code == 403 and r.json()["error"]["reason"] == "not_committee_member"
    # the chain goes away: a clear 503, never a share
    dead = TestClient(create_app(build_shard_service(
        lay, 2, now=time.time, committee=ChainCommitteeOracle.connect(
            f"http://127.0.0.1:{free_port()}", net.deployment_file))))
    body = release_body(lay, dead, member, purpose="light_audit", challenge_id="audit-3")
    r = dead.post("/v1/release", json=body)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["reason"] == "committee_unavailable"
    n, _ = verify_release_log(lay.release_log(2))
    assert n == 1
    assert '"reason":"committee_unavailable"' in lay.release_log(2).read_text()


# ---- the shard process ----------------------------------------------------------------
def test_shard_serve_needs_exactly_one_committee_source(net: Net, lay: ClusterLayout) -> None:
    base = ["shard", "serve", "--index", "1", "--port", str(free_port()),
            "--data-dir", str(lay.data_dir(1)), "--seal-key-file", str(lay.seal_key_file(1)),
            "--registry", str(lay.registry), "--attestation-root", str(lay.root_pub),
            "--allowlist", str(lay.allowlist)]
    runner = CliRunner()
    cases = {
        "no committee source": [],
        "--committee excludes": ["--committee", str(lay.committee), "--rpc-url", net.url,
                                 "--deployment", str(net.deployment_file)],
        "go together": ["--rpc-url", net.url],
    }
    for message, extra in cases.items():
        res = runner.invoke(kms_app, [*base, *extra])
        assert res.exit_code == 2, (extra, res.output)
        assert message in res.output, res.output
    res = runner.invoke(kms_app, [*base, "--rpc-url", f"http://127.0.0.1:{free_port()}",
                                  "--deployment", str(net.deployment_file)])
    assert res.exit_code == 2, res.output
    assert "cannot read eth_chainId" in res.output, res.output


def test_shard_process_with_the_chain_oracle(net: Net, lay: ClusterLayout) -> None:
    with ShardProcesses(lay, chain=ChainSource(net.url, net.deployment_file)) as shards:
        assert shards.committee_args() == ["--rpc-url", net.url,
                                           "--deployment", str(net.deployment_file)]
        shards.start([3])
        info = {s.index: s for s in lay.shards_info()}[3]
        r = httpx.post(info.url + "/v1/release", json={"epoch": 1})
        assert r.status_code == 400  # up and answering; the policy is tested above
    assert "committee from chain " + net.url in lay.server_log(3).read_text()
