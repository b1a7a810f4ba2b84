"""Malformed input never yields a 5xx or a hang, and every 4xx speaks OpenAI's error shape.

Two layers against a real `verinfer serve` process:
- schemathesis fuzzes every operation of the server's own OpenAPI document (valid and
  schema-violating inputs, a bounded number of examples each); request bodies are sent as
  generated and again with the served model name, so the fuzz reaches past the model check
  into the sampling-option validation and the engine;
- hand-written cases pin the status, error type and ``param`` of the classic mistakes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from support.servers import running_server

REQUEST_TIMEOUT_S = 60.0  # a request taking longer counts as a hang
MAX_BODY = 4 * 1024 * 1024


def assert_error_shape(r: httpx.Response | Any) -> dict[str, Any]:
    """OpenAI's error body: {"error": {"message": str, "type": str, "param": str|null,
    "code": str|null}} and nothing else."""
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    return err


def check_response(r: Any, what: str) -> None:
    assert r.status_code < 500, f"{what} -> {r.status_code}: {r.text[:500]}"
    if 400 <= r.status_code < 500:
        assert_error_shape(r)


# ---- schemathesis over the live OpenAPI document --------------------------------------------
# Driven through schemathesis's Python API (operation.as_strategy + hypothesis): its pytest
# loader for live schemas (`schemathesis.pytest.from_fixture`) sets `request.node._nodeid`,
# which pytest 9 no longer has.

OPERATIONS = [("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics"), ("GET", "/v1/models"),
              ("GET", "/v1/models/{model}"), ("POST", "/v1/chat/completions"),
              ("POST", "/v1/completions"), ("GET", "/v1/receipts/{receipt_id}")]
EXAMPLES_PER_MODE = 30


@pytest.fixture(scope="module")
def api_schema(server: str) -> Any:
    return schemathesis.openapi.from_url(server + "/openapi.json")


def test_the_fuzz_covers_every_operation(api_schema: Any) -> None:
    found = {(r.ok().method.upper(), r.ok().path) for r in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


# Schema-violating inputs exist only where the schema constrains something: the JSON bodies
# (the receipt id is any string, and the GETs take no parameters).
FUZZ = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + \
    [(m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"]


@pytest.mark.parametrize(("method", "path", "mode"), FUZZ,
                         ids=[f"{m} {p} {g.value}" for m, p, g in FUZZ])
def test_fuzzed_requests_get_no_5xx_and_openai_errors(api_schema: Any, server: str,
                                                      method: str, path: str,
                                                      mode: GenerationMode) -> None:
    operation = api_schema[path][method]
    statuses: Counter[int] = Counter()

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES_PER_MODE, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        r = case.call(base_url=server, timeout=REQUEST_TIMEOUT_S)
        statuses[r.status_code] += 1
        check_response(r, f"{case.method} {case.formatted_path} {str(case.body)[:300]}")
        if isinstance(case.body, dict) and "model" in case.body:
            case.body = {**case.body, "model": "tiny"}
            r = case.call(base_url=server, timeout=REQUEST_TIMEOUT_S)
            statuses[r.status_code] += 1
            check_response(r, f"{case.method} {case.formatted_path} {str(case.body)[:300]}")

    run()
    print(f"{method} {path} {mode.value}: {dict(statuses)}")
    if method == "POST" or "{" in path:  # a GET without parameters has one request only
        assert sum(statuses.values()) >= EXAMPLES_PER_MODE // 2, statuses


# ---- hand-written cases ---------------------------------------------------------------------

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": MSGS, "max_tokens": 2, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields}


# (path, JSON body, expected status, expected error param)
JSON_CASES: list[tuple[str, Any, int, str | None]] = [
    (CHAT, chat(messages="hi"), 400, "messages"),
    (CHAT, chat(max_tokens="ten"), 400, "max_tokens"),
    (CHAT, chat(temperature="hot"), 400, "temperature"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages.0.content"),
    (CHAT, chat(messages=[{"role": "function", "content": "x"}]), 400, "messages.0.role"),
    # a tool message answers an earlier call (the rule's check, verinfer.protocol.tools)
    (CHAT, chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "c1"}]), 400,
     "messages.tool_call_id"),
    (CHAT, chat(functions=[{"name": "f"}]), 400, "functions"),
    (CHAT, chat(stop=[1, 2]), 400, "stop"),
    (CHAT, chat(unknown_field=1), 400, "unknown_field"),
    (COMPLETIONS, completion(unknown_field=1), 400, "unknown_field"),
    (CHAT, chat(max_tokens=-1), 400, "max_tokens"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens"),
    (COMPLETIONS, completion(max_tokens=-5), 400, "max_tokens"),
    (CHAT, chat(max_tokens=10**30), 400, "max_tokens"),
    (CHAT, chat(n=10**6), 400, "n"),
    (CHAT, chat(n=0), 400, "n"),
    (COMPLETIONS, completion(n=10**6), 400, "n"),
    (CHAT, chat(logprobs=True, top_logprobs=100), 400, "top_logprobs"),
    (CHAT, chat(logprobs=True, top_logprobs=-1), 400, "top_logprobs"),
    (CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    (CHAT, chat(logprobs=[1]), 400, "logprobs"),
    (COMPLETIONS, completion(logprobs=-1), 400, "logprobs"),
    (COMPLETIONS, completion(logprobs=100), 400, "logprobs"),
    (CHAT, chat(messages=[]), 400, "messages"),
    (CHAT, {"model": "tiny"}, 400, "messages"),
    (CHAT, chat(temperature=-1), 400, "temperature"),
    (CHAT, chat(top_p=0), 400, "top_p"),
    (CHAT, chat(seed=-1), 400, "seed"),
    (CHAT, chat(seed=2**64), 400, "seed"),
    (CHAT, chat(top_k=-1), 400, "top_k"),
    (CHAT, chat(top_k=2**40, temperature=1), 400, "top_k"),
    (CHAT, chat(stop=["a"] * 1000), 400, "stop"),
    (CHAT, chat(prompt_commitments="0xzz"), 400, "prompt_commitments"),
    (CHAT, chat(messages=[{"role": "user", "content": "word " * 3000}]), 400, None),
    (COMPLETIONS, completion(prompt=[10**9]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[[]]), 400, "prompt"),
    (COMPLETIONS, completion(echo=True), 400, "echo"),
    (CHAT, chat(model="gpt-4"), 404, "model"),
    (COMPLETIONS, completion(model="gpt-4"), 404, "model"),
    (CHAT, [1, 2, 3], 400, None),
    (CHAT, "a string", 400, None),
    (CHAT, None, 400, None),
]


@pytest.fixture(scope="module")
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=REQUEST_TIMEOUT_S) as c:
        yield c


@pytest.mark.parametrize(("path", "body", "status", "param"), JSON_CASES,
                         ids=[f"{p.split('/')[2]}-{i}" for i, (p, *_) in
                              enumerate(JSON_CASES)])
def test_bad_json_bodies(http: httpx.Client, path: str, body: Any, status: int,
                         param: str | None) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    err = assert_error_shape(r)
    assert err["type"] == "invalid_request_error"
    if param is not None:  # a union member may be named after the field: "stop.str"
        assert err["param"] == param or err["param"].startswith(param + "."), err


def test_unknown_model_has_model_not_found_code(http: httpx.Client) -> None:
    r = http.post(CHAT, json=chat(model="no-such-model"))
    assert r.status_code == 404 and assert_error_shape(r)["code"] == "model_not_found"


@pytest.mark.parametrize("raw", [b"{not json", b"", b"{\"model\": \"tiny\",", b"\xff\xfe\x00",
                                 b"[" * 500 + b"]" * 500])
def test_non_json_bodies(http: httpx.Client, raw: bytes) -> None:
    r = http.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert assert_error_shape(r)["type"] == "invalid_request_error"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", ""])
def test_wrong_content_type(http: httpx.Client, content_type: str) -> None:
    r = http.post(CHAT, content=json.dumps(chat()).encode(),
                  headers={"content-type": content_type})
    assert r.status_code in (400, 415), r.text
    assert_error_shape(r)


def test_body_over_4_mib_is_413(http: httpx.Client) -> None:
    pad = " " * (MAX_BODY + 1)  # valid JSON once parsed: the limit must not depend on content
    r = http.post(CHAT, content=pad.encode() + json.dumps(chat()).encode(),
                  headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    assert_error_shape(r)
    assert http.get("/health").status_code == 200


def test_chunked_body_over_4_mib_is_413(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b" " * (1024 * 1024)
        yield json.dumps(chat()).encode()

    r = http.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    assert_error_shape(r)
    assert http.get("/health").status_code == 200


def test_unencodable_option_is_rejected_before_a_stream_starts(http: httpx.Client) -> None:
    r = http.post(CHAT, json=chat(top_k=2**40, temperature=1, stream=True))
    assert r.status_code == 400, r.text[:300]
    assert assert_error_shape(r)["param"] == "top_k"


def test_wrong_method_and_unknown_route(http: httpx.Client) -> None:
    r = http.get(CHAT)
    assert r.status_code == 405
    assert_error_shape(r)
    r = http.post("/v1/no/such/route", json={})
    assert r.status_code == 404
    assert_error_shape(r)


def test_receipt_ids(http: httpx.Client) -> None:
    r = http.get("/v1/receipts/0x" + "ab" * 32)
    assert r.status_code == 404
    assert assert_error_shape(r)["code"] == "receipt_not_found"
    for bad in ("nonsense", "0x" + "zz" * 32, "0x" + "ab" * 31, "ab" * 32, "0x" + "ab" * 33,
                "0x" + "٠" * 64):
        r = http.get(f"/v1/receipts/{bad}")
        assert r.status_code == 400, (bad, r.text)
        assert assert_error_shape(r)["param"] == "receipt_id"


def test_deeply_nested_json_does_not_kill_the_server(tiny_path: Any, tmp_path: Any) -> None:
    # Its own server: before f964eed this request segfaulted the process (py_ecc raises the
    # recursion limit to 100000 and the stdlib JSON decoder overflowed the C stack).
    from support.servers import operator_init

    operator_init(tmp_path / "op")
    with running_server(tiny_path, "--operator-dir", str(tmp_path / "op")) as base:
        depth = 100_000  # 200 kB, far below the body limit
        try:
            r = httpx.post(base + CHAT, content=b"[" * depth + b"]" * depth,
                           headers={"content-type": "application/json"}, timeout=30)
            status: int | None = r.status_code
        except httpx.HTTPError:
            status = None  # the connection died with the server
        alive = True
        try:
            httpx.get(base + "/health", timeout=5)
        except httpx.HTTPError:
            alive = False
        assert status == 400 and alive, (status, alive)
