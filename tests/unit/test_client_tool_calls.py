"""The verified client on tool-call answers (verinfer.client): the receipt's text hash is checked
against ``choices[i].verinfer.output_text``, and the message the app gets — content and
``tool_calls`` (ids, names, arguments, order) — must be what the protocol's own reading
(verinfer.protocol.tools.choice_message) derives from that verified text, the body sent and
reqHash; ``finish_reason: tool_calls`` exactly when there are calls. Answers are signed by the
cheat factory's operator on the tiny model with a tool-capable chat template, made into the
response the server writes and parsed by the official ``openai`` types (the client's own
reading of SDK objects); each tamper is refused by the check that names it, streamed or not.
The chain's answers come from a table (the real reads: tests/e2e/test_server_tools.py)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from support.client_evidence import verification_entry
from support.tool_template import QWEN25_TOOLS_TEMPLATE
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import Kind
from verinfer.client import ClientModel, VerificationError, Verifier
from verinfer.client.chain_view import ChainView
from verinfer.client.openai_client import _Assembler, _received
from verinfer.engine.engine import Engine
from verinfer.engine.loader import load_model
from verinfer.engine.tiny import write_tiny_llama
from verinfer.protocol.request_rule import parse_body
from verinfer.protocol.tools import call_id, choice_message
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.testing.evidence import Evidence, EvidenceFactory
from verinfer.testing.fixed_operator import FIXED_NOW, TEST_DOMAIN, fixed_operator

ADD: Any = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}
WEATHER: Any = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "add 2 and 3"}]


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "tiny", "messages": ASK, "tools": [ADD, WEATHER],
                       "max_tokens": 120, "seed": 4, "temperature": 0.8, **fields}).encode()


REQUIRED = body(tool_choice="required", parallel_tool_calls=False)
NAMED = body(tool_choice={"type": "function", "function": {"name": "add"}})
AUTO = body()  # tool_choice auto (the default with tools)
# an auto answer in the Hermes format: text before the calls, then two calls
HERMES = ('Let me check. <tool_call>{"name": "add", "arguments": {"b": 3, "a": 2.0}}'
          '</tool_call>\n<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}'
          '</tool_call>')


@dataclass
class ChainFacts:
    """What the chain says, as a table (ChainView's interface)."""

    deployment: Deployment
    operators: set[str]
    items: set[bytes] = field(default_factory=set)

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


@dataclass
class Setup:
    factory: EvidenceFactory
    sk: EpochPrivateKey
    verifier: Verifier


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    path = write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-tools.gguf", seed=0,
                            chat_template=QWEN25_TOOLS_TEMPLATE)
    engine = Engine(load_model(path), "invariant", max_seqs=4, max_batch_tokens=48)
    try:
        factory, sk = fixed_operator(engine, "client tool calls", key_epoch=1)
        model = ClientModel.from_gguf(path, names=["tiny"])
        fp = hashlib.sha256(engine.fingerprint.canonical()).digest()
        dep = Deployment(TEST_DOMAIN.chain_id, "0x" + "22" * 20, "0x" + "33" * 20,
                         "0x" + "44" * 20, TEST_DOMAIN.verifying_contract, "0x" + "55" * 20, 0)
        chain = ChainFacts(dep, {factory.operator}, {model.model_id, fp})
        yield Setup(factory, sk, Verifier(cast(ChainView, chain), {model.model_id: model},
                                          now=lambda: FIXED_NOW))
    finally:
        engine.close()


# ---- the answer as the server writes it --------------------------------------------------------
def response(setup: Setup, ev: Evidence) -> dict[str, Any]:
    """The chat completion an honest server writes for ``ev`` (operator/chat/serving.py: the
    message by choice_message, output_text given when the answer has calls)."""
    v = verification_entry(ev, setup.sk)
    tools = parse_body(ev.request_body, "chat").policy.tools
    content, calls = choice_message(tools, ev.text, bytes.fromhex(v["req_hash"][2:]))
    res = v["exec_result"]
    return {"id": "chatcmpl-t", "object": "chat.completion", "created": FIXED_NOW,
            "model": "tiny", "verification": v,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                 "tool_calls": calls},
                         "finish_reason": "tool_calls" if calls else res["finish_reason"],
                         "verinfer": {"output_text": ev.text if calls else None,
                                      "output_token_ids": res["output_token_ids"]}}]}


def chunks(whole: dict[str, Any]) -> list[dict[str, Any]]:
    """The same answer streamed as the server streams it: the content, each call whole in one
    delta, the finish (with the choice's evidence), a last chunk with the verification."""
    whole = copy.deepcopy(whole)
    c = whole["choices"][0]
    m = c["message"]
    base = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": FIXED_NOW,
            "model": "tiny"}

    def one(delta: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None, **kw}]}
    out = [one({"role": "assistant", "content": ""})]
    if m["content"]:
        out.append(one({"content": m["content"]}))
    if m["tool_calls"]:
        out.append(one({"tool_calls": [{"index": i, **tc}
                                       for i, tc in enumerate(m["tool_calls"])]}))
    out.append(one({}, finish_reason=c["finish_reason"], verinfer=c["verinfer"]))
    out.append({**base, "choices": [], "verification": whole["verification"]})
    return out


def check(setup: Setup, ev: Evidence, whole: dict[str, Any]) -> Any:
    verification, got = _received("chat", ChatCompletion.model_validate(whole))
    return setup.verifier.verify("chat", ev.request_body, verification, got)


def check_stream(setup: Setup, ev: Evidence, parts: list[dict[str, Any]]) -> Any:
    asm = _Assembler("chat")
    for p in parts:
        asm.add(ChatCompletionChunk.model_validate(p))
    return setup.verifier.verify("chat", ev.request_body, asm.verification, asm.received())


def refused(setup: Setup, ev: Evidence, whole: dict[str, Any]) -> VerificationError:
    with pytest.raises(VerificationError) as e:
        check(setup, ev, whole)
    return e.value


@pytest.fixture(scope="module")
def forced(setup: Setup) -> tuple[Evidence, dict[str, Any]]:
    ev = setup.factory.honest(REQUIRED)
    return ev, response(setup, ev)


@pytest.fixture(scope="module")
def hermes(setup: Setup) -> tuple[Evidence, dict[str, Any]]:
    """An auto answer whose signed text reads as content + two calls (the operator's text: a
    replay would judge it, the client checks what the app is shown of it)."""
    ev = setup.factory.unsafe_tampered_text(AUTO, HERMES)
    return ev, response(setup, ev)


def edit(whole: dict[str, Any], change: Any) -> dict[str, Any]:
    out = copy.deepcopy(whole)
    change(out["choices"][0])
    return out


# ---- honest answers pass -----------------------------------------------------------------------
def test_an_honest_forced_call_passes_streamed_or_not(
        setup: Setup, forced: tuple[Evidence, dict[str, Any]]) -> None:
    ev, whole = forced
    c = whole["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    assert c["message"]["tool_calls"][0]["function"]["name"] in ("add", "get_weather")
    (checked,) = check(setup, ev, whole)
    assert checked.exec_result.finish_reason in ("stop", "length")  # signed: the engine's
    assert c["message"]["tool_calls"][0]["id"] == call_id(checked.receipt.req_hash, 0)
    (streamed,) = check_stream(setup, ev, chunks(whole))
    assert streamed.receipt == checked.receipt


def test_an_honest_named_call_passes(setup: Setup) -> None:
    ev = setup.factory.honest(NAMED)
    whole = response(setup, ev)
    c = whole["choices"][0]
    assert c["message"]["tool_calls"][0]["function"]["arguments"] == json.dumps(
        json.loads(c["verinfer"]["output_text"]), separators=(",", ":"))  # the output: args
    check(setup, ev, whole)
    check_stream(setup, ev, chunks(whole))


def test_an_auto_answer_with_content_and_two_calls_passes(
        setup: Setup, hermes: tuple[Evidence, dict[str, Any]]) -> None:
    ev, whole = hermes
    m = whole["choices"][0]["message"]
    assert m["content"] == "Let me check. " and len(m["tool_calls"]) == 2
    assert m["tool_calls"][0]["function"]["arguments"] == '{"b":3,"a":2}'  # compact, one spelling
    check(setup, ev, whole)
    check_stream(setup, ev, chunks(whole))


def test_a_call_streamed_in_fragments_is_the_call_the_sdk_assembles(
        setup: Setup, hermes: tuple[Evidence, dict[str, Any]]) -> None:
    """The SDK's stream helper concatenates fragments per index: the client reads them so."""
    ev, whole = hermes
    parts = chunks(whole)
    at = next(i for i, p in enumerate(parts) if p["choices"]
              and p["choices"][0]["delta"].get("tool_calls"))
    tc = parts[at]["choices"][0]["delta"]["tool_calls"][1]
    args = tc["function"]["arguments"]
    second = copy.deepcopy(parts[at])
    second["choices"][0]["delta"]["tool_calls"] = [  # (type repeated: the SDK replaces it)
        {"index": 1, "type": "function", "function": {"arguments": args[5:]}}]
    tc["function"]["arguments"] = args[:5]
    check_stream(setup, ev, [*parts[:at + 1], second, *parts[at + 1:]])


def test_an_auto_answer_without_calls_is_plain_content(setup: Setup) -> None:
    ev = setup.factory.honest(AUTO)  # random weights: no Hermes block
    whole = response(setup, ev)
    c = whole["choices"][0]
    assert not c["message"]["tool_calls"] and c["verinfer"]["output_text"] is None
    check(setup, ev, whole)
    # a call added to a plain answer (and its finish): no call in the signed text
    tc = {"id": "call_x", "type": "function", "function": {"name": "add",
                                                          "arguments": '{"a":1,"b":2}'}}
    bad = edit(whole, lambda c: (c["message"].update(tool_calls=[tc]),
                                 c.update(finish_reason="tool_calls")))
    assert refused(setup, ev, bad).check == "tool_calls"


# ---- tampered answers are refused by the check that names them ---------------------------------
def _args(c: dict[str, Any]) -> None:
    fn = c["message"]["tool_calls"][0]["function"]
    args = json.loads(fn["arguments"])
    key = next(iter(args))
    args[key] = "Paris" if args[key] != "Paris" else "Rome"
    fn["arguments"] = json.dumps(args, separators=(",", ":"))


def _id(c: dict[str, Any]) -> None:
    c["message"]["tool_calls"][0]["id"] = "call_" + "0" * 24


def _name(c: dict[str, Any]) -> None:
    fn = c["message"]["tool_calls"][0]["function"]
    fn["name"] = "get_weather" if fn["name"] == "add" else "add"


def _extra(c: dict[str, Any]) -> None:
    c["message"]["tool_calls"].append({"id": "call_" + "1" * 24, "type": "function",
                                       "function": {"name": "add",
                                                    "arguments": '{"a":1,"b":1}'}})


def _dropped(c: dict[str, Any]) -> None:
    c["message"]["tool_calls"] = None


def _spaced(c: dict[str, Any]) -> None:  # the same value, another spelling
    fn = c["message"]["tool_calls"][0]["function"]
    fn["arguments"] = json.dumps(json.loads(fn["arguments"]))


def _legacy(c: dict[str, Any]) -> None:
    c["message"]["function_call"] = {"name": "add", "arguments": '{"a":1,"b":1}'}


@pytest.mark.parametrize("tamper", [_args, _id, _name, _extra, _dropped, _spaced, _legacy])
def test_a_tampered_tool_call_fails_tool_calls(
        setup: Setup, forced: tuple[Evidence, dict[str, Any]], tamper: Any) -> None:
    ev, whole = forced
    e = refused(setup, ev, edit(whole, tamper))
    assert e.check == "tool_calls" and e.choice == 0, e


def test_the_calls_of_an_auto_answer_reordered_fail_tool_calls(
        setup: Setup, hermes: tuple[Evidence, dict[str, Any]]) -> None:
    ev, whole = hermes
    e = refused(setup, ev, edit(whole, lambda c: c["message"]["tool_calls"].reverse()))
    assert e.check == "tool_calls"


@pytest.mark.parametrize("content", ["Let me check.", "Sure! ", None, ""])
def test_content_other_than_the_text_before_the_calls_fails_content(
        setup: Setup, hermes: tuple[Evidence, dict[str, Any]], content: str | None) -> None:
    ev, whole = hermes
    e = refused(setup, ev, edit(whole, lambda c: c["message"].update(content=content)))
    assert e.check == "content", e


def test_content_added_to_a_forced_call_fails_content(
        setup: Setup, forced: tuple[Evidence, dict[str, Any]]) -> None:
    ev, whole = forced
    e = refused(setup, ev, edit(whole, lambda c: c["message"].update(content="Done.")))
    assert e.check == "content"
    e = refused(setup, ev, edit(whole, lambda c: c["message"].update(refusal="no")))
    assert e.check == "content"


def test_finish_reason_and_output_text(setup: Setup,
                                       forced: tuple[Evidence, dict[str, Any]]) -> None:
    ev, whole = forced
    signed = whole["verification"]["exec_result"]["finish_reason"]
    # the signed stop reason instead of tool_calls: an honest server maps it to tool_calls
    e = refused(setup, ev, edit(whole, lambda c: c.update(finish_reason=signed)))
    assert e.check == "output" and "tool_calls" in e.message
    # the output text changed (with the calls re-read from it): not what was signed
    e = refused(setup, ev, edit(whole, lambda c: c["verinfer"].update(
        output_text=c["verinfer"]["output_text"] + " ")))
    assert e.check == "output" and "output_text" in e.message
    # the output text left out: the content (null) is then what the text hash must cover
    e = refused(setup, ev, edit(whole, lambda c: c["verinfer"].update(output_text=None)))
    assert e.check == "output"


def test_a_tampered_streamed_call_fails_tool_calls(
        setup: Setup, forced: tuple[Evidence, dict[str, Any]]) -> None:
    ev, whole = forced
    parts = chunks(whole)
    at = next(i for i, p in enumerate(parts) if p["choices"]
              and p["choices"][0]["delta"].get("tool_calls"))
    more = copy.deepcopy(parts[at])  # one more fragment of call 0: the app's arguments grow
    more["choices"][0]["delta"]["tool_calls"] = [{"index": 0, "function": {"arguments": " "}}]
    with pytest.raises(VerificationError) as e:
        check_stream(setup, ev, [*parts[:at + 1], more, *parts[at + 1:]])
    assert e.value.check == "tool_calls"
    other = copy.deepcopy(parts)
    other[at]["choices"][0]["delta"]["tool_calls"][0]["index"] = 1  # a call at index 1 only
    with pytest.raises(VerificationError) as e:
        check_stream(setup, ev, other)
    assert e.value.check == "tool_calls"
    tampered = chunks(edit(whole, _args))
    with pytest.raises(VerificationError) as e:
        check_stream(setup, ev, tampered)
    assert e.value.check == "tool_calls"

