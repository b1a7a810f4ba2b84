"""Tool calling through the real server and the official `openai` SDK: a tool call, the tool's
result, a final answer; streamed tool-call deltas; ``parse`` with a Pydantic function tool; each
receipt judged ``match`` by the real verifier job, and the response's ``tool_calls`` equal to
what the protocol's reading derives from the receipt's own output tokens (ids from its request
hash). The model is the tiny one (random weights) shipped with Qwen 2.5's chat template (tool
syntax): a forced call is valid by grammar whatever the weights; an ``auto`` answer from random
weights is plain content (the reading of Hermes blocks is unit-tested,
tests/unit/test_tool_calling.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from support.receipt_judge import assert_reproduced, epoch_private_key
from support.receipt_judge import verification as _v
from support.servers import operator_init, running_server
from support.tool_template import QWEN25_TOOLS_TEMPLATE
from verinfer.client import ClientModel, VerificationError, VerifiedOpenAI
from verinfer.engine.tiny import write_tiny_llama
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import read_gguf_tokenizer_fields
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.request_rule import parse_body
from verinfer.protocol.tools import call_id, choice_message
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.testing.client_chain import ClientChain, client_chain

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD: Any = {"type": "function", "function": {
    "name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0,
                                               "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}}
# this module's own `server` fixture (a wider window) starts a process and serves on loopback
pytestmark = [pytest.mark.process, pytest.mark.loopback]

ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a tool-capable chat template (overrides the session's model for
    this module's server)."""
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-tools.gguf", seed=0,
                            chat_template=QWEN25_TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def server(tiny_path: Path, operator_dir: Path) -> Iterator[str]:
    """The e2e server with a window for the template's tool preamble (~800 tiny tokens; the
    last --max-context given wins)."""
    with running_server(tiny_path, "--operator-dir", str(operator_dir),
                        "--max-context", "2048") as base:
        yield base


@pytest.fixture(scope="module")
def epoch_key(operator_dir: Path) -> EpochPrivateKey:
    return epoch_private_key(operator_dir)


def _prompt_text(v: dict[str, Any], model: Path) -> str:
    tok = tokenizer_from_gguf_fields(read_gguf_tokenizer_fields(model))
    return tok.decode(list(v["exec_request"]["prompt_token_ids"]), skip_special=False)


def _rederived(r: Any, req_hash: bytes, **fields: Any) -> None:
    """What a client (or verifier) checks of a tool-call answer: the output text the evidence
    carries hashes to the receipt's text hash, and the protocol's reading of that text gives
    exactly the served message (content and tool_calls, ids included)."""
    choice = r.choices[0]
    text = choice.model_extra["verinfer"]["output_text"]
    res = ExecResult.from_json(_v(r)["exec_result"])
    assert res.text_sha256 == hashlib.sha256(text.encode()).digest()
    policy = parse_body(json.dumps({"model": "tiny", "messages": ASK, **fields}).encode(),
                        "chat").policy.tools
    content, calls = choice_message(policy, text, req_hash)
    assert content == choice.message.content
    assert calls == [c.model_dump(exclude={"parsed_arguments"}, exclude_none=True)
                     for c in choice.message.tool_calls]


def test_a_tool_call_its_result_and_a_final_answer(client: OpenAI, operator_dir: Path,
                                                  tiny_path: Path,
                                                  epoch_key: EpochPrivateKey) -> None:
    r1 = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, ADD],
                                        tool_choice="required", parallel_tool_calls=False,
                                        max_tokens=80, temperature=0.7, seed=5)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "add")
    json.loads(call.function.arguments)  # valid JSON, by grammar
    v1 = _v(r1)
    req = ExecRequest.from_json(v1["exec_request"])
    assert req.grammar is not None and call.id == call_id(req.hash, 0)
    assert "get_weather" in _prompt_text(v1, tiny_path)  # the tools were shown to the model
    _rederived(r1, req.hash, tools=[WEATHER, ADD], tool_choice="required",
               parallel_tool_calls=False)
    assert_reproduced(v1, operator_dir, tiny_path, epoch_key)

    # the SDK's own message object goes back in the history, then the tool's result
    history: list[Any] = [*ASK, choice.message,
                          {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r2 = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER, ADD],
                                        max_tokens=12, temperature=0.7, seed=5)
    final = r2.choices[0]
    assert final.finish_reason in ("stop", "length") and isinstance(final.message.content, str)
    assert not final.message.tool_calls
    v2 = _v(r2)
    prompt = _prompt_text(v2, tiny_path)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert f'<tool_call>\n{{"name": "{call.function.name}", "arguments": ' in prompt
    assert_reproduced(v2, operator_dir, tiny_path, epoch_key)


def test_a_named_call_streams_as_deltas(client: OpenAI, operator_dir: Path, tiny_path: Path,
                                        epoch_key: EpochPrivateKey) -> None:
    kw: Any = {"model": "tiny", "messages": ASK, "tools": [WEATHER, ADD], "seed": 9,
               "tool_choice": {"type": "function", "function": {"name": "add"}},
               "max_tokens": 40, "temperature": 0.9}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)  # the answer is the call
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert whole.choices[0].message.tool_calls is not None
    expect = whole.choices[0].message.tool_calls[0]
    assert len(streamed) == 1 and streamed[0].index == 0
    assert (streamed[0].id, streamed[0].function.name, streamed[0].function.arguments) == (
        expect.id, "add", expect.function.arguments)
    args = json.loads(expect.function.arguments)
    assert set(args) == {"a", "b"} and all(0 <= x <= 99 for x in args.values())
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"] and whole.choices[0].finish_reason == "tool_calls"
    ends = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert (ends[0].model_extra or {})["verinfer"]["output_text"] == \
        whole.choices[0].model_extra["verinfer"]["output_text"] == expect.function.arguments
    assert_reproduced(_v(chunks[-1]), operator_dir, tiny_path, epoch_key)
    # the SDK's stream helper assembles the same message (and reaches the receipt)
    with client.chat.completions.stream(**kw) as s:
        final = s.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    got = final.choices[0].message.tool_calls
    assert got is not None and [(c.id, c.function.name, c.function.arguments) for c in got] \
        == [(expect.id, "add", expect.function.arguments)]
    assert "verification" in (final.choices[0].message.model_extra or {})


class Weather(BaseModel):
    city: Literal["Paris", "Rome"]
    unit: Literal["C", "F"]


def test_parse_with_a_pydantic_function_tool(client: OpenAI) -> None:
    r = client.chat.completions.parse(
        model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required", parallel_tool_calls=False, max_tokens=60, seed=2)
    calls = r.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "Weather"
    assert isinstance(calls[0].function.parsed_arguments, Weather)


def test_legacy_functions_are_refused_by_name(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2,
                                       functions=[WEATHER["function"]])
    assert e.value.body["param"] == "functions"  # type: ignore[index]
    assert "tools" in e.value.body["message"]  # type: ignore[index]


def test_async_client_gets_the_same_call(client: OpenAI, server: str) -> None:
    kw: Any = {"model": "tiny", "messages": ASK, "tools": [WEATHER], "seed": 11,
               "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 100,
               "temperature": 0.6}

    async def ask() -> Any:
        async with openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused",
                                      max_retries=0) as ac:
            return await ac.chat.completions.create(**kw)

    got = asyncio.run(ask()).choices[0]
    want = client.chat.completions.create(**kw).choices[0]
    assert got.finish_reason == want.finish_reason == "tool_calls"
    assert got.message.tool_calls == want.message.tool_calls  # ids derive from the request


# ---- the verified client on tool calls (anvil, a staked operator, this module's model) ---------
@contextmanager
def _rewriting_proxy(base: str, rewrite: Callable[[dict[str, Any]], None]) -> Iterator[str]:
    """A loopback front end that forwards each POST to the real server and changes its JSON
    answer with ``rewrite`` (a proxy, a cache or the operator's own front end tampering);
    yields its base URL (…/v1)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            sent = self.rfile.read(int(self.headers.get("content-length", "0")))
            r = httpx.post(base + self.path, content=sent, timeout=120,
                           headers={"content-type": "application/json"})
            answer = r.json()
            rewrite(answer)
            data = json.dumps(answer).encode()
            self.send_response(r.status_code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}/v1"
    finally:
        proxy.shutdown()
        proxy.server_close()


@dataclass
class ChainNet:
    chain: ClientChain
    base: str
    model: ClientModel

    def client(self, base: str | None = None, **kw: Any) -> VerifiedOpenAI:
        return VerifiedOpenAI(base_url=base or self.base + "/v1", api_key="unused",
                              max_retries=0, models=[self.model], rpc_url=self.chain.node.url,
                              deployment=self.chain.deployment_file, chain_id=31337, **kw)


@pytest.fixture(scope="module")
def chain_net(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Iterator[ChainNet]:
    """anvil with the contracts, an operator staked there serving this module's tool-template
    model, its model and fingerprint approved."""
    tmp = tmp_path_factory.mktemp("tools-client")
    with client_chain(tmp) as chain, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPERATOR_KEY", chain.operator.key.hex())
        operator_init(tmp / "op", "--private-key-env", "OPERATOR_KEY", "--rpc-url",
                      chain.node.url, "--deployment", str(chain.deployment_file))
        with running_server(tiny_path, "--operator-dir", str(tmp / "op"), "--max-context",
                            "2048", env=dict(os.environ)) as base:
            health = httpx.get(base + "/health").json()
            chain.approve(bytes.fromhex(health["model_id"][2:]),
                          bytes.fromhex(health["engine_fingerprint"]["hash"][2:]))
            deadline = time.monotonic() + 60
            while not httpx.get(base + "/health").json()["ready"]:
                assert time.monotonic() < deadline, httpx.get(base + "/health").json()
                time.sleep(0.2)
            yield ChainNet(chain, base, ClientModel.from_gguf(tiny_path, names=["tiny"]))


@pytest.mark.anvil
def test_verified_openai_accepts_an_honest_tool_call_and_refuses_a_tampered_one(
        chain_net: ChainNet) -> None:
    kw: Any = {"model": "tiny", "messages": ASK, "tools": [WEATHER, ADD], "seed": 13,
               "tool_choice": "required", "max_tokens": 100, "temperature": 0.7}
    client = chain_net.client()
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls and c.message.content is None
    # the same answer streamed (verify_first: checked before the app gets a chunk) and the
    # named form; each passes
    streamed = [tc for ch in client.chat.completions.create(**kw, stream=True) if ch.choices
                for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [(t.id, t.function.name, t.function.arguments) for t in streamed] == \
        [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls]
    named = client.chat.completions.create(**{**kw, "tool_choice": {
        "type": "function", "function": {"name": "add"}}})
    assert named.choices[0].finish_reason == "tool_calls"

    def args(answer: dict[str, Any]) -> None:
        fn = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        fn["arguments"] = fn["arguments"].replace("Paris", "Rome") if "Paris" in \
            fn["arguments"] else fn["arguments"].replace("Rome", "Paris") if "Rome" in \
            fn["arguments"] else json.dumps({**json.loads(fn["arguments"]), "x": 1})

    def extra(answer: dict[str, Any]) -> None:
        calls = answer["choices"][0]["message"]["tool_calls"]
        calls.append({**calls[0], "id": "call_" + "0" * 24})

    def content(answer: dict[str, Any]) -> None:
        answer["choices"][0]["message"]["content"] = "Calling it now."

    for tamper, check in ((args, "tool_calls"), (extra, "tool_calls"), (content, "content")):
        with _rewriting_proxy(chain_net.base, tamper) as url, \
                pytest.raises(VerificationError) as e:
            chain_net.client(url).chat.completions.create(**kw)
        assert e.value.check == check, (tamper.__name__, e.value)
