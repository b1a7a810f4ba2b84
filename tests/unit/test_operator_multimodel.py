"""One operator serving several models: /v1/models lists them, a request's `model` routes it to
that model's engine (its own model id, tokenizer and request-rule facts), unknown names get the
OpenAI 404 shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from verinfer.engine.engine import Engine
from verinfer.engine.loader import MODEL_NAMES, load_model, resolve_model_path
from verinfer.engine.tiny import write_tiny_llama
from verinfer.operator.app import create_app


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, tiny_engine: Engine
            ) -> Iterator[dict[str, Engine]]:
    other = write_tiny_llama(tmp_path_factory.mktemp("m") / "other.gguf", seed=1)
    second = Engine(load_model(other), "invariant", max_seqs=4, max_batch_tokens=48)
    yield {"alpha": tiny_engine, "beta": second}
    second.close()


@pytest.fixture(scope="module")
def client(engines: dict[str, Engine]) -> TestClient:
    return TestClient(create_app(engines))


def _chat(client: TestClient, model: str) -> dict[str, object]:
    r = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_models_lists_every_served_model(client: TestClient) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["alpha", "beta"]


def test_model_field_routes_to_that_engine(client: TestClient,
                                           engines: dict[str, Engine]) -> None:
    assert engines["alpha"].model_id != engines["beta"].model_id
    for name, eng in engines.items():
        model_id = "0x" + eng.model_id.hex()  # as the API writes it
        body = _chat(client, name)
        assert body["model"] == name
        assert body["choices"][0]["verinfer"]["model_id"] == model_id  # type: ignore[index]
        by_id = _chat(client, model_id)  # the weights hash names the same model
        assert by_id["choices"][0]["verinfer"]["model_id"] == model_id  # type: ignore[index]
    r = client.post("/v1/completions", json={"model": "beta", "prompt": "the", "max_tokens": 3,
                                              "temperature": 0})
    assert r.status_code == 200 and r.json()["model"] == "beta"
    health = client.get("/health").json()
    assert {n: m["model_id"] for n, m in health["models"].items()} == {
        n: "0x" + e.model_id.hex() for n, e in engines.items()}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_unknown_model_is_the_openai_404(client: TestClient, path: str) -> None:
    payload = {"model": "gpt-4o", "max_tokens": 2}
    payload.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path
                   else {"prompt": "x"})
    r = client.post(path, json=payload)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert err["type"] == "invalid_request_error"
    assert "'alpha', 'beta'" in err["message"]


def test_named_models_resolve_to_their_packages() -> None:
    assert set(MODEL_NAMES) == {"gemma3-270m", "smollm2-135m-instruct"}
    assert resolve_model_path("smollm2-135m-instruct").name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model_path("some/file.gguf") == Path("some/file.gguf")
