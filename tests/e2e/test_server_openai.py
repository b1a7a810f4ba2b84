"""A real `verinfer serve` process on loopback, driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "verinfer", "serve", "--model", str(tiny_path), "--port",
         str(port), "--name", "tiny", "--max-context", "512"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"server exited: {out}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture()
def client(server: str) -> OpenAI:
    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


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
    ev = (r.model_extra or {})["verinfer"]
    assert ev["model_id"].startswith("0x") and len(ev["model_id"]) == 66
    assert len(ev["output_token_ids"]) == r.usage.completion_tokens
    again = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}],
        max_tokens=8, temperature=0)
    assert again.choices[0].message.content == r.choices[0].message.content
    assert (again.model_extra or {})["verinfer"]["logit_digest"] == ev["logit_digest"]


def test_seeded_sampling_is_reproducible(client: OpenAI) -> None:
    def ask(seed: int) -> tuple[str | None, str]:
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=16, temperature=0.9, seed=seed)
        return r.choices[0].message.content, (r.model_extra or {})["verinfer"]["logit_digest"]

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
    ({"stream": True}, "stream"),
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


def test_oversized_body_is_413(server: str) -> None:
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * (5 << 20)}]}
    r = httpx.post(server + "/v1/chat/completions", json=big)
    assert r.status_code == 413 and "error" in r.json()


def test_serve_with_a_missing_model_fails_clearly(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "verinfer", "serve", "--model",
                        str(tmp_path / "none.gguf")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "does not exist" in r.stderr
