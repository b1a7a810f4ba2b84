"""Attacks on tool calling's rule, each carried out by a cheating operator that runs a request
of its own making for a body with tools and publishes a consistent, signed answer; the real
verifier job (``judge``, the envelope's body through the request rule) votes each
``request_nonconformant``:

1. the tools left out of the prompt (cheaper, or steering the model away from calling);
2. a forced call (``tool_choice: required``) served without its grammar (free text that the
   client's SDK would then read as content, or a call outside the schema);
3. a named call run under another tool's schema;
4. ``parallel_tool_calls: false`` run with the parallel grammar (more calls than allowed);
5. a tool result dropped from the history.
The honest request is confirmed (``match``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from support.tool_template import QWEN25_TOOLS_TEMPLATE
from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.engine import Engine
from verinfer.engine.loader import load_model
from verinfer.engine.tiny import write_tiny_llama
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory, request_for_body
from verinfer.verifier.reexec import judge

SIGNER = ReceiptSigner(hashlib.sha256(b"tool-rule adversary").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"tool-rule epoch").digest(),
                              EnvelopeSuite.X25519)


def _tool(name: str, prop: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {prop: {"type": "integer", "minimum": 0,
                                                "maximum": 9}},
        "required": [prop], "additionalProperties": False}}}


TOOLS = [_tool("left", "x"), _tool("right", "y")]
USER = [{"role": "user", "content": "call a tool"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "left", "arguments": '{"x":1}'}}
HISTORY = [*USER, {"role": "assistant", "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "c1", "content": "done"},
           {"role": "user", "content": "and now?"}]


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "tiny", "messages": USER, "tools": TOOLS, "max_tokens": 24,
                       "seed": 7, "temperature": 0.8, **fields},
                      separators=(",", ":")).encode()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_tiny_llama(Path(tmp_path_factory.mktemp("models")) / "tiny-tools.gguf",
                            chat_template=QWEN25_TOOLS_TEMPLATE)
    eng = Engine(load_model(path), "invariant", max_seqs=4, max_batch_tokens=48)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def factory(engine: Engine) -> EvidenceFactory:
    return EvidenceFactory(engine, SIGNER, DOMAIN, key_epoch=5, epoch_public_key=PK,
                           now=lambda: 1_800_000_000)


def _cheat(factory: EvidenceFactory, engine: Engine, body: bytes, request: ExecRequest
           ) -> str:
    """Runs ``request`` honestly and publishes it as the answer to ``body``; the real job's
    verdict reason."""
    gen = engine.generate(list(request.prompt_token_ids), request.sampling_params())
    ev = factory._finish(body, request, ExecResult.from_generation(gen), gen.text)
    v = judge(engine, ev.signed.receipt, ev.blob, SK)
    return v.reason if v.vote == INVALID_EVIDENCE else "vote:" + v.reason


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_the_tools_left_out_of_the_prompt(engine: Engine, factory: EvidenceFactory,
                                          choice: str) -> None:
    body = _body(tool_choice=choice)
    honest = request_for_body(engine, body)
    assert _cheat(factory, engine, body, honest) == "vote:match"
    bare = request_for_body(engine, _body(tool_choice="none"))  # same body, no tools shown
    assert bare.prompt_token_ids != honest.prompt_token_ids
    cheat = replace(honest, prompt_token_ids=bare.prompt_token_ids)
    assert _cheat(factory, engine, body, cheat) == "request_nonconformant"


def test_a_forced_call_without_its_grammar(engine: Engine, factory: EvidenceFactory) -> None:
    body = _body(tool_choice="required")
    honest = request_for_body(engine, body)
    assert honest.grammar is not None
    free = request_for_body(engine, _body(tool_choice="auto"))  # same prompt, no grammar
    assert free.grammar is None and free.prompt_token_ids == honest.prompt_token_ids
    assert _cheat(factory, engine, body, replace(honest, grammar=None)) == \
        "request_nonconformant"


def test_a_named_call_under_another_schema(engine: Engine, factory: EvidenceFactory) -> None:
    left = _body(tool_choice={"type": "function", "function": {"name": "left"}})
    right = request_for_body(engine, _body(
        tool_choice={"type": "function", "function": {"name": "right"}}))
    honest = request_for_body(engine, left)
    assert honest.grammar != right.grammar
    assert _cheat(factory, engine, left, honest) == "vote:match"
    assert _cheat(factory, engine, left, replace(honest, grammar=right.grammar)) == \
        "request_nonconformant"


def test_one_call_asked_many_allowed(engine: Engine, factory: EvidenceFactory) -> None:
    one = _body(tool_choice="required", parallel_tool_calls=False)
    many = request_for_body(engine, _body(tool_choice="required"))
    honest = request_for_body(engine, one)
    assert honest.grammar != many.grammar
    assert _cheat(factory, engine, one, replace(honest, grammar=many.grammar)) == \
        "request_nonconformant"


def test_a_tool_result_dropped_from_the_history(engine: Engine,
                                                factory: EvidenceFactory) -> None:
    body = _body(messages=HISTORY)
    honest = request_for_body(engine, body)
    assert _cheat(factory, engine, body, honest) == "vote:match"
    dropped = request_for_body(engine, _body(messages=[*USER, HISTORY[3]]))
    cheat = replace(honest, prompt_token_ids=dropped.prompt_token_ids)
    assert _cheat(factory, engine, body, cheat) == "request_nonconformant"
