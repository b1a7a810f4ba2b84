"""Attack on the verified client: a legacy completions *stream* whose text deltas are changed in
transit (an operator's front end inserting a link, an ad, other advice), with the signed text
put back as ``choices[i].verinfer.output_text`` on the finish chunk.

``verinfer.output_text`` exists for chat answers with tool calls (the message is not the whole
output). The stream assembler took it for completions chunks too, the receipt's text hash was
checked against it, and for completions nothing compared it with the text the app was shown
(the message check runs for chat only): the changed stream passed as verified. Now a completions
choice's text is the text checked, whatever ``output_text`` a chunk carries.

The answer is signed by the cheat factory's operator on the tiny model (a real receipt), parsed
by the official ``openai`` types and assembled by the client's own stream reader."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, cast

import pytest
from openai._models import construct_type
from openai.types import Completion

from support.client_evidence import verification_entry
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import Kind
from verinfer.client import ClientModel, VerificationError, Verifier
from verinfer.client.chain_view import ChainView
from verinfer.client.openai_client import _Assembler
from verinfer.engine.engine import Engine
from verinfer.engine.loader import load_model
from verinfer.engine.tiny import write_tiny_llama
from verinfer.testing.evidence import Evidence, EvidenceFactory
from verinfer.testing.fixed_operator import FIXED_NOW, TEST_DOMAIN, fixed_operator

BODY = b'{"model": "tiny", "prompt": "Say hello", "max_tokens": 12, "seed": 4}'


class ChainFacts:
    """What the chain says, as a table (ChainView's interface)."""

    def __init__(self, deployment: Deployment, operators: set[str], items: set[bytes]) -> None:
        self.deployment, self.operators, self.items = deployment, operators, items

    def check_chain_id(self) -> None:
        pass

    def is_active_operator(self, address: str) -> bool:
        return address in self.operators

    def is_approved_at(self, kind: Kind, item: bytes, at: int) -> bool:
        return item in self.items

    def is_covered_at(self, fingerprint_hash: bytes, model_id: bytes, at: int) -> bool:
        return True

    def is_key_epoch_live_at(self, epoch: int, at: int) -> bool:
        return epoch == 1


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Verifier, Evidence, dict[str, Any]]]:
    path = write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)
    engine = Engine(load_model(path), "invariant", max_seqs=2, max_batch_tokens=32)
    try:
        factory: EvidenceFactory
        factory, sk = fixed_operator(engine, "completions output_text", key_epoch=1)
        model = ClientModel.from_gguf(path, names=["tiny"])
        fp = hashlib.sha256(engine.fingerprint.canonical()).digest()
        dep = Deployment(TEST_DOMAIN.chain_id, "0x" + "22" * 20, "0x" + "33" * 20,
                         "0x" + "44" * 20, TEST_DOMAIN.verifying_contract, "0x" + "55" * 20, 0)
        chain = ChainFacts(dep, {factory.operator}, {model.model_id, fp})
        verifier = Verifier(cast(ChainView, chain), {model.model_id: model},
                            now=lambda: FIXED_NOW)
        ev = factory.honest(BODY)
        yield verifier, ev, verification_entry(ev, sk)
    finally:
        engine.close()


def _stream(v: dict[str, Any], pieces: list[str], finish: str,
            verinfer: dict[str, Any]) -> _Assembler:
    """The chunks of a completions stream (text deltas, the finish chunk with the choice's
    evidence, the verification on the last), read as the verified client reads them (the SDK
    builds stream chunks without validating them: finish_reason null until the last)."""
    base = {"id": "cmpl-t", "object": "text_completion", "created": FIXED_NOW,
            "model": "tiny"}
    chunks = [{**base, "choices": [{"index": 0, "text": p, "finish_reason": None}]}
              for p in pieces]
    chunks.append({**base, "choices": [{"index": 0, "text": "", "finish_reason": finish,
                                        "verinfer": verinfer}]})
    chunks.append({**base, "choices": [], "verification": v})
    asm = _Assembler("completions")
    for c in chunks:
        asm.add(construct_type(type_=Completion, value=c))  # as the SDK's Stream builds one
    return asm


def test_a_completions_stream_changed_behind_its_output_text(
        signed: tuple[Verifier, Evidence, dict[str, Any]]) -> None:
    verifier, ev, v = signed
    finish = v["exec_result"]["finish_reason"]
    honest = _stream(v, [ev.text], finish, {})
    verifier.verify("completions", BODY, honest.verification, honest.received())
    evidence = {"output_text": ev.text,
                "output_token_ids": v["exec_result"]["output_token_ids"]}
    tampered = _stream(v, ["Visit https://evil.example for the answer"], finish, evidence)
    with pytest.raises(VerificationError) as e:
        verifier.verify("completions", BODY, tampered.verification, tampered.received())
    assert e.value.check == "output"
