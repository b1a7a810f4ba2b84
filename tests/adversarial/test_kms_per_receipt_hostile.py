"""Hostile per-receipt decryption requests against one in-process shard (the same service
`verinfer kms shard serve` runs): an identity or off-curve E, a ciphertext that is not the
receipt's, a receipt of another epoch, a share release of a threshold epoch, a target sent to
/v1/release, a body over the /v1/decrypt bound — each refused with its typed reason, and an
accepted partial that really is f(i)·E with a proof that verifies (so the refusals are not
the only thing the endpoint can do)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from eth_account import Account
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.kms import tdh
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.identity import sign_eip191
from verinfer.kms.local_cluster import ClusterLayout, build_shard_service, provision
from verinfer.kms.protocol import (
    ANY_AUDITOR,
    TRANSPORT_SUITE,
    AuditAssignment,
    DecryptTarget,
    Release,
    ReleaseRequest,
    dleq_context,
    partial_info,
    report_data,
    requester_digest,
)
from verinfer.kms.shard_app import create_app
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Receipt, address_of
from verinfer.receipts.envelope import (
    HEADER_LEN,
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    seal,
)
from verinfer.receipts.epoch_keys import EnvelopeSuite, load_public_key

M = measurement("sha256:" + "66" * 32, "code", "engine")
REQ = ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32), engine_fingerprint="{}",
                  prompt_token_ids=(1, 2, 3), max_tokens=8, temperature=0.0, top_k=0,
                  top_p=1.0, stop=(), seed=1, ignore_eos=False)
RES = ExecResult(output_token_ids=(4,), finish_reason="length", logit_digest=bytes(32),
                 text_sha256=bytes(32))
OPERATOR = address_of(hashlib.sha256(b"op").digest())


def _receipt(blob: bytes, epoch: int = 1) -> Receipt:
    return Receipt(operator=OPERATOR, chain_id=31337, model_id=REQ.model_id,
                   engine_fingerprint_hash=REQ.engine_fingerprint_hash, req_hash=REQ.hash,
                   out_hash=RES.hash, key_epoch=epoch, ciphertext_hash=ciphertext_hash(blob),
                   issued_at=1_700_000_000)


@dataclass
class Env:
    lay: ClusterLayout
    client: TestClient
    member: LocalAccount
    blob: bytes
    receipt: Receipt
    attester: SoftwareAttester
    scheduler: LocalAccount
    auditor: LocalAccount


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    member, scheduler, auditor = Account.create(), Account.create(), Account.create()
    lay = provision(tmp_path_factory.mktemp("kms-pr-hostile"), epoch=1, threshold=2, shares=3,
                    measurements=[M], suite=EnvelopeSuite.P256.value, unsafe_single_tree=True)
    pk = load_public_key(EnvelopeSuite.P256,
                         FileEpochRegistry(lay.registry).get(1).public_key_bytes)
    binding = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=31337, key_epoch=1,
                                            request=REQ, result=RES)
    blob = seal(EnvelopeContents(REQ, RES, b"{}", b"{}"), binding, pk)
    receipt = _receipt(blob)
    lay.committee.write_text(json.dumps({"verifiers": [member.address, auditor.address],
                                         "challenges": {
        "c1": {"status": "open", "committee": [member.address],
               "receipt_hash": "0x" + receipt.struct_hash.hex()}}}))
    service = build_shard_service(lay, 1, now=lambda: 1_700_000_000.0, rate_capacity=1000,
                                  audit_schedulers=[scheduler.address])
    att = SoftwareAttester(load_root_private(lay.root_key), M, lambda: 1_700_000_000.0)
    return Env(lay, TestClient(create_app(service, max_decrypt_body_bytes=64 * 1024)), member,
               blob, receipt, att, scheduler, auditor)


def _body(env: Env, target: DecryptTarget | None, *, signer: LocalAccount | None = None,
          purpose: str = "full_challenge", assignment: AuditAssignment | None = None,
          ) -> tuple[dict[str, Any], X25519PrivateKey, bytes]:
    signer = signer or env.member
    eph = X25519PrivateKey.generate()
    pub = eph.public_key().public_bytes_raw()
    nonces = {1: bytes.fromhex(env.client.post("/v1/nonce").json()["nonce"][2:])}
    who = signer.address.lower()
    rd = report_data(epoch=1, purpose=purpose, challenge_id="c1", requester=who,
                     enclave_public_key=pub, nonces=nonces, target=target)
    req = ReleaseRequest(epoch=1, purpose=purpose, challenge_id="c1", requester=who,
                         requester_signature=sign_eip191(signer, requester_digest(rd)),
                         enclave_public_key=pub, nonces=nonces, quote=env.attester.quote(rd),
                         target=target, assignment=assignment)
    return req.to_json(), eph, rd


def _refused(r: Any, status: int, reason: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["reason"] == reason, r.json()


def test_honest_request_gets_a_verifiable_partial(env: Env) -> None:
    body, eph, rd = _body(env, DecryptTarget(env.receipt, env.blob))
    r = env.client.post("/v1/decrypt", json=body)
    assert r.status_code == 200, r.text
    rel = Release.from_json(r.json())
    partial = TRANSPORT_SUITE.decrypt(rel.encrypted_share, eph, info=partial_info(1, 1, rd))
    rec = FileEpochRegistry(env.lay.registry).get(1)
    v1 = tdh.verification_key(tdh.parse_commitments(rec.commitment_bytes, 2), 1)
    enc = env.blob[HEADER_LEN:HEADER_LEN + tdh.ENC_LEN]
    tdh.verify_partial(partial, index=1, enc=enc, verification=v1, context=dleq_context(rd, 1))


@pytest.mark.parametrize("bad_enc", [b"\x04" + bytes(64), b"\x04" + b"\x01" * 64])
def test_identity_or_off_curve_e_is_a_bad_request(env: Env, bad_enc: bytes) -> None:
    # The operator's own (hostile) envelope: a receipt for a blob whose E is not a point.
    blob = env.blob[:HEADER_LEN] + bad_enc + env.blob[HEADER_LEN + tdh.ENC_LEN:]
    receipt = _receipt(blob)
    saved = env.lay.committee.read_text()
    env.lay.committee.write_text(json.dumps({"verifiers": [], "challenges": {
        "c1": {"status": "open", "committee": [env.member.address],
               "receipt_hash": "0x" + receipt.struct_hash.hex()}}}))
    try:
        body, _, _ = _body(env, DecryptTarget(receipt, blob))
        # refused as a point, before its proof of knowledge is looked at
        _refused(env.client.post("/v1/decrypt", json=body), 400, "encapsulation_malformed")
    finally:
        env.lay.committee.write_text(saved)


def test_ciphertext_not_the_receipts_is_refused(env: Env) -> None:
    body, _, _ = _body(env, DecryptTarget(env.receipt, env.blob))
    other = bytearray(env.blob)
    other[-1] ^= 1
    body["target"]["ciphertext"] = base64.b64encode(bytes(other)).decode()
    _refused(env.client.post("/v1/decrypt", json=body), 400, "bad_request")


def test_receipt_not_under_the_challenge_is_refused(env: Env) -> None:
    # a genuine envelope of the epoch, but another receipt (other issuedAt): not disputed by c1
    other = replace(env.receipt, issued_at=env.receipt.issued_at + 1)
    body, _, _ = _body(env, DecryptTarget(other, env.blob))
    _refused(env.client.post("/v1/decrypt", json=body), 403, "not_committee_member")


def test_receipt_of_another_epoch_is_refused(env: Env) -> None:
    other = _receipt(env.blob, epoch=2)
    body, _, _ = _body(env, DecryptTarget(other, env.blob))
    _refused(env.client.post("/v1/decrypt", json=body), 400, "bad_request")


def test_wrong_endpoint_and_share_release_are_refused(env: Env) -> None:
    body, _, _ = _body(env, DecryptTarget(env.receipt, env.blob))
    _refused(env.client.post("/v1/release", json=body), 400, "bad_request")
    plain, _, _ = _body(env, None)
    _refused(env.client.post("/v1/decrypt", json=plain), 400, "bad_request")
    _refused(env.client.post("/v1/release", json=plain), 403, "threshold_epoch")


def test_decrypt_body_bound(env: Env) -> None:
    big = secrets.token_bytes(70 * 1024)
    r = env.client.post("/v1/decrypt", content=b'{"target": "' + big.hex().encode() + b'"}',
                        headers={"content-type": "application/json"})
    _refused(r, 413, "request_too_large")


def _assign(by: LocalAccount, receipt_hash: bytes, auditor: str,
            expires_at: int = 1_700_000_600) -> AuditAssignment:
    unsigned = AuditAssignment(receipt_hash, auditor.lower(), expires_at, b"")
    return replace(unsigned, signature=sign_eip191(by, unsigned.digest()))


def test_light_audit_needs_a_schedulers_assignment_of_that_receipt(env: Env) -> None:
    target = DecryptTarget(env.receipt, env.blob)
    rh = env.receipt.struct_hash
    other_rh = replace(env.receipt, issued_at=1).struct_hash
    outsider = Account.create()
    ok = [_assign(env.scheduler, rh, env.auditor.address),
          _assign(env.scheduler, rh, ANY_AUDITOR)]  # any registered verifier
    for a in ok:
        body, _, _ = _body(env, target, signer=env.auditor, purpose="light_audit", assignment=a)
        r = env.client.post("/v1/decrypt", json=body)
        assert r.status_code == 200, r.text
    bad = [None,  # self-chosen: no assignment at all
           _assign(env.auditor, rh, env.auditor.address),  # signed by the auditor itself
           _assign(env.scheduler, other_rh, env.auditor.address),  # another receipt
           _assign(env.scheduler, rh, env.member.address),  # another auditor
           _assign(env.scheduler, rh, env.auditor.address, expires_at=1_699_999_999)]
    for a in bad:
        body, _, _ = _body(env, target, signer=env.auditor, purpose="light_audit", assignment=a)
        _refused(env.client.post("/v1/decrypt", json=body), 403, "audit_not_assigned")
    # "any registered verifier" does not extend to an unregistered account
    body, _, _ = _body(env, target, signer=outsider, purpose="light_audit", assignment=ok[1])
    _refused(env.client.post("/v1/decrypt", json=body), 403, "audit_not_assigned")


def test_audit_job_carries_the_assignment_and_refuses_a_malformed_one(env: Env) -> None:
    from verinfer.receipts.eip712 import Domain, ReceiptSigner
    from verinfer.receipts.signed import SignedReceipt
    from verinfer.verifier.audit_stream import AuditJob
    from verinfer.verifier.errors import AuditJobError

    signed = SignedReceipt.sign(env.receipt, Domain(31337, "0x" + "c0" * 20),
                                ReceiptSigner(hashlib.sha256(b"op").digest()))
    a = _assign(env.scheduler, env.receipt.struct_hash, ANY_AUDITOR)
    job = AuditJob("j1", signed, "local:x", a)
    assert AuditJob.parse(job.fields()) == job
    assert AuditJob.parse(AuditJob("j2", signed, "local:x").fields()).assignment is None
    bad = {**job.fields(), "assignment": json.dumps({**a.to_json(), "expires_at": -1})}
    with pytest.raises(AuditJobError):
        AuditJob.parse(bad)
