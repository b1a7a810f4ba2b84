"""An operator answers a body that names model A by its id with the cheaper model B.

The attack: both models are on the allowlist; the client pins A by its id (``"model": "0x" +
sha256 of A's weights``, which the operator's API accepts), the operator runs B and signs a
receipt for B's ExecRequest. Verifiers judge conformance with the request rule applied with the
facts of the receipt's model (B), which read ``model`` only as "some string", so B's request
was the rule's request and the vote was ``match``: the cheat escaped. Who gains: the operator
(bills A, runs B). Fix: the request rule binds a ``model`` that is a model id to the model that
runs it (``verinfer.protocol.request_rule.check_model``); the real verifier job now votes
``request_nonconformant``. A served *name* stays the operator's label (docs/protocol.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.engine import Engine
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.errors import ModelNotFoundError
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.request_rule import exec_requests
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory
from verinfer.verifier.reexec import judge

SIGNER = ReceiptSigner(hashlib.sha256(b"model substitution adversary").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"model substitution epoch").digest(),
                              EnvelopeSuite.X25519)


@pytest.fixture(scope="module")
def other_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """Model B: the tiny model's shapes and tokenizer with other weights."""
    from verinfer.engine.loader import load_model
    from verinfer.engine.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("other") / "tiny-b.gguf", seed=1)
    eng = Engine(load_model(Path(path)), "invariant", max_seqs=4, max_batch_tokens=48)
    yield eng
    eng.close()


def _body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "which?"}],
                       "max_tokens": 5, "temperature": 0.7, "seed": 3},
                      separators=(",", ":")).encode()


def _serve_with(engine: Engine, body: bytes, planned: bytes | None = None) -> str:
    """``engine`` runs the rule's request for ``body`` as if it were the one named, signs it;
    the real verifier job (holding ``engine``) judges the receipt: its reason, prefixed with
    ``against:`` or ``for:``. ``planned``: the body the cheat plans with (the rule refuses
    ``body`` for the wrong model now, so it plans as if the body named a served name)."""
    request = exec_requests(planned or body, served_model(engine), prompt_tokenizer(engine))[0]
    gen = engine.generate(list(request.prompt_token_ids), request.sampling_params())
    factory = EvidenceFactory(engine, SIGNER, DOMAIN, key_epoch=2, epoch_public_key=PK,
                              now=lambda: 1_800_000_000)
    ev = factory._finish(body, request, ExecResult.from_generation(gen), gen.text)
    v = judge(engine, ev.signed.receipt, ev.blob, SK)
    assert v.agrees != (v.vote == INVALID_EVIDENCE)
    return ("for:" if v.agrees else "against:") + v.reason


def test_a_body_naming_model_a_by_id_served_by_model_b_is_nonconformant(
        tiny_engine: Engine, other_engine: Engine) -> None:
    assert tiny_engine.model_id != other_engine.model_id
    assert tiny_engine.tokenizer.hash == other_engine.tokenizer.hash  # only the weights differ
    body = _body(to_hex(tiny_engine.model_id))
    assert _serve_with(other_engine, body, planned=_body("tiny")) == \
        "against:request_nonconformant"


def test_the_honest_model_for_an_id_still_matches(tiny_engine: Engine) -> None:
    for spelling in (to_hex(tiny_engine.model_id), to_hex(tiny_engine.model_id).upper()
                     .replace("0X", "0x")):
        assert _serve_with(tiny_engine, _body(spelling)) == "for:match"


def test_the_rule_refuses_the_other_model_by_name(tiny_engine: Engine,
                                                  other_engine: Engine) -> None:
    body = _body(to_hex(tiny_engine.model_id))
    with pytest.raises(ModelNotFoundError) as e:
        exec_requests(body, served_model(other_engine), prompt_tokenizer(other_engine))
    assert e.value.param == "model"


def test_a_served_name_is_not_bound(tiny_engine: Engine, other_engine: Engine) -> None:
    """By design (docs/protocol.md): a name is the operator's label, so either model may answer
    it; a client that needs the weights pinned names the id, or checks
    ``verification.exec_request.model_id`` itself."""
    assert _serve_with(other_engine, _body("tiny")) == "for:match"
