"""One response end to end on the real tiny engine: request -> execution -> envelope ->
signed receipt -> Merkle batch; then an auditor opens the envelope, re-executes, and votes."""

from __future__ import annotations

import hashlib
import json

from support.engine_requests import exec_request_for
from verinfer.engine.engine import Engine
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.envelope import (
    EnvelopeBinding,
    EnvelopeContents,
    ciphertext_hash,
    open_envelope,
    seal,
)
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.receipts.merkle import build_tree, verify_proof
from verinfer.receipts.signed import SignedReceipt

SIGNER = ReceiptSigner(hashlib.sha256(b"pipeline operator").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
EPOCH_SEED = hashlib.sha256(b"epoch 7").digest()


def test_serve_then_audit(tiny_engine: Engine) -> None:
    # operator side
    _, epoch_pk = derive_epoch_keypair(EPOCH_SEED, EnvelopeSuite.MLKEM768_X25519)
    params = SamplingParams(max_tokens=5, temperature=0.9, seed=11)
    prompt = [3, 9, 27, 81]
    req = exec_request_for(tiny_engine, prompt, params)
    res = ExecResult.from_generation(tiny_engine.generate(prompt, params))
    body_in = json.dumps({"model": "tiny", "prompt": prompt}).encode()
    body_out = json.dumps({"tokens": list(res.output_token_ids)}).encode()
    binding = EnvelopeBinding.for_execution(operator=SIGNER.address, chain_id=31337,
                                            key_epoch=7, request=req, result=res)
    blob = seal(EnvelopeContents(req, res, body_in, body_out), binding, epoch_pk)
    receipt = Receipt.create(operator=SIGNER.address, chain_id=31337, model_id=req.model_id,
                             engine_fingerprint_hash=req.engine_fingerprint_hash,
                             req_hash=req.hash, out_hash=res.hash, key_epoch=7,
                             ciphertext_hash=ciphertext_hash(blob), now=lambda: 1_800_000_000)
    signed = SignedReceipt.sign(receipt, DOMAIN, SIGNER)
    others = [hashlib.sha256(bytes([i])).digest() for i in range(6)]
    batch = build_tree([*others[:3], signed.digest, *others[3:]])
    proof = batch.proof(3)

    # auditor side: only the published JSON, the blob, the proof and the epoch seed
    got = SignedReceipt.from_json(json.loads(json.dumps(signed.to_json())))
    assert got.verify(SIGNER.address) == SIGNER.address
    assert verify_proof(got.digest, proof, batch.root)
    epoch_sk, _ = derive_epoch_keypair(EPOCH_SEED, EnvelopeSuite.MLKEM768_X25519)
    contents = open_envelope(blob, got.receipt, epoch_sk)
    assert contents.request_body == body_in
    again = contents.request
    vote = ExecResult.from_generation(
        tiny_engine.generate(list(again.prompt_token_ids), again.sampling_params()))
    assert vote.hash == got.receipt.out_hash  # honest operator: the committee dismisses

    # a lying operator (claims other output tokens) is caught by the same vote
    lie = ExecResult(output_token_ids=(*res.output_token_ids[:-1],
                                       (res.output_token_ids[-1] + 1) % 64),
                     finish_reason=res.finish_reason, logit_digest=res.logit_digest,
                     text_sha256=res.text_sha256)
    assert vote.hash != lie.hash
