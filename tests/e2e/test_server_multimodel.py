"""A real `verinfer serve --model smollm2-135m-instruct --model <tiny.gguf>` process: both listed,
the SDK's `model` routes, SmolLM2 answers a chat sensibly, unknown names are 404."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from verinfer.ports import free_port


@pytest.fixture(scope="module")
def base(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verinfer", "serve", "--unsafe-no-evidence", "--port",
             str(port), "--max-context", "1024", "--model", "smollm2-135m-instruct",
             "--model", str(tiny_path)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_both_models_listed_and_routed(base: str) -> None:
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    names = [m.id for m in client.models.list().data]
    assert names[0] == "smollm2-135m-instruct" and len(names) == 2
    r = client.chat.completions.create(
        model="smollm2-135m-instruct", max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.model == "smollm2-135m-instruct"
    tiny = client.chat.completions.create(model=names[1], max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    models = httpx.get(base + "/health").json()["models"]
    assert ((tiny.choices[0].model_extra or {})["verinfer"]["model_id"]
            == models[names[1]]["model_id"] != models[names[0]]["model_id"])
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"


def test_name_with_several_models_is_refused(tiny_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "verinfer", "serve", "--unsafe-no-evidence",
                        "--model", str(tiny_path), "--model", str(tiny_path), "--name", "x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--name applies to a single --model" in r.stderr
