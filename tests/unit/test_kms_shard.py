"""The release policy of one shard, in process (FastAPI TestClient, injectable clock).
Every refusal path has its own test; each asserts the HTTP status and the reason code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from eth_account import Account
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.identity import recover_eip191_signer, sign_eip191
from verinfer.kms.local_cluster import ClusterLayout, build_shard_service, provision
from verinfer.kms.protocol import (
    TRANSPORT_SUITE,
    Release,
    ReleaseRequest,
    release_digest,
    report_data,
    requester_digest,
    share_info,
)
from verinfer.kms.release_log import ReleaseLogError, verify_release_log
from verinfer.kms.shamir import Share, verify_share
from verinfer.kms.shard_app import create_app

M = measurement("sha256:" + "11" * 32, "code", "engine")
T0 = 1_700_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Env:
    lay: ClusterLayout
    clock: Clock
    client: TestClient
    attester: SoftwareAttester
    member: LocalAccount
    auditor: LocalAccount
    outsider: LocalAccount
    address: str


@pytest.fixture
def env(tmp_path: Path) -> Env:
    member, auditor, outsider = Account.create(), Account.create(), Account.create()
    clock = Clock(T0)
    lay = provision(tmp_path / "kms", epoch=1, threshold=2, shares=3, measurements=[M],
                    verifiers=[member.address, auditor.address],
                    challenges={"c1": [member.address]}, now=clock, unsafe_single_tree=True)
    service = build_shard_service(lay, 1, now=clock, nonce_ttl_s=30, quote_max_age_s=60,
                                  rate_capacity=3, rate_refill_per_s=0.5)
    att = SoftwareAttester(load_root_private(lay.root_key), M, clock)
    return Env(lay, clock, TestClient(create_app(service)), att, member, auditor, outsider,
               service.address)


def nonce(env: Env) -> bytes:
    r = env.client.post("/v1/nonce")
    assert r.status_code == 200
    assert r.json()["expires_at"] == pytest.approx(env.clock.t + 30)
    return bytes.fromhex(r.json()["nonce"][2:])


def request(env: Env, *, signer: LocalAccount | None = None, requester: str | None = None,
            attester: SoftwareAttester | None = None, epoch: int = 1,
            purpose: str = "full_challenge", challenge_id: str = "c1",
            n: bytes | None = None, quoted_key: bytes | None = None,
            ) -> tuple[dict[str, Any], X25519PrivateKey]:
    signer = signer or env.member
    requester = (requester or signer.address).lower()
    eph = X25519PrivateKey.generate()
    pub = eph.public_key().public_bytes_raw()
    nonces = {1: n if n is not None else nonce(env), 2: b"\x02" * 32}
    kw = dict(epoch=epoch, purpose=purpose, challenge_id=challenge_id, requester=requester,
              nonces=nonces)
    rd = report_data(enclave_public_key=pub, **kw)  # type: ignore[arg-type]
    rd_quoted = rd if quoted_key is None else report_data(enclave_public_key=quoted_key,
                                                          **kw)  # type: ignore[arg-type]
    req = ReleaseRequest(epoch=epoch, purpose=purpose, challenge_id=challenge_id,
                         requester=requester,
                         requester_signature=sign_eip191(signer, requester_digest(rd)),
                         enclave_public_key=pub, nonces=nonces,
                         quote=(attester or env.attester).quote(rd_quoted))
    return req.to_json(), eph


def refused(env: Env, body: Any, status: int, reason: str) -> None:
    r = env.client.post("/v1/release", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["reason"] == reason and err["shard_index"] == 1, err
    assert err["message"]


def test_release_delivers_a_verifiable_share(env: Env) -> None:
    body, eph = request(env)
    r = env.client.post("/v1/release", json=body)
    assert r.status_code == 200, r.text
    rel = Release.from_json(r.json())
    assert recover_eip191_signer(release_digest(rel.unsigned_json()), rel.signature) \
        == env.address == rel.shard_address
    rd = ReleaseRequest.from_json(body).report_data()
    pt = TRANSPORT_SUITE.decrypt(rel.encrypted_share, eph, info=share_info(1, 1, rd))
    rec = FileEpochRegistry(env.lay.registry).get(1)
    verify_share(Share(1, int.from_bytes(pt, "big")), rec.commitment_bytes)
    log = env.lay.release_log(1).read_text()
    assert verify_release_log(env.lay.release_log(1))[0] == 1
    assert pt.hex() not in log and '"released"' in log


def test_refuses_forged_quote(env: Env) -> None:
    forger = SoftwareAttester(Ed25519PrivateKey.generate(), M, env.clock)
    refused(env, request(env, attester=forger)[0], 403, "quote_signature_invalid")


def test_refuses_quote_for_another_enclave_key(env: Env) -> None:
    other = X25519PrivateKey.generate().public_key().public_bytes_raw()
    refused(env, request(env, quoted_key=other)[0], 403, "report_data_mismatch")


def test_refuses_replayed_nonce(env: Env) -> None:
    n = nonce(env)
    body, _ = request(env, n=n)
    first = env.client.post("/v1/release", json=body)
    assert first.status_code == 200
    # the identical request again gets the identical release (idempotent; only the enclave
    # bound into report_data can open it) ...
    again = env.client.post("/v1/release", json=body)
    assert again.status_code == 200 and again.json() == first.json()
    # ... but another request (another enclave key) cannot reuse the spent nonce
    refused(env, request(env, n=n)[0], 403, "nonce_replayed")


def test_refused_copy_does_not_spend_the_nonce(env: Env) -> None:
    """An altered copy of a genuine body (seen by a malicious shard or proxy) is refused
    without spending the nonce, so the genuine request still succeeds."""
    body, _ = request(env)
    refused(env, {**body, "challenge_id": "c2"}, 403, "report_data_mismatch")
    forged = Account.create()
    refused(env, {**body, "requester_signature": "0x" + sign_eip191(
        forged, b"\x00" * 32).hex()}, 401, "requester_signature_invalid")
    assert env.client.post("/v1/release", json=body).status_code == 200


def test_nonce_flood_does_not_block_another_release(env: Env) -> None:
    """Issuing nonces keeps no state: 20,000 issued to one client (twice the former cap on
    outstanding nonces) leave another client's release unaffected."""
    service = env.client.app.state.service  # type: ignore[attr-defined]
    for _ in range(20_000):
        service.issue_nonce()
    assert len(service.nonces) == 0
    body, _ = request(env, signer=env.auditor, purpose="light_audit", challenge_id="a")
    assert env.client.post("/v1/release", json=body).status_code == 200


def test_refuses_unknown_and_expired_nonces(env: Env) -> None:
    refused(env, request(env, n=b"\x07" * 32)[0], 403, "nonce_unknown")
    n = nonce(env)
    env.clock.t += 31
    refused(env, request(env, n=n)[0], 403, "nonce_expired")


def test_refuses_expired_quote(env: Env) -> None:
    stale = SoftwareAttester(load_root_private(env.lay.root_key), M, lambda: T0 - 61)
    refused(env, request(env, attester=stale)[0], 403, "quote_expired")


def test_refuses_measurement_not_allowlisted(env: Env) -> None:
    rogue = SoftwareAttester(load_root_private(env.lay.root_key),
                             measurement("sha256:" + "11" * 32, "patched-code", "engine"),
                             env.clock)
    refused(env, request(env, attester=rogue)[0], 403, "measurement_not_allowed")


def test_refuses_retired_and_unknown_epochs(env: Env) -> None:
    FileEpochRegistry(env.lay.registry).retire(1, int(env.clock.t))
    refused(env, request(env)[0], 403, "epoch_retired")
    refused(env, request(env, epoch=9)[0], 404, "epoch_unknown")


def test_refuses_non_committee_requester(env: Env) -> None:
    refused(env, request(env, signer=env.outsider)[0], 403, "not_committee_member")
    # a registered verifier not drawn for c1 is refused for the full challenge ...
    refused(env, request(env, signer=env.auditor)[0], 403, "not_committee_member")
    # ... but may obtain the key for a light audit; an outsider may not
    body, _ = request(env, signer=env.auditor, purpose="light_audit", challenge_id="audit-1")
    assert env.client.post("/v1/release", json=body).status_code == 200
    refused(env, request(env, signer=env.outsider, purpose="light_audit")[0], 403,
            "not_committee_member")
    # a challenge that is no longer open
    data = json.loads(env.lay.committee.read_text())
    data["challenges"]["c1"]["status"] = "resolved"
    env.lay.committee.write_text(json.dumps(data))
    refused(env, request(env)[0], 403, "not_committee_member")


def test_refuses_impersonated_requester(env: Env) -> None:
    body, _ = request(env, signer=env.outsider, requester=env.member.address)
    refused(env, body, 401, "requester_signature_invalid")


def test_rate_limit_per_requester(env: Env) -> None:
    for _ in range(3):
        assert env.client.post("/v1/release", json=request(env)[0]).status_code == 200
    refused(env, request(env)[0], 429, "rate_limited")
    # another requester has its own bucket
    body, _ = request(env, signer=env.auditor, purpose="light_audit")
    assert env.client.post("/v1/release", json=body).status_code == 200
    env.clock.t += 2.0  # 0.5 token/s refills one token
    assert env.client.post("/v1/release", json=request(env)[0]).status_code == 200
    refused(env, request(env)[0], 429, "rate_limited")


def test_bad_requests(env: Env) -> None:
    r = env.client.post("/v1/release", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["reason"] == "bad_request"
    body, _ = request(env)
    for field, value in [("purpose", "curiosity"), ("epoch", -1), ("requester", "0x12"),
                         ("enclave_public_key", "0xabcd"), ("nonces", {})]:
        refused(env, {**body, field: value}, 400, "bad_request")
    refused(env, {**body, "nonces": {"2": "0x" + "02" * 32}}, 400, "bad_request")


def test_health_metrics_and_log_chain(env: Env) -> None:
    assert env.client.get("/health").json()["address"] == env.address
    n = nonce(env)
    body, _ = request(env, n=n)
    env.client.post("/v1/release", json=body)
    env.client.post("/v1/release", json=body)
    env.client.post("/v1/release", json=request(env, n=n)[0])
    text = env.client.get("/metrics").text
    assert 'kms_release_decisions_total{decision="released",reason="released"} 1.0' in text
    assert ('kms_release_decisions_total{decision="released",'
            'reason="repeat_of_identical_request"} 1.0') in text
    assert 'kms_release_decisions_total{decision="refused",reason="nonce_replayed"} 1.0' in text
    assert "kms_nonces_issued_total 1.0" in text
    path = env.lay.release_log(1)
    assert verify_release_log(path)[0] == 3
    lines = path.read_text().splitlines()
    entry = json.loads(lines[0])
    entry["requester"] = "0x" + "00" * 20
    path.write_text(json.dumps(entry) + "\n" + lines[1] + "\n")
    with pytest.raises(ReleaseLogError):
        verify_release_log(path)


def test_missing_share_is_a_server_error(env: Env) -> None:
    from verinfer.kms.keygen import share_path

    share_path(env.lay.data_dir(1), 1).unlink()
    refused(env, request(env)[0], 503, "share_unavailable")


def test_a_clusters_ports_are_distinct() -> None:
    """Shards provisioned together never share a port (picked one at a time, a port released
    by the previous pick could come back: the explorer then saw one shard twice)."""
    from verinfer.ports import free_ports

    for _ in range(20):
        ports = free_ports(16)
        assert len(set(ports)) == 16 and all(0 < p < 65536 for p in ports)
