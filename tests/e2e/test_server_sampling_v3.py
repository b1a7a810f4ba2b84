"""Sampling rule vi-sample-v3 through the real server and the official `openai` SDK (issue 34):
presence/frequency penalties, logit_bias and structured outputs (response_format json_object,
json_schema, ``chat.completions.parse``) are bound in the receipt's ExecRequest, and the real
verifier job, given the published ciphertext and the epoch key, re-executes each receipt and
judges it ``match``. The tiny model is random: it shows the grammar holds (every finished
answer is valid under its schema), not that the answers are good (SmolLM2:
test_structured_outputs_smollm2.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import LengthFinishReasonError, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field

from support.receipt_judge import assert_reproduced as _reproduced
from support.receipt_judge import epoch_private_key
from support.receipt_judge import verification as _v
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.epoch_keys import EpochPrivateKey

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "tell me something"}]


@pytest.fixture(scope="module")
def epoch_key(operator_dir: Path) -> EpochPrivateKey:
    return epoch_private_key(operator_dir)


def test_penalties_and_logit_bias_bound_and_reproduced(client: OpenAI, operator_dir: Path,
                                                       tiny_path: Path,
                                                       epoch_key: EpochPrivateKey) -> None:
    plain = client.chat.completions.create(model="tiny", messages=CHAT,
                                           max_tokens=12, temperature=0.9, seed=3)
    r = client.chat.completions.create(model="tiny", messages=CHAT,
                                       max_tokens=12, temperature=0.9, seed=3,
                                       presence_penalty=1.5, frequency_penalty=0.75,
                                       logit_bias={"40": 6, "41": -100})
    req = ExecRequest.from_json(_v(r)["exec_request"])
    assert req.sampler == "vi-sample-v3" and "0x" + req.hash.hex() == _v(r)["req_hash"]
    assert (req.presence_penalty, req.frequency_penalty) == (1.5, 0.75)
    assert req.logit_bias == ((40, 6.0), (41, -100.0))
    assert ExecRequest.from_json(_v(plain)["exec_request"]).sampler is None
    assert r.choices[0].message.content != plain.choices[0].message.content
    _reproduced(_v(r), operator_dir, tiny_path, epoch_key)
    _reproduced(_v(plain), operator_dir, tiny_path, epoch_key)  # v2 still verifies


def test_logit_bias_forces_a_token_greedy(client: OpenAI, operator_dir: Path, tiny_path: Path,
                                          epoch_key: EpochPrivateKey) -> None:
    r = client.chat.completions.create(model="tiny", messages=CHAT,
                                       max_tokens=6, temperature=0, logit_bias={"60": 100})
    res = _v(r)["exec_result"]
    assert res["output_token_ids"] == [60] * 6 and r.choices[0].finish_reason == "length"
    _reproduced(_v(r), operator_dir, tiny_path, epoch_key)


def test_streamed_penalties_reproduced(client: OpenAI, operator_dir: Path, tiny_path: Path,
                                       epoch_key: EpochPrivateKey) -> None:
    chunks = list(client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=10, temperature=1.1,
        seed=8, frequency_penalty=-1.0, stream=True))
    v = _v(chunks[-1])
    assert ExecRequest.from_json(v["exec_request"]).frequency_penalty == -1.0
    _reproduced(v, operator_dir, tiny_path, epoch_key)


@pytest.mark.parametrize(("body", "param"), [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # not a token id of the model
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "format": "nope"}}}}, "response_format"),
])
def test_bounds_are_openai_shaped_400s(server: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": CHAT, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_json_object_is_always_valid_json(client: OpenAI, operator_dir: Path,
                                          tiny_path: Path, epoch_key: EpochPrivateKey) -> None:
    finished = 0
    for seed in range(6):
        r = client.chat.completions.create(model="tiny", messages=CHAT,
                                           max_tokens=120, temperature=1.0, seed=seed,
                                           response_format={"type": "json_object"})
        req = ExecRequest.from_json(_v(r)["exec_request"])
        assert req.grammar is not None and req.sampler == "vi-sample-v3"
        content = r.choices[0].message.content or ""
        if r.choices[0].finish_reason == "stop":
            finished += 1
            assert isinstance(json.loads(content), dict), content
        else:  # cut by max_tokens: a prefix of a valid object
            assert content.startswith("{")
        if seed < 2:
            _reproduced(_v(r), operator_dir, tiny_path, epoch_key)
    assert finished >= 3


class Pet(BaseModel):
    name: str = Field(max_length=10)  # a random model's strings would run to max_tokens
    legs: int
    indoor: bool


def test_parse_returns_the_pydantic_model(client: OpenAI, operator_dir: Path, tiny_path: Path,
                                          epoch_key: EpochPrivateKey) -> None:
    parsed: list[Any] = []
    for seed in range(6):
        try:
            r = client.chat.completions.parse(model="tiny", messages=CHAT,
                                              response_format=Pet, max_tokens=120, seed=seed,
                                              temperature=0.7)
        except LengthFinishReasonError:
            continue  # cut by max_tokens (the SDK refuses to parse a prefix)
        pet = r.choices[0].message.parsed
        assert isinstance(pet, Pet) and len(pet.name) <= 10
        parsed.append(r)
    assert len(parsed) >= 3
    v = _v(parsed[0])
    req = ExecRequest.from_json(v["exec_request"])
    assert req.grammar is not None and '"legs"' in req.grammar.spec
    _reproduced(v, operator_dir, tiny_path, epoch_key)
