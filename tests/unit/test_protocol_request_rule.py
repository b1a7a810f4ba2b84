"""The request rule (verinfer.protocol.request_rule) on its own: number spellings, defaults,
limits and seeds, with the real tiny tokenizer and chat template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verinfer.engine.engine import Engine
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.errors import ContextLengthExceededError, InvalidRequestError
from verinfer.operator.chat.protocol import ChatCompletionRequest
from verinfer.operator.completions.protocol import CompletionRequest
from verinfer.protocol import limits as L
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.jsonsafe import UntrustedJsonError
from verinfer.protocol.numbers import canonical_float, canonical_int
from verinfer.protocol.request_rule import (
    FIELDS,
    choice_seed,
    exec_requests,
    plan_request,
)

CHAT = '{"model":"m","messages":[{"role":"user","content":"hi there"}]%s}'
TEXT = '{"model":"m","prompt":"once upon a time"%s}'


def _reqs(engine: Engine, template: str, extra: str = "") -> tuple[ExecRequest, ...]:
    return exec_requests(template.replace("%s", extra).encode(), served_model(engine),
                         prompt_tokenizer(engine))


# ---- (a) signed zeros and (b) integers written as floats ------------------------------------
@pytest.mark.parametrize("spelling", ["0", "0.0", "-0.0", "-0", "-0e5", "0e-3", "-0.000E+2"])
def test_every_spelling_of_zero_temperature_is_one_request(tiny_engine: Engine,
                                                          spelling: str) -> None:
    # seedless, so the seed is derived from the policy: the signed-zero attack's target
    want = _reqs(tiny_engine, CHAT, ',"max_tokens":5,"temperature":0')
    got = _reqs(tiny_engine, CHAT, f',"max_tokens":5,"temperature":{spelling}')
    assert got == want and got[0].hash == want[0].hash
    assert str(got[0].temperature) == "0.0"  # +0.0: no sign survives into the ExecRequest


@pytest.mark.parametrize(("a", "b"), [
    (',"temperature":1', ',"temperature":1.0'), (',"top_p":1', ',"top_p":1.0'),
    (',"top_p":1', ',"top_p":10e-1'), (',"max_tokens":8', ',"max_tokens":8.0'),
    (',"max_tokens":8', ',"max_tokens":8e0'), (',"n":2', ',"n":2.0'),
    (',"seed":7', ',"seed":7.0'), (',"top_k":3', ',"top_k":3.0'),
    (',"frequency_penalty":0', ',"frequency_penalty":-0.0'),
    (',"presence_penalty":0', ',"presence_penalty":-0e1'),
])
def test_ints_as_floats_and_floats_as_ints_map_identically(tiny_engine: Engine, a: str,
                                                           b: str) -> None:
    assert _reqs(tiny_engine, CHAT, a) == _reqs(tiny_engine, CHAT, b)


@pytest.mark.parametrize("extra", [
    ',"max_tokens":8.5', ',"max_tokens":true', ',"n":"2"', ',"seed":1e300',
    ',"seed":9007199254740994.0', ',"temperature":true', ',"temperature":NaN',
    ',"temperature":Infinity', ',"temperature":1e999', ',"seed":-1', ',"top_p":0',
    ',"top_p":-0.0', ',"temperature":2.0000000001', ',"n":9', ',"n":0',
    ',"stop":["a","b","c","d","e"]', ',"stop":""', ',"stop":"\\ud800"',
    ',"frequency_penalty":2.5', ',"logit_bias":{"01":1}', ',"unknown":1',
    ',"top_logprobs":2', ',"logprobs":true,"top_logprobs":21',
    ',"stream_options":{"include_usage":true}', ',"prompt_commitments":"0x12"',
    ',"max_tokens":0',
])
def test_invalid_bodies_are_refused_with_a_typed_error(tiny_engine: Engine, extra: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        _reqs(tiny_engine, CHAT, extra)
    assert e.value.param or isinstance(e.value, UntrustedJsonError)


def test_number_helpers() -> None:
    assert str(canonical_float(-0.0, "t")) == "0.0" and canonical_float(1, "t") == 1.0
    assert canonical_int(8.0, "m") == 8 and type(canonical_int(8.0, "m")) is int
    assert canonical_int(-0.0, "m") == 0
    for bad in (True, 8.5, "8", None, 2.0**60):
        with pytest.raises(InvalidRequestError):
            canonical_int(bad, "m")
    for bad in (False, "1", float("nan"), float("inf"), 10**400, None):
        with pytest.raises(InvalidRequestError):
            canonical_float(bad, "t")


# ---- (c) omitted vs explicit defaults -------------------------------------------------------
@pytest.mark.parametrize(("omitted", "explicit"), [
    ("", ',"temperature":1,"top_p":1,"top_k":0,"n":1,"stop":[],"frequency_penalty":0'),
    (',"temperature":null,"top_p":null,"n":null,"seed":null,"stop":null', ""),
    ("", ',"stream":false,"logprobs":false,"user":"u"'),
])
def test_omitted_null_and_explicit_defaults_are_one_request(tiny_engine: Engine, omitted: str,
                                                            explicit: str) -> None:
    assert _reqs(tiny_engine, CHAT, omitted) == _reqs(tiny_engine, CHAT, explicit)


def test_omitted_max_tokens_is_fixed_by_the_rule(tiny_engine: Engine) -> None:
    chat = _reqs(tiny_engine, CHAT)[0]
    assert chat.max_tokens == L.DEFAULT_CHAT_MAX_TOKENS
    assert chat == _reqs(tiny_engine, CHAT, f',"max_tokens":{L.DEFAULT_CHAT_MAX_TOKENS}')[0]
    assert chat == _reqs(tiny_engine, CHAT,
                         f',"max_completion_tokens":{L.DEFAULT_CHAT_MAX_TOKENS}')[0]
    text = _reqs(tiny_engine, TEXT)[0]
    assert text.max_tokens == L.DEFAULT_COMPLETION_MAX_TOKENS
    assert text == _reqs(tiny_engine, TEXT, ',"max_tokens":16')[0]


def test_omitted_max_tokens_shrinks_to_the_models_context_not_the_servers(
        tiny_engine: Engine) -> None:
    ctx = tiny_engine.config.context_length
    model = served_model(tiny_engine)
    assert model.context_length == ctx  # the model's, whatever window a server runs
    prompts = prompt_tokenizer(tiny_engine)
    ids = [5] * (ctx - 10)
    req = exec_requests({"model": "m", "prompt": ids, "max_tokens": None,
                         "temperature": 0}, model, prompts)[0]
    assert req.max_tokens == 10  # min(16, room)
    with pytest.raises(ContextLengthExceededError):
        exec_requests({"model": "m", "prompt": ids, "max_tokens": 11}, model, prompts)
    with pytest.raises(ContextLengthExceededError):
        exec_requests({"model": "m", "prompt": [5] * ctx}, model, prompts)


def test_max_completion_tokens_wins_over_max_tokens(tiny_engine: Engine) -> None:
    r = _reqs(tiny_engine, CHAT, ',"max_tokens":9,"max_completion_tokens":4')[0]
    assert r.max_tokens == 4


# ---- seeds -----------------------------------------------------------------------------------
def test_each_choice_has_exactly_one_seed(tiny_engine: Engine) -> None:
    given = _reqs(tiny_engine, CHAT, ',"seed":7,"n":4')
    assert [r.seed for r in given] == [choice_seed(7, i) for i in range(4)]
    assert given[0].seed == 7 and len({r.seed for r in given}) == 4
    derived = _reqs(tiny_engine, CHAT, ',"n":3')
    assert len({r.seed for r in derived}) == 3
    assert derived == _reqs(tiny_engine, CHAT, ',"n":3')  # no randomness, no operator input


def test_seed_depends_on_the_policy_but_never_on_transport(tiny_engine: Engine) -> None:
    base = _reqs(tiny_engine, CHAT, ',"max_tokens":6')[0].seed
    for transport in (',"stream":true', ',"stream":true,"stream_options":{"include_usage":true}',
                      ',"user":"someone"', ',"logprobs":true,"top_logprobs":2'):
        assert _reqs(tiny_engine, CHAT, ',"max_tokens":6' + transport)[0].seed == base
    for policy in (',"temperature":0.5', ',"top_p":0.9', ',"top_k":4', ',"stop":"x"'):
        assert _reqs(tiny_engine, CHAT, ',"max_tokens":6' + policy)[0].seed != base
    assert _reqs(tiny_engine, CHAT, ',"max_tokens":7')[0].seed != base


def test_unicode_stop_strings_survive_exactly(tiny_engine: Engine) -> None:
    stops = ["é", "\u00e9", "e\u0301", "🙂", "\n\n"]
    r = _reqs(tiny_engine, CHAT, ',"stop":' + json.dumps(stops[:4]))[0]
    assert r.stop == tuple(stops[:4]) and "é" in r.stop and "e\u0301" in r.stop  # no NFC


def test_completions_prompt_forms(tiny_engine: Engine) -> None:
    one = _reqs(tiny_engine, TEXT)
    assert len(one) == 1
    many = exec_requests({"model": "m", "prompt": ["a", [3, 4.0], "b"], "n": 2},
                         served_model(tiny_engine), prompt_tokenizer(tiny_engine))
    assert len(many) == 6 and many[2].prompt_token_ids == (3, 4)
    bads: list[object] = [[], [[]], [3, "a"], [True], [10**6], {"x": 1},
                          ["a"] * (L.MAX_PROMPTS + 1)]
    for bad in bads:
        with pytest.raises(InvalidRequestError):
            exec_requests({"model": "m", "prompt": bad}, served_model(tiny_engine),
                          prompt_tokenizer(tiny_engine))


def test_prompt_text_is_bounded_before_tokenizing(tiny_engine: Engine) -> None:
    class Refuse:
        def chat(self, messages: Any) -> list[int]:
            raise AssertionError("tokenized an oversized body")

        text = chat

    body = {"model": "m", "messages": [{"role": "user",
                                        "content": "x" * (L.MAX_PROMPT_CHARS + 1)}]}
    with pytest.raises(InvalidRequestError):
        plan_request(body, "chat", served_model(tiny_engine), Refuse())
    many = {"model": "m", "messages": [{"role": "user", "content": "x"}] * (L.MAX_MESSAGES + 1)}
    with pytest.raises(InvalidRequestError):
        plan_request(many, "chat", served_model(tiny_engine), Refuse())


def test_the_api_models_declare_exactly_the_rules_fields() -> None:
    assert set(ChatCompletionRequest.model_fields) == FIELDS["chat"]
    assert set(CompletionRequest.model_fields) == FIELDS["completions"]


def test_the_api_models_read_numbers_as_the_rule_does() -> None:
    r = ChatCompletionRequest.model_validate_json(
        CHAT.replace("%s", ',"temperature":-0.0,"max_tokens":8.0,"n":2.0,"seed":7e0'))
    assert str(r.temperature) == "0.0" and (r.max_tokens, r.n, r.seed) == (8, 2, 7)
    c = CompletionRequest.model_validate({"model": "m", "prompt": [1.0, 2.0]})
    assert c.prompt == [1, 2]


def test_a_repeated_key_is_refused_not_resolved(tiny_engine: Engine) -> None:
    # json.loads keeps the last value, other readers the first: one body, two meanings
    with pytest.raises(UntrustedJsonError):
        _reqs(tiny_engine, CHAT, ',"temperature":0,"temperature":2')
    with pytest.raises(UntrustedJsonError):
        _reqs(tiny_engine, '{"model":"m","messages":[{"role":"user","content":"a",'
                           '"content":"b"}]%s}')
