"""vi-sample-v3 in the engine (tiny model): decode and replay agree for penalties, logit_bias
and grammar masks, alone or batched with other requests; a claim the grammar forbids, or one
drawn without the penalties, does not replay; every finished grammar answer is valid under its
schema."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema_rs
import pytest

from verinfer.engine.engine import Engine
from verinfer.errors import InvalidRequestError
from verinfer.protocol.grammar import compile_grammar, response_format_spec
from verinfer.protocol.sampling_params import SamplingParams

PROMPT = [2, 300, 301, 302, 303]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
          "properties": {"a": {"type": "integer"}, "b": {"type": "array", "maxItems": 3,
                                                          "items": {"type": "boolean"}}}}


def _grammar(schema: dict[str, object] | None = None) -> SamplingParams:
    rf = ({"type": "json_object"} if schema is None else
          {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    spec = response_format_spec(rf)
    assert spec is not None
    return SamplingParams(max_tokens=80, temperature=0.8, seed=1, grammar=compile_grammar(spec))


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=24, temperature=0.9, seed=4, presence_penalty=1.2,
                   frequency_penalty=0.6),
    SamplingParams(max_tokens=24, temperature=0.0, logit_bias=((40, 60.0), (41, -100.0))),
    SamplingParams(max_tokens=24, temperature=1.2, seed=9, top_k=30, top_p=0.9,
                   frequency_penalty=-0.8, logit_bias=((100, 2.5),)),
])
def test_decode_replays_and_batches(tiny_engine: Engine, params: SamplingParams) -> None:
    alone = tiny_engine.generate(PROMPT, params)
    futs = [tiny_engine.submit([*PROMPT[:3], 400 + i], replace(params, seed=i))
            for i in range(3)]
    batched = tiny_engine.submit(PROMPT, params)
    assert batched.result().token_ids == alone.token_ids
    for f in futs:
        f.result()
    rr = tiny_engine.replay(PROMPT, alone.token_ids, params)
    assert rr.matches and rr.logit_digest == alone.logit_digest
    plain = replace(params, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=())
    assert tiny_engine.generate(PROMPT, plain).token_ids != alone.token_ids  # options matter
    assert not tiny_engine.replay(PROMPT, alone.token_ids, plain).matches


def test_grammar_output_is_valid_and_replays(tiny_engine: Engine) -> None:
    validator = jsonschema_rs.validator_for(SCHEMA)
    finished = 0
    for seed in range(6):
        params = replace(_grammar(SCHEMA), seed=seed)
        gen = tiny_engine.generate(PROMPT, params)
        if gen.finish_reason == "stop":
            finished += 1
            validator.validate(json.loads(gen.text))
        assert tiny_engine.replay(PROMPT, gen.token_ids, params).matches
    assert finished >= 4
    # without the grammar the same seed writes no JSON
    free = replace(_grammar(SCHEMA), grammar=None)
    with pytest.raises(ValueError):
        json.loads(tiny_engine.generate(PROMPT, free).text)


def test_claim_outside_the_grammar_does_not_replay(tiny_engine: Engine) -> None:
    params = _grammar()
    gen = tiny_engine.generate(PROMPT, params)
    assert gen.text.startswith("{")
    forged = list(gen.token_ids)
    forged[0] = tiny_engine.tokenizer.encode("x", add_bos=False)[0]  # not how JSON starts
    rr = tiny_engine.replay(PROMPT, forged, params)
    assert not rr.matches and rr.first_mismatch == 0


def test_bias_outside_vocabulary_refused(tiny_engine: Engine) -> None:
    vocab = tiny_engine.config.vocab_size
    with pytest.raises(InvalidRequestError) as e:
        tiny_engine.generate(PROMPT, SamplingParams(logit_bias=((vocab, 1.0),)))
    assert e.value.param == "logit_bias"


def test_grammar_named_with_another_engine_refused(tiny_engine: Engine) -> None:
    params = _grammar()
    assert params.grammar is not None
    for g in (replace(params.grammar, engine="llguidance 0.0.1"),
              replace(params.grammar, compiled=b"\x00" * 32)):
        with pytest.raises(InvalidRequestError) as e:
            tiny_engine.generate(PROMPT, replace(params, grammar=g))
        assert e.value.param == "response_format"
