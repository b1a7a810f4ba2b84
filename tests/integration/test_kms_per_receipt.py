"""Per-receipt threshold decryption against five real shard processes (t = 3, P-256 epoch):
a committee member of challenge A opens receipt A and nothing else, a light auditor only its
assigned receipt, share releases of the epoch are refused, a shard whose share is corrupt is
named and excluded, fewer than t shards give nothing; the release logs name receipts."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.enclave.errors import EnclaveError, KeyReleaseError
from verinfer.enclave.runner import AccountSigner, EnclaveRunner
from verinfer.kms import tdh
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.keygen import share_label, share_path
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses, provision
from verinfer.kms.protocol import ReleaseRequest, report_data, requester_digest
from verinfer.kms.sealing import load_seal_key, write_sealed
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Receipt, address_of
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, ciphertext_hash, seal
from verinfer.receipts.epoch_keys import EnvelopeSuite, load_public_key
from verinfer.receipts.errors import EnvelopeDecryptionError

ARGS = ("sha256:" + "44" * 32, "code-v1", "engine-fp")
M = measurement(*ARGS)
OPERATOR = address_of(hashlib.sha256(b"op").digest())
RES = ExecResult(output_token_ids=(4, 5), finish_reason="length", logit_digest=bytes(32),
                 text_sha256=hashlib.sha256(b"ab").digest())
CORRUPT = 2


def _request(seed: int) -> ExecRequest:
    return ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32),
                       engine_fingerprint="{}", prompt_token_ids=(1, 2, seed), max_tokens=8,
                       temperature=0.0, top_k=0, top_p=1.0, stop=(), seed=seed,
                       ignore_eos=False)


@dataclass
class Sealed:
    receipt: Receipt
    blob: bytes
    contents: EnvelopeContents

    @property
    def digest(self) -> bytes:
        return self.receipt.struct_hash


def _seal(pk_raw: bytes, seed: int) -> Sealed:
    req = _request(seed)
    contents = EnvelopeContents(req, RES, b'{"secret prompt": %d}' % seed, b'{"choices":[]}')
    binding = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=31337, key_epoch=1,
                                            request=req, result=RES)
    blob = seal(contents, binding, load_public_key(EnvelopeSuite.P256, pk_raw))
    receipt = Receipt(operator=OPERATOR, chain_id=31337, model_id=req.model_id,
                      engine_fingerprint_hash=req.engine_fingerprint_hash, req_hash=req.hash,
                      out_hash=RES.hash, key_epoch=1, ciphertext_hash=ciphertext_hash(blob),
                      issued_at=1_700_000_000)
    return Sealed(receipt, blob, contents)


@dataclass
class Cluster:
    lay: ClusterLayout
    procs: ShardProcesses
    a: Sealed
    b: Sealed
    member_a: LocalAccount
    auditor_b: LocalAccount

    def runner(self, who: LocalAccount, shards: int = 5) -> EnclaveRunner:
        return EnclaveRunner(
            attester=SoftwareAttester(load_root_private(self.lay.root_key), M, time.time),
            shards=self.lay.shards_info()[:shards], epochs=FileEpochRegistry(self.lay.registry),
            signer=AccountSigner(who))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    member_a, member_b, auditor_b = Account.create(), Account.create(), Account.create()
    root = tmp_path_factory.mktemp("kms-per-receipt")
    # Receipts are sealed to the epoch's public key, so the committee file is written after
    # keygen: provision once, then rewrite committee.json with the receipts' digests.
    lay = provision(root, epoch=1, threshold=3, shares=5, measurements=[M],
                    suite=EnvelopeSuite.P256.value, unsafe_single_tree=True)
    pk = FileEpochRegistry(lay.registry).get(1).public_key_bytes
    a, b = _seal(pk, 1), _seal(pk, 2)
    lay.committee.write_text(json.dumps({
        "verifiers": [member_a.address, member_b.address, auditor_b.address],
        "challenges": {
            "cA": {"status": "open", "committee": [member_a.address],
                   "receipt_hash": "0x" + a.digest.hex()},
            "cB": {"status": "open", "committee": [member_b.address],
                   "receipt_hash": "0x" + b.digest.hex()}},
        "audits": {auditor_b.address: ["0x" + b.digest.hex()]}}))
    # Shard 2 holds a wrong share (a valid scalar, sealed properly): its D_i carries a valid
    # proof for *that* scalar, which the Feldman verification key of shard 2 exposes.
    write_sealed(share_path(lay.data_dir(CORRUPT), 1), load_seal_key(lay.seal_key_file(CORRUPT)),
                 (secrets.randbelow(tdh.N - 1) + 1).to_bytes(32, "big"),
                 share_label(1, CORRUPT))
    with ShardProcesses(lay, extra_args=["--rate-capacity", "100"]) as procs:
        procs.start()
        yield Cluster(lay, procs, a, b, member_a, auditor_b)


def test_member_of_challenge_a_opens_receipt_a_and_the_bad_shard_is_named(
        cluster: Cluster) -> None:
    got = cluster.runner(cluster.member_a).open_receipt(
        receipt=cluster.a.receipt, ciphertext=cluster.a.blob,
        purpose="full_challenge", challenge_id="cA")
    assert got.contents == cluster.a.contents
    assert got.corrupt_shards == [CORRUPT]
    assert CORRUPT not in got.shards_used and len(got.shards_used) == 3
    assert got.refusals[CORRUPT].startswith("share_verification_failed")


def test_member_of_challenge_a_gets_nothing_for_receipt_b(cluster: Cluster) -> None:
    runner = cluster.runner(cluster.member_a)
    for cid in ("cA", "cB"):  # B under A's challenge; B under B's (not a member)
        with pytest.raises(KeyReleaseError) as ei:
            runner.open_receipt(receipt=cluster.b.receipt,
                                ciphertext=cluster.b.blob, purpose="full_challenge",
                                challenge_id=cid)
        assert set(ei.value.refusals.values()) == {"not_committee_member"}
    # A's receipt with B's ciphertext: refused before any shard is asked
    with pytest.raises(EnvelopeDecryptionError):
        runner.open_receipt(receipt=cluster.a.receipt, ciphertext=cluster.b.blob,
                            purpose="full_challenge", challenge_id="cA")


def test_light_auditor_gets_only_its_assigned_receipt(cluster: Cluster) -> None:
    runner = cluster.runner(cluster.auditor_b)
    got = runner.open_receipt(receipt=cluster.b.receipt,
                              ciphertext=cluster.b.blob, purpose="light_audit",
                              challenge_id="audit")
    assert got.contents == cluster.b.contents
    with pytest.raises(KeyReleaseError) as ei:
        runner.open_receipt(receipt=cluster.a.receipt,
                            ciphertext=cluster.a.blob, purpose="light_audit",
                            challenge_id="audit")
    assert set(ei.value.refusals.values()) == {"audit_not_assigned"}


def test_t_minus_1_shards_give_nothing(cluster: Cluster) -> None:
    with pytest.raises(KeyReleaseError):
        cluster.runner(cluster.member_a, shards=2).open_receipt(
            receipt=cluster.a.receipt, ciphertext=cluster.a.blob,
            purpose="full_challenge", challenge_id="cA")


def test_share_release_of_a_threshold_epoch_is_refused_by_every_shard(cluster: Cluster) -> None:
    runner = cluster.runner(cluster.member_a)
    with pytest.raises(EnclaveError):
        runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="cA")
    # Past the runner's own guard: a hand-built, properly attested and signed share request.
    shards = cluster.lay.shards_info()
    with httpx.Client(timeout=10) as http:
        nonces = {s.index: bytes.fromhex(http.post(f"{s.url}/v1/nonce").json()["nonce"][2:])
                  for s in shards}
        enclave_pub = secrets.token_bytes(32)
        signer = AccountSigner(cluster.member_a)
        rd = report_data(epoch=1, purpose="full_challenge", challenge_id="cA",
                         requester=signer.address, enclave_public_key=enclave_pub, nonces=nonces)
        req = ReleaseRequest(epoch=1, purpose="full_challenge", challenge_id="cA",
                             requester=signer.address,
                             requester_signature=signer.sign(requester_digest(rd)),
                             enclave_public_key=enclave_pub, nonces=nonces,
                             quote=SoftwareAttester(load_root_private(cluster.lay.root_key), M,
                                                    time.time).quote(rd))
        for s in shards:
            r = http.post(f"{s.url}/v1/release", json=req.to_json())
            assert r.status_code == 403 and r.json()["error"]["reason"] == "threshold_epoch"


def test_release_logs_name_receipts(cluster: Cluster) -> None:
    test_member_of_challenge_a_opens_receipt_a_and_the_bad_shard_is_named(cluster)
    entries = [json.loads(line) for i in range(1, 6)
               for line in cluster.lay.release_log(i).read_text().splitlines()]
    released = [e for e in entries if e["decision"] == "released"]
    assert released and all(e["receipt_hash"] in (cluster.a.digest.hex(),
                                                    cluster.b.digest.hex())
                            for e in released)
