"""Issue 32 finding 1: one receipt must not decrypt another envelope. Five real shard
processes (t = 2 of n = 3, P-256 per-receipt epoch).

Attack 1 (victim E): a colluding operator publishes receipt X whose blob carries a victim
envelope's encapsulated key E_v (with the victim's proof of knowledge, the best it has) in
front of its own ciphertext; challenge X is open and a colluding committee member asks every
shard to decrypt X. Shards used to compute s_i·E_v from the operator-written blob: t
partials gave s·E_v, which opens the victim's envelope, and every release log named only X.
Now every shard checks the sealer's proof of knowledge of log_G(E), bound to the envelope and
its receipt binding, first: all of them refuse (encapsulation_proof_invalid) and log it under X.

Attack 2 (own E reused): an operator that keeps its ephemeral key proves it again for a second
envelope; a shard that decrypted envelope A for E refuses B with the same E
(encapsulation_reused, durable set of released E), and the runner reports t such refusals as
the operator's fault (ReusedEncapsulationError), so reusing E cannot make a challenged receipt
undecidable."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from eth_account import Account
from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.enclave.errors import KeyReleaseError
from verinfer.enclave.runner import AccountSigner, EnclaveRunner
from verinfer.kms import tdh
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses, provision
from verinfer.kms.protocol import (
    TRANSPORT_SUITE,
    DecryptTarget,
    Release,
    ReleaseRequest,
    dleq_context,
    partial_info,
    report_data,
    requester_digest,
)
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Receipt, address_of
from verinfer.receipts.envelope import (
    HEADER_LEN,
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    envelope_header,
    seal,
    split_envelope,
)
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPublicKey, load_public_key
from verinfer.receipts.errors import EnvelopeDecryptionError, ReusedEncapsulationError

P256 = EnvelopeSuite.P256
ARGS = ("sha256:" + "3a" * 32, "code-v1", "engine-fp")
M = measurement(*ARGS)
VICTIM_OP = address_of(hashlib.sha256(b"victim operator").digest())
EVIL_OP = address_of(hashlib.sha256(b"colluding operator").digest())
RES = ExecResult(output_token_ids=(4, 5), finish_reason="length", logit_digest=bytes(32),
                 text_sha256=hashlib.sha256(b"ab").digest())
E_LEN, PROOF_LEN = 65, 64


def _request(seed: int) -> ExecRequest:
    return ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32),
                       engine_fingerprint="{}", prompt_token_ids=(1, 2, seed), max_tokens=8,
                       temperature=0.0, top_k=0, top_p=1.0, stop=(), seed=seed,
                       ignore_eos=False)


def _binding(op: str, seed: int) -> EnvelopeBinding:
    return EnvelopeBinding.for_execution(operator=op, chain_id=31337, key_epoch=1,
                                         request=_request(seed), result=RES)


def _contents(seed: int) -> EnvelopeContents:
    return EnvelopeContents(_request(seed), RES, b'{"private prompt": %d}' % seed, b"{}")


def _receipt(b: EnvelopeBinding, blob: bytes) -> Receipt:
    return Receipt(operator=b.operator, chain_id=b.chain_id, model_id=b.model_id,
                   engine_fingerprint_hash=b.engine_fingerprint_hash, req_hash=b.req_hash,
                   out_hash=b.out_hash, key_epoch=1, ciphertext_hash=ciphertext_hash(blob),
                   issued_at=1_700_000_000)


def _seal_reusing(eph: ec.EllipticCurvePrivateKey, pk: EpochPublicKey, seed: int) -> bytes:
    """An operator that keeps its ephemeral key: RFC 9180 with ``eph`` and a genuine proof."""
    from verinfer.receipts import encapsulation as enc_mod
    from verinfer.receipts.envelope import pok_context

    b = _binding(EVIL_OP, seed)
    enc = eph.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    info = b.info(P256)
    ks = enc_mod.key_schedule(enc_mod.kem_shared_secret(eph.exchange(ec.ECDH(), pk.hpke), enc,
                                                        pk.raw), info, enc_mod.AEAD_AES128GCM)
    ct = enc_mod.aead_seal(ks, enc_mod.AEAD_AES128GCM, 0, b"", _contents(seed).to_bytes())
    header = envelope_header(P256, 1)
    return header + enc + enc_mod.prove_encapsulation(eph, pok_context(header, info, ct)) + ct


@dataclass
class World:
    lay: ClusterLayout
    pk: EpochPublicKey
    victim: tuple[Receipt, bytes]
    x: tuple[Receipt, bytes]
    members: dict[str, LocalAccount]

    def runner(self, who: LocalAccount, shards: slice = slice(None)) -> EnclaveRunner:
        return EnclaveRunner(
            attester=SoftwareAttester(load_root_private(self.lay.root_key), M, time.time),
            shards=self.lay.shards_info()[shards], epochs=FileEpochRegistry(self.lay.registry),
            signer=AccountSigner(who))

    def challenge(self, cid: str, receipt: Receipt) -> LocalAccount:
        """Open challenge ``cid`` on ``receipt`` with a fresh committee member (the shards
        re-read the committee file on every request)."""
        self.members[cid] = who = Account.create()
        raw = json.loads(self.lay.committee.read_text())
        raw["verifiers"].append(who.address)
        raw["challenges"][cid] = {"status": "open", "committee": [who.address],
                                  "receipt_hash": "0x" + receipt.struct_hash.hex()}
        self.lay.committee.write_text(json.dumps(raw))
        return who


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    lay = provision(tmp_path_factory.mktemp("kms-foreign-e"), epoch=1, threshold=2, shares=3,
                    measurements=[M], suite=P256.value, unsafe_single_tree=True)
    pk = load_public_key(P256, FileEpochRegistry(lay.registry).get(1).public_key_bytes)
    # the victim: another operator's envelope, on DA for anyone to read; nobody challenged it
    vb = _binding(VICTIM_OP, 1)
    v_blob = seal(_contents(1), vb, pk)
    # X: the colluding operator's blob = E_v and the victim's proof in front of its own
    # ciphertext, in the layout of the code under test (header || E || proof || ct; before
    # the proof existed the old reader took E the same way, from the 65 bytes after the header)
    own = seal(_contents(7), _binding(EVIL_OP, 7), pk)
    x_blob = (envelope_header(P256, 1) + v_blob[HEADER_LEN:HEADER_LEN + E_LEN + PROOF_LEN]
              + own[HEADER_LEN + E_LEN + PROOF_LEN:])
    w = World(lay, pk, (_receipt(vb, v_blob), v_blob),
              (_receipt(_binding(EVIL_OP, 7), x_blob), x_blob), {})
    lay.committee.write_text(json.dumps({"verifiers": [], "challenges": {}}))
    w.challenge("cX", w.x[0])
    with ShardProcesses(lay, extra_args=["--rate-capacity", "100"]) as procs:
        procs.start()
        yield w


def test_victim_encapsulated_key_in_another_receipt_is_refused_by_every_shard(
        world: World) -> None:
    receipt_x, blob_x = world.x
    # The member bypasses its own runner's checks: a hand-built, attested, signed request.
    shards = world.lay.shards_info()
    eph = X25519PrivateKey.generate()
    enclave_pub = eph.public_key().public_bytes_raw()
    signer = AccountSigner(world.members["cX"])
    target = DecryptTarget(receipt_x, blob_x)
    answers: dict[int, httpx.Response] = {}
    with httpx.Client(timeout=30) as http:
        nonces = {s.index: bytes.fromhex(http.post(f"{s.url}/v1/nonce").json()["nonce"][2:])
                  for s in shards}
        rd = report_data(epoch=1, purpose="full_challenge", challenge_id="cX",
                         requester=signer.address, enclave_public_key=enclave_pub,
                         nonces=nonces, target=target)
        req = ReleaseRequest(epoch=1, purpose="full_challenge", challenge_id="cX",
                             requester=signer.address,
                             requester_signature=signer.sign(requester_digest(rd)),
                             enclave_public_key=enclave_pub, nonces=nonces, target=target,
                             quote=SoftwareAttester(load_root_private(world.lay.root_key), M,
                                                    time.time).quote(rd))
        for s in shards:
            answers[s.index] = http.post(f"{s.url}/v1/decrypt", json=req.to_json())
    # What the attack yields where shards answer: s·E_v from t partials opens the victim.
    receipt_v, blob_v = world.victim
    _, e_v, ct_v = split_envelope(blob_v, receipt_v, P256)
    record = FileEpochRegistry(world.lay.registry).get(1)
    cpts = tdh.parse_commitments(record.commitment_bytes, record.threshold)
    partials = {}
    for idx, r in answers.items():
        if r.status_code == 200:
            raw = TRANSPORT_SUITE.decrypt(Release.from_json(r.json()).encrypted_share, eph,
                                          info=partial_info(1, idx, rd))
            partials[idx] = tdh.verify_partial(raw, index=idx, enc=e_v,
                                               verification=tdh.verification_key(cpts, idx),
                                               context=dleq_context(rd, idx))
    if len(partials) >= record.threshold:
        leaked = tdh.open_single_shot(tdh.combine(partials, record.threshold), e_v,
                                      record.public_key_bytes,
                                      _binding(VICTIM_OP, 1).info(P256), ct_v)
        pytest.fail(f"shards {sorted(partials)} answered s_i·E_victim for receipt X: the "
                    f"victim's envelope opened ({leaked[:60]!r}…)")
    got = {i: (r.status_code, r.json()["error"]["reason"]) for i, r in answers.items()}
    assert got == {i: (400, "encapsulation_proof_invalid") for i in range(1, 4)}, got
    # each shard's log records the refusal under the receipt that was asked for
    for i in range(1, 4):
        entries = [json.loads(x) for x in world.lay.release_log(i).read_text().splitlines()]
        assert any(e["decision"] == "refused" and e["reason"] == "encapsulation_proof_invalid"
                   and e["receipt_hash"] == receipt_x.struct_hash.hex() for e in entries), i
    # an honest member's runner refuses it before asking anyone: the operator's fault (a vote)
    with pytest.raises(EnvelopeDecryptionError):
        world.runner(world.members["cX"]).open_receipt(receipt=receipt_x, ciphertext=blob_x,
                                                  purpose="full_challenge", challenge_id="cX")


def test_sealer_reusing_its_own_encapsulated_key_is_refused_and_blamed(world: World) -> None:
    """A and B share E, both with valid proofs. Each shard answers for E with one envelope only
    — whichever it was asked for first — and t ``encapsulation_reused`` refusals (so at least
    one honest shard's) make the runner blame the sealer: reusing E cannot leave a challenged
    receipt undecidable. (The set is per shard: with n >= 2t a reused E could still reach t
    shards that never answered for it; docs/kms.md §8.)"""
    eph = ec.generate_private_key(ec.SECP256R1())
    a_blob, b_blob = _seal_reusing(eph, world.pk, 2), _seal_reusing(eph, world.pk, 3)
    receipt_a, receipt_b = (_receipt(_binding(EVIL_OP, 2), a_blob),
                            _receipt(_binding(EVIL_OP, 3), b_blob))
    member_a, member_b = world.challenge("cA", receipt_a), world.challenge("cB", receipt_b)

    def open_b(shards: slice) -> None:
        world.runner(member_b, shards).open_receipt(
            receipt=receipt_b, ciphertext=b_blob, purpose="full_challenge", challenge_id="cB")

    opened = world.runner(member_a, slice(0, 2)).open_receipt(
        receipt=receipt_a, ciphertext=a_blob, purpose="full_challenge", challenge_id="cA")
    assert opened.contents == _contents(2) and opened.shards_used == [1, 2]
    # shards 2 and 3: shard 2 answered A and refuses; shard 3 had not, and answers B. One
    # refusal is no evidence (a single shard could lie): a KMS refusal, retried, not a vote.
    with pytest.raises(KeyReleaseError) as ei:
        open_b(slice(1, 3))
    assert ei.value.refusals == {2: "encapsulation_reused"}
    # all three: shards 1 and 2 refuse (t of them), so the sealer is to blame
    with pytest.raises(ReusedEncapsulationError, match=r"shards \[1, 2\]"):
        open_b(slice(None))
    # shard 3, which answered B, now refuses A in turn
    with pytest.raises(KeyReleaseError) as ei:
        world.runner(member_a, slice(1, 3)).open_receipt(
            receipt=receipt_a, ciphertext=a_blob, purpose="full_challenge", challenge_id="cA")
    assert ei.value.refusals == {3: "encapsulation_reused"}
