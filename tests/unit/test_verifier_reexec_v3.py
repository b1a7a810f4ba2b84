"""The re-execution job on vi-sample-v3 receipts (tiny engine): an honest answer under a
grammar, penalties and logit_bias is confirmed by replay alone; an answer drawn without them
(JSON that violates the request's schema) or with a token changed gets the honest outHash."""

from __future__ import annotations

import hashlib
import json

import pytest

from verinfer.engine.engine import Engine
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge

SIGNER = ReceiptSigner(hashlib.sha256(b"v3 verifier test operator").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"epoch 3 (v3)").digest(), EnvelopeSuite.X25519)
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
BODY = json.dumps({
    "model": "tiny", "messages": [{"role": "user", "content": "json please"}],
    "max_tokens": 40, "seed": 3, "temperature": 0.7, "presence_penalty": 0.5,
    "logit_bias": {"50": 2},
    "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
}, separators=(",", ":")).encode()


@pytest.fixture(scope="module")
def factory(tiny_engine: Engine) -> EvidenceFactory:
    return EvidenceFactory(tiny_engine, SIGNER, DOMAIN, key_epoch=3, epoch_public_key=PK,
                           now=lambda: 1_800_000_000)


def _honest_hash(engine: Engine) -> bytes:
    req = request_for_body(engine, BODY)
    assert req.sampler == "vi-sample-v3" and req.grammar is not None
    return ExecResult.from_generation(
        engine.generate(list(req.prompt_token_ids), req.sampling_params())).hash


def test_honest_v3_receipt_confirmed_by_replay(tiny_engine: Engine,
                                               factory: EvidenceFactory) -> None:
    ev = factory.honest(BODY)
    json.loads(ev.text)  # the grammar held
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "match" and v.agrees and v.decoded_tokens == 0


@pytest.mark.parametrize("cheat", ["dropped_v3_options", "tampered_tokens"])
def test_cheats_get_the_honest_out_hash(tiny_engine: Engine, factory: EvidenceFactory,
                                        cheat: str) -> None:
    ev = (factory.unsafe_dropped_v3_options(BODY) if cheat == "dropped_v3_options"
          else factory.unsafe_tampered_tokens(BODY))
    if cheat == "dropped_v3_options":
        with pytest.raises(ValueError):
            json.loads(ev.text)  # what the schema forbids
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "output_mismatch" and not v.agrees
    assert v.vote == _honest_hash(tiny_engine)
