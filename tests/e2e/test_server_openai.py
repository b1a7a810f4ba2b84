"""A real `verinfer serve` process on loopback, driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI


def test_models_lists_the_served_model(client: OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_completion_greedy(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}],
        max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.system_fingerprint and r.system_fingerprint.startswith("vi-invariant-")
    ev = (r.choices[0].model_extra or {})["verinfer"]
    assert ev["model_id"].startswith("0x") and len(ev["model_id"]) == 66
    assert len(ev["output_token_ids"]) == r.usage.completion_tokens
    again = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}],
        max_tokens=8, temperature=0)
    assert again.choices[0].message.content == r.choices[0].message.content
    assert (again.choices[0].model_extra or {})["verinfer"]["logit_digest"] == ev["logit_digest"]


def test_seeded_sampling_is_reproducible(client: OpenAI) -> None:
    def ask(seed: int) -> tuple[str | None, str]:
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=16, temperature=0.9, seed=seed)
        ev = (r.choices[0].model_extra or {})["verinfer"]
        return r.choices[0].message.content, ev["logit_digest"]

    first = ask(42)
    assert ask(42) == first
    assert any(ask(s)[0] != first[0] for s in (1, 2, 3))


def test_async_client_concurrent_requests_agree(server: str) -> None:
    async def run() -> list[str | None]:
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
        rs = await asyncio.gather(*[client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
            temperature=0.7, seed=9) for _ in range(6)])
        await client.close()
        return [r.choices[0].message.content for r in rs]

    outs = asyncio.run(run())
    assert len(set(outs)) == 1


def _error(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, object]:
    body = exc.value.body
    assert isinstance(body, dict)
    assert set(body) >= {"message", "type"}, body
    return body


def test_unknown_model_is_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert _error(e)["code"] == "model_not_found"


@pytest.mark.parametrize("kw,param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 7.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"n": 9}, "n"),
    ({"seed": -1}, "seed"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_bad_parameters_are_400(client: OpenAI, kw: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], **kw)  # type: ignore[call-overload]
    body = _error(e)
    assert body["type"] == "invalid_request_error" and body["param"] == param


def test_context_overflow_is_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "word " * 600}], max_tokens=4)
    assert _error(e)["code"] == "context_length_exceeded"


def test_malformed_json_and_wrong_types_are_400(server: str) -> None:
    r = httpx.post(server + "/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server + "/v1/chat/completions",
                   json={"model": "tiny", "messages": "hello"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(server + "/v1/chat/completions",
                   json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    for field, value in (("logprobs", "yes"), ("n", 1.5), ("temperature", "0.5")):
        r = httpx.post(server + "/v1/chat/completions",
                       json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                             field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)


def test_oversized_body_is_413(server: str) -> None:
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * (5 << 20)}]}
    r = httpx.post(server + "/v1/chat/completions", json=big)
    assert r.status_code == 413 and "error" in r.json()


def test_serve_with_a_missing_model_fails_clearly(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "verinfer", "serve", "--unsafe-no-evidence",
                        "--model", str(tmp_path / "none.gguf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "does not exist" in r.stderr


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "tell me a story"}]}


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.9, 7)])
def test_streamed_chat_equals_the_whole_response(client: OpenAI, temperature: float,
                                                 seed: int | None) -> None:
    whole = client.chat.completions.create(**CHAT, max_tokens=24, temperature=temperature,
                                           seed=seed)
    chunks = list(client.chat.completions.create(
        **CHAT, max_tokens=24, temperature=temperature, seed=seed, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].finish_reason == whole.choices[0].finish_reason
    ev = (finish[0].model_extra or {})["verinfer"]
    assert ev["logit_digest"] == (whole.choices[0].model_extra or {})["verinfer"]["logit_digest"]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.system_fingerprint == whole.system_fingerprint for c in chunks)


def test_stream_holds_back_a_stop_string(client: OpenAI) -> None:
    whole = client.chat.completions.create(**CHAT, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content or ""
    assert len(text) > 6
    stop = text[3:6]
    cut = client.chat.completions.create(**CHAT, max_tokens=24, temperature=0, stop=stop)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        **CHAT, max_tokens=24, temperature=0, stop=stop, stream=True) if c.choices)
    assert cut.choices[0].message.content == text[:text.find(stop)] == streamed
    assert cut.choices[0].finish_reason == "stop"


def test_chat_logprobs_match_between_stream_and_whole(client: OpenAI) -> None:
    whole = client.chat.completions.create(**CHAT, max_tokens=6, temperature=0, logprobs=True,
                                           top_logprobs=3)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 6
    for t in lp.content:
        assert t.logprob <= 0.0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert t.logprob == t.top_logprobs[0].logprob  # greedy picks the most likely token
    streamed = [t for c in client.chat.completions.create(
        **CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True)
        if c.choices and c.choices[0].logprobs for t in (c.choices[0].logprobs.content or [])]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in lp.content]


def test_n_choices_are_distinct_and_reproducible(client: OpenAI) -> None:
    r = client.chat.completions.create(**CHAT, max_tokens=12, temperature=1.0, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    again = client.chat.completions.create(**CHAT, max_tokens=12, temperature=1.0, seed=5, n=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    single = client.chat.completions.create(**CHAT, max_tokens=12, temperature=1.0, seed=5)
    assert single.choices[0].message.content == r.choices[0].message.content
    seeds = {(c.model_extra or {})["verinfer"]["seed"] for c in r.choices}
    assert len(seeds) == 3
    assert r.usage is not None
    assert r.usage.completion_tokens == sum(
        len((c.model_extra or {})["verinfer"]["output_token_ids"]) for c in r.choices)


def test_completions_text_and_token_prompts(client: OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="once upon a time", max_tokens=10,
                                  temperature=0, logprobs=2)
    c = r.choices[0]
    assert r.object == "text_completion" and c.finish_reason in ("stop", "length")
    assert c.logprobs is not None and len(c.logprobs.tokens or []) == r.usage.completion_tokens
    ids = (c.model_extra or {})["verinfer"]["prompt_token_ids"]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=10, temperature=0)
    assert by_ids.choices[0].text == c.text
    two = client.completions.create(model="tiny", prompt=["once upon a time", "hello"],
                                    max_tokens=4, temperature=0, n=2)
    assert [x.index for x in two.choices] == [0, 1, 2, 3]
    head = two.choices[0].text
    assert head == two.choices[1].text == r.choices[0].text[:len(head)]
    streamed = "".join(x.choices[0].text for x in client.completions.create(
        model="tiny", prompt="once upon a time", max_tokens=10, temperature=0, stream=True)
        if x.choices)
    assert streamed == c.text


@pytest.mark.parametrize("kw,param", [
    ({"echo": True}, "echo"),
    ({"suffix": "x"}, "suffix"),
    ({"logprobs": 9}, "logprobs"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
])
def test_completions_bad_parameters_are_400(client: OpenAI, kw: dict[str, object],
                                            param: str) -> None:
    args: dict[str, object] = {"model": "tiny", "prompt": "x", "max_tokens": 2, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args)  # type: ignore[call-overload]
    assert _error(e)["param"] == param


def test_metrics_are_exposed(server: str, client: OpenAI) -> None:
    client.models.list()
    text = httpx.get(server + "/metrics").text
    assert "verinfer_requests_total" in text and 'route="/v1/models"' in text
