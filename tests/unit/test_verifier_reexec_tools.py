"""The re-execution job on tool-calling receipts (the tiny model with a tool-capable template):
the receipt binds what a choice's ``tool_calls`` are read from (the prompt with the tools, the
forced call's grammar, the output tokens and the output text), so an honest forced call is
confirmed by replay alone and the verifier, reading the replayed output by the protocol's rule,
derives the very ``tool_calls`` the operator served; a tampered tool call (other arguments in
the served text, or another token) gets ``output_mismatch`` with the honest outHash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.tool_template import QWEN25_TOOLS_TEMPLATE
from verinfer.engine.engine import Engine
from verinfer.engine.loader import load_model
from verinfer.engine.tiny import write_tiny_llama
from verinfer.protocol.request_rule import parse_body
from verinfer.protocol.tools import choice_message
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge

SIGNER = ReceiptSigner(hashlib.sha256(b"tools verifier test operator").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"epoch 4 (tools)").digest(), EnvelopeSuite.X25519)
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}
BODY = json.dumps({
    "model": "tiny", "messages": [{"role": "user", "content": "add 2 and 3"}],
    "tools": [ADD], "tool_choice": "required", "parallel_tool_calls": False,
    "max_tokens": 40, "seed": 4, "temperature": 0.8,
}, separators=(",", ":")).encode()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_tiny_llama(Path(tmp_path_factory.mktemp("models")) / "tiny-tools.gguf",
                            chat_template=QWEN25_TOOLS_TEMPLATE)
    eng = Engine(load_model(path), "invariant", max_seqs=4, max_batch_tokens=48)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def factory(engine: Engine) -> EvidenceFactory:
    return EvidenceFactory(engine, SIGNER, DOMAIN, key_epoch=4, epoch_public_key=PK,
                           now=lambda: 1_800_000_000)


def _honest(engine: Engine) -> tuple[bytes, str]:
    req = request_for_body(engine, BODY)
    gen = engine.generate(list(req.prompt_token_ids), req.sampling_params())
    return ExecResult.from_generation(gen).hash, gen.text


def test_an_honest_call_is_confirmed_and_its_tool_calls_rederived(
        engine: Engine, factory: EvidenceFactory) -> None:
    ev = factory.honest(BODY)
    req = request_for_body(engine, BODY)
    assert req.grammar is not None  # the forced call's grammar is bound
    policy = parse_body(ev.request_body, "chat").policy.tools
    served = choice_message(policy, ev.text, req.hash)
    content, calls = served
    assert content is None and calls is not None and calls[0]["function"]["name"] == "add"
    assert set(json.loads(calls[0]["function"]["arguments"])) == {"a", "b"}
    v = judge(engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "match" and v.agrees and v.decoded_tokens == 0
    # the verifier's own reading of the replayed output: the same message, ids included
    _, replayed_text = _honest(engine)
    assert choice_message(policy, replayed_text, req.hash) == served


@pytest.mark.parametrize("cheat", ["tampered_arguments", "tampered_tokens"])
def test_a_tampered_tool_call_is_a_mismatch(engine: Engine, factory: EvidenceFactory,
                                            cheat: str) -> None:
    honest_hash, honest_text = _honest(engine)
    if cheat == "tampered_arguments":
        args = json.loads(honest_text)[0]["arguments"]
        forged = json.dumps([{"name": "add", "arguments": {"a": (args["a"] + 1) % 100,
                                                           "b": args["b"]}}],
                            separators=(",", ":"))
        ev = factory.unsafe_tampered_text(BODY, forged)
        policy = parse_body(BODY, "chat").policy.tools
        req = request_for_body(engine, BODY)
        # a well-formed call, just not the model's: only re-execution tells them apart
        assert choice_message(policy, ev.text, req.hash) != \
            choice_message(policy, honest_text, req.hash)
    else:
        ev = factory.unsafe_tampered_tokens(BODY)
    v = judge(engine, ev.signed.receipt, ev.blob, SK)
    assert v.reason == "output_mismatch" and not v.agrees
    assert v.vote == honest_hash
