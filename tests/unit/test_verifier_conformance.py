"""The verifier judges conformance with the operator's own rule: a request the serving code
plans from a body is conformant for that body (seedless, streamed, any spelling of its numbers),
and any departure from it — seed, decode policy, output limit, prompt — is caught."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from verinfer.engine.engine import Engine
from verinfer.operator.generation import ServingBase
from verinfer.protocol.exec_request import ExecRequest
from verinfer.testing.evidence import request_for_body
from verinfer.verifier.conformance import request_problems


def _served(engine: Engine, body: dict[str, object]) -> tuple[bytes, list[ExecRequest]]:
    raw = json.dumps(body).encode()
    jobs = ServingBase(engine, "m").jobs(raw, "chat" if "messages" in body else "completions")
    return raw, [j.request for j in jobs]


@pytest.mark.parametrize("extra", [
    {}, {"stream": True}, {"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 5},
    {"stop": ["\n"], "stream": True, "stream_options": {"include_usage": True}},
    {"temperature": -0.0}, {"n": 3, "seed": 7}, {"n": 2}, {"max_tokens": 6.0, "top_p": 1},
])
def test_what_the_server_plans_is_conformant(tiny_engine: Engine,
                                             extra: dict[str, object]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "no seed here"}],
            "max_tokens": 6, **extra}
    raw, served = _served(tiny_engine, body)
    for req in served:
        assert request_problems(tiny_engine, req, raw) == []
    assert request_for_body(tiny_engine, raw) == served[0]


def test_completions_with_several_prompts_are_conformant_per_choice(tiny_engine: Engine) -> None:
    raw, served = _served(tiny_engine, {"model": "m", "prompt": ["a b", [5, 6, 7]], "n": 2,
                                        "temperature": 0.5})
    assert len(served) == 4 and len({r.seed for r in served}) == 4
    assert all(request_problems(tiny_engine, r, raw) == [] for r in served)


@pytest.mark.parametrize("change", [
    {"seed": 12345}, {"temperature": 0.5}, {"top_p": 0.5}, {"top_k": 3}, {"max_tokens": 3},
    {"stop": ("x",)}, {"ignore_eos": True}, {"prompt_token_ids": (1, 2, 3)},
    {"prompt_commitments": b"\x01" * 32},
])
def test_every_departure_is_caught_and_named(tiny_engine: Engine,
                                             change: dict[str, object]) -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "max_tokens": 4}).encode()
    req = request_for_body(tiny_engine, raw)
    bad = replace(req, **change)
    problems = request_problems(tiny_engine, bad, raw)
    assert len(problems) == 1 and next(iter(change)) in problems[0]


def test_a_body_an_honest_server_refuses_is_nonconformant(tiny_engine: Engine) -> None:
    ok = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                     "max_tokens": 4}).encode()
    req = request_for_body(tiny_engine, ok)
    for body in (b"not json", b"[1]", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "x"}], "max_tokens": 4, "temperature": 3}).encode()):
        problems = request_problems(tiny_engine, req, body)
        assert problems and "refuses" in problems[0]
