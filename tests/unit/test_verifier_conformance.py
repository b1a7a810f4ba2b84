"""The verifier derives a seedless request's seed exactly as the operator does (from the model
id, prompt ids and decode policy, never from the body bytes): otherwise an honest streamed or
seedless answer would be voted nonconformant and slashed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from verinfer.engine.engine import Engine
from verinfer.operator.generation import SamplingOptions, ServingBase
from verinfer.receipts.canonical import ExecRequest
from verinfer.verifier.conformance import body_prompts, request_problems
from verinfer.verifier.evidence import request_for_body


@pytest.mark.parametrize("extra", [
    {}, {"stream": True}, {"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 5},
    {"stop": ["\n"], "stream": True, "stream_options": {"include_usage": True}},
])
def test_seedless_requests_get_the_operators_seed(tiny_engine: Engine,
                                                  extra: dict[str, object]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "no seed here"}],
            "max_tokens": 6, **extra}
    raw = json.dumps(body).encode()
    prompt = body_prompts(tiny_engine.tokenizer, raw)[0]
    def num(k: str) -> float | None:  # the server's schema parses these as floats
        v = body.get(k)
        return None if v is None else float(v)  # type: ignore[arg-type]

    opt = SamplingOptions(max_tokens=6, temperature=num("temperature"), top_p=num("top_p"),
                          top_k=body.get("top_k"), stop=body.get("stop"),  # type: ignore[arg-type]
                          seed=None, n=None, top_logprobs=None, prompt_commitments=None)
    job = ServingBase(tiny_engine, "m").jobs([prompt], opt)[0]
    served = ExecRequest.from_engine(tiny_engine, job.prompt_ids, job.params)
    assert request_problems(tiny_engine.tokenizer, served, raw) == []
    assert request_for_body(tiny_engine, raw).seed == job.params.seed


def test_another_seed_for_a_seedless_body_is_still_caught(tiny_engine: Engine) -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "max_tokens": 4}).encode()
    req = request_for_body(tiny_engine, raw)
    bad = replace(req, seed=req.seed ^ 1)
    assert any("seed" in p for p in request_problems(tiny_engine.tokenizer, bad, raw))
