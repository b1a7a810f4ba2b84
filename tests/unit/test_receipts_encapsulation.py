"""P256 envelopes carry a proof of knowledge of e = log_G(E) bound to their receipt binding
(receipts/encapsulation.py, envelope.py): valid proofs verify and the envelope is still plain
RFC 9180 (cryptography's HPKE opens enc || ct); a foreign E copied with its proof into another
receipt's blob, a replayed E with another ciphertext, malformed bytes and the identity point
are refused with typed errors; the shard's durable set refuses a sealer's reuse of its own E."""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from verinfer.kms.encapsulations import ReleasedEncapsulations
from verinfer.kms.errors import EncapsulationReusedError, EncapsulationStoreError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts import encapsulation
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Receipt, address_of
from verinfer.receipts.envelope import (
    HEADER_LEN,
    MAGIC,
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    envelope_header,
    open_envelope,
    pok_context,
    seal,
    split_envelope,
)
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.receipts.errors import (
    EncapsulationMalformedError,
    EncapsulationProofError,
    EnvelopeDecryptionError,
)

P256 = EnvelopeSuite.P256
SK, PK = derive_epoch_keypair((12345).to_bytes(32, "big"), P256)
RES = ExecResult(output_token_ids=(4, 5), finish_reason="length", logit_digest=bytes(32),
                 text_sha256=hashlib.sha256(b"ab").digest())
ENC = slice(HEADER_LEN, HEADER_LEN + encapsulation.ENC_LEN)
PROOF = slice(ENC.stop, ENC.stop + encapsulation.PROOF_LEN)


def _req(seed: int) -> ExecRequest:
    return ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32),
                       engine_fingerprint="{}", prompt_token_ids=(1, 2, seed), max_tokens=8,
                       temperature=0.0, top_k=0, top_p=1.0, stop=(), seed=seed,
                       ignore_eos=False)


def _binding(seed: int, operator: bytes = b"op") -> EnvelopeBinding:
    return EnvelopeBinding.for_execution(operator=address_of(hashlib.sha256(operator).digest()),
                                         chain_id=31337, key_epoch=1, request=_req(seed),
                                         result=RES)


def _contents(seed: int) -> EnvelopeContents:
    return EnvelopeContents(_req(seed), RES, b'{"secret": %d}' % seed, b"{}")


def _receipt(b: EnvelopeBinding, blob: bytes) -> Receipt:
    return Receipt(operator=b.operator, chain_id=b.chain_id, model_id=b.model_id,
                   engine_fingerprint_hash=b.engine_fingerprint_hash, req_hash=b.req_hash,
                   out_hash=b.out_hash, key_epoch=b.key_epoch,
                   ciphertext_hash=ciphertext_hash(blob), issued_at=1_700_000_000)


def _seal_with(eph: ec.EllipticCurvePrivateKey, plaintext: bytes, b: EnvelopeBinding) -> bytes:
    """What a sealer that keeps (and reuses) its ephemeral key writes: RFC 9180 with ``eph``,
    and a genuine proof for this envelope's context."""
    enc = eph.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    info = b.info(P256)
    ks = encapsulation.key_schedule(
        encapsulation.kem_shared_secret(eph.exchange(ec.ECDH(), PK.hpke), enc, PK.raw), info,
        encapsulation.AEAD_AES128GCM)
    ct = encapsulation.aead_seal(ks, encapsulation.AEAD_AES128GCM, 0, b"", plaintext)
    header = envelope_header(P256, 1)
    proof = encapsulation.prove_encapsulation(eph, pok_context(header, info, ct))
    return header + enc + proof + ct


def test_valid_proof_and_the_envelope_is_still_rfc9180() -> None:
    b = _binding(1)
    blob = seal(_contents(1), b, PK)
    receipt = _receipt(b, blob)
    assert blob[:4] == b"VIE\x02" and blob[4] == 3  # P256 envelopes are format version 2
    got_b, enc, ct = split_envelope(blob, receipt, P256)
    assert enc == blob[ENC] and ct == blob[PROOF.stop:] and got_b == b
    assert open_envelope(blob, receipt, SK) == _contents(1)
    # enc || ct is what any RFC 9180 implementation opens
    suite = hpke.Suite(hpke.KEM.P256, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)
    assert EnvelopeContents.from_bytes(suite.decrypt(enc + ct, SK.hpke, b.info(P256))) \
        == _contents(1)


def test_foreign_e_with_its_proof_under_another_receipt_is_refused() -> None:
    """The attack: an operator copies a victim envelope's E and proof into its own receipt's
    blob (its own ciphertext, or the victim's). The proof is bound to the victim's context."""
    victim = seal(_contents(1), _binding(1), PK)
    e_v, proof_v, ct_v = victim[ENC], victim[PROOF], victim[PROOF.stop:]
    for attacker, ct in ((_binding(7, b"evil"), seal(_contents(7), _binding(7, b"evil"), PK)
                          [PROOF.stop:]),
                         (_binding(7, b"evil"), ct_v),  # the victim's own ciphertext too
                         (_binding(1, b"evil"), ct_v),  # same request, other operator
                         (_binding(2), ct_v)):  # same operator, other request
        blob = envelope_header(P256, 1) + e_v + proof_v + ct
        with pytest.raises(EncapsulationProofError):
            split_envelope(blob, _receipt(attacker, blob), P256)
        with pytest.raises(EnvelopeDecryptionError):  # the same error family for the judge
            open_envelope(blob, _receipt(attacker, blob), SK)


def test_replayed_e_with_another_ciphertext_is_refused_by_the_proof() -> None:
    b = _binding(1)
    blob = seal(_contents(1), b, PK)
    other_ct = seal(_contents(1), b, PK)[PROOF.stop:]  # same binding, other ciphertext
    forged = blob[:PROOF.stop] + other_ct
    with pytest.raises(EncapsulationProofError):
        split_envelope(forged, _receipt(b, forged), P256)


def test_a_sealer_reusing_its_own_e_passes_the_proof_and_is_refused_by_the_shard_set(
        tmp_path: Path) -> None:
    """Whoever knows e can prove it for a second envelope (the proof cannot stop that), so the
    shards keep a durable set: E answers for one envelope only."""
    eph = ec.generate_private_key(ec.SECP256R1())
    a = _seal_with(eph, _contents(1).to_bytes(), _binding(1))
    b = _seal_with(eph, _contents(2).to_bytes(), _binding(2))
    _, enc_a, _ = split_envelope(a, _receipt(_binding(1), a), P256)
    _, enc_b, _ = split_envelope(b, _receipt(_binding(2), b), P256)
    assert enc_a == enc_b
    store = ReleasedEncapsulations(tmp_path / "released.jsonl")
    store.claim(1, enc_a, ciphertext_hash(a))
    store.claim(1, enc_a, ciphertext_hash(a))  # the same envelope again: not a reuse
    with pytest.raises(EncapsulationReusedError):
        store.claim(1, enc_b, ciphertext_hash(b))
    store.claim(2, enc_b, ciphertext_hash(b))  # another epoch's key: s2·E opens nothing of 1
    # durable: a restarted shard still refuses, and a torn last line is dropped
    with open(tmp_path / "released.jsonl", "ab") as f:
        f.write(b'{"epoch": 1, "enc": "0x04')
    again = ReleasedEncapsulations(tmp_path / "released.jsonl")
    assert len(again) == 2
    with pytest.raises(EncapsulationReusedError):
        again.claim(1, enc_b, ciphertext_hash(b))
    again.claim(3, enc_b, ciphertext_hash(b))
    lines = (tmp_path / "released.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2, 3]


def test_a_corrupt_store_is_the_shards_own_error(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text('{"epoch": 1, "enc": "0x00"}\n')
    with pytest.raises(EncapsulationStoreError):
        ReleasedEncapsulations(tmp_path / "r.jsonl")


@pytest.mark.parametrize("what", ["short proof", "c >= n", "z >= n", "flipped z",
                                  "compressed E", "off-curve E", "x >= p", "zero proof"])
def test_malformed_proof_or_e_is_a_typed_error(what: str) -> None:
    b = _binding(1)
    blob = seal(_contents(1), b, PK)
    enc, proof = bytearray(blob[ENC]), bytearray(blob[PROOF])
    n_bytes = encapsulation.N.to_bytes(32, "big")
    want: type[Exception] = EncapsulationMalformedError
    if what == "short proof":
        with pytest.raises(EncapsulationMalformedError):
            encapsulation.verify_encapsulation(bytes(enc), bytes(proof[:63]), b"ctx")
        return
    if what == "c >= n":
        proof[:32] = n_bytes
    elif what == "z >= n":
        proof[32:] = b"\xff" * 32
    elif what == "flipped z":
        proof[-1] ^= 1
        want = EncapsulationProofError
    elif what == "compressed E":
        enc = bytearray(b"\x02" + enc[1:33] + enc[1:33])
    elif what == "off-curve E":
        enc[-1] ^= 1
    elif what == "x >= p":
        enc[1:33] = b"\xff" * 32
    elif what == "zero proof":
        proof[:] = bytes(64)
        want = EncapsulationProofError
    bad = blob[:HEADER_LEN] + bytes(enc) + bytes(proof) + blob[PROOF.stop:]
    with pytest.raises(want):
        split_envelope(bad, _receipt(b, bad), P256)


def test_identity_e_is_refused_even_with_a_proof_that_would_verify() -> None:
    """For E = O the equation z·G − c·O = A holds for any c: a 'proof' is trivial to make,
    and every s_i·O is O. The identity is refused as a point before any proof is looked at."""
    identity = b"\x04" + bytes(64)
    b = _binding(1)
    header, info, ct = envelope_header(P256, 1), b.info(P256), b"\x00" * 40
    k = secrets.randbelow(encapsulation.N - 1) + 1
    a = ec.derive_private_key(k, ec.SECP256R1()).public_key().public_bytes(
        Encoding.X962, PublicFormat.UncompressedPoint)
    c = encapsulation._challenge(identity, a, pok_context(header, info, ct))
    proof = c.to_bytes(32, "big") + k.to_bytes(32, "big")
    blob = header + identity + proof + ct
    with pytest.raises(EncapsulationMalformedError, match="infinity"):
        split_envelope(blob, _receipt(b, blob), P256)


def test_version_1_p256_blobs_without_a_proof_are_not_read() -> None:
    b = _binding(1)
    blob = seal(_contents(1), b, PK)
    # the pre-proof layout: VIE\x01, suite 3, epoch, enc || ct (what the old seal wrote)
    old = MAGIC + blob[4:HEADER_LEN] + blob[ENC] + blob[PROOF.stop:]
    with pytest.raises(EnvelopeDecryptionError):
        split_envelope(old, _receipt(b, old), P256)
    with pytest.raises(EnvelopeDecryptionError):
        open_envelope(old, _receipt(b, old), SK)
