"""The OpenAI request surface of issue 34 in the request rule (verinfer.protocol.request_rule):
content parts, message names, transport-only fields, the options accepted only in their neutral
form, and the client nonce folded into a derived seed — with the real tiny tokenizer, and a
ChatML tokenizer whose template does or does not write names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from verinfer.engine.chat import ChatMessage, TokenizerPrompts, render_chat
from verinfer.engine.engine import Engine
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.bytelevel import bytes_to_unicode
from verinfer.engine.tokenizer.load import tokenizer_from_tokenizer_json
from verinfer.errors import InvalidRequestError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.request_rule import ChatTurn, exec_requests, parse_body

USER = {"role": "user", "content": "hi there"}


def _reqs(engine: Engine, body: dict[str, Any]) -> tuple[ExecRequest, ...]:
    return exec_requests(json.dumps(body).encode(), served_model(engine),
                         prompt_tokenizer(engine))


def _chat(engine: Engine, messages: list[dict[str, Any]], **kw: Any) -> tuple[ExecRequest, ...]:
    return _reqs(engine, {"model": "m", "messages": messages, "max_tokens": 4, **kw})


# ---- content parts ----------------------------------------------------------------------------
def test_text_parts_are_the_string_they_join_to(tiny_engine: Engine) -> None:
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
    assert _chat(tiny_engine, [{"role": "user", "content": parts}]) == \
        _chat(tiny_engine, [{"role": "user", "content": "hi\nthere"}])
    one = [{"type": "text", "text": "hi there"}]
    assert _chat(tiny_engine, [{"role": "system", "content": one}, USER]) == \
        _chat(tiny_engine, [{"role": "system", "content": "hi there"}, USER])


@pytest.mark.parametrize(("content", "match"), [
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}],
     "content part type 'image_url' is not supported"),
    ([{"type": "text", "text": "x"}, {"type": "input_audio", "input_audio": {}}],
     "content part type 'input_audio' is not supported"),
    ([{"type": "file", "file": {"file_id": "f"}}], "content part type 'file'"),
    ([], "non-empty array of content parts"),
    ([{"text": "x"}], "object with a type"),
    ([{"type": "text", "text": "x", "cache_control": {}}], "exactly type and text"),
    ([{"type": "text", "text": 3}], "must be a string"),
])
def test_other_parts_are_refused_by_name(tiny_engine: Engine, content: Any, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as e:
        _chat(tiny_engine, [{"role": "user", "content": content}])
    assert e.value.param is not None and e.value.param.startswith("messages.content")


# ---- message names ----------------------------------------------------------------------------
def test_a_name_the_format_cannot_show_is_refused_not_dropped(tiny_engine: Engine) -> None:
    # the tiny model's turn format (Gemma's) has no place for a name: before, the name was
    # accepted and left out of the prompt and of the request hash
    with pytest.raises(InvalidRequestError, match="does not use message names"):
        _chat(tiny_engine, [{**USER, "name": "alice"}])


@pytest.mark.parametrize("name", ["", "a b", "<|im_start|>", "x" * 65, "é"])
def test_names_outside_openais_charset_are_refused(tiny_engine: Engine, name: str) -> None:
    with pytest.raises(InvalidRequestError, match="letters, digits") as e:
        _chat(tiny_engine, [{**USER, "name": name}])
    assert e.value.param == "messages.name"


NAMED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}"
         "{% if m.name is defined %} ({{ m['name'] }}){% endif %}{{ '\\n' + m['content'] }}"
         "<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
USER_NAMES_ONLY = ("{% for m in messages %}<|im_start|>{{ m['role'] }}"
                   "{% if m.name is defined and m.role == 'user' %} ({{ m['name'] }}){% endif %}"
                   "{{ '\\n' + m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chatml(tmp: Path, template: str) -> Tokenizer:
    alphabet = sorted(set(bytes_to_unicode().values()))
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)},
                                              merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tmp.mkdir(parents=True, exist_ok=True)
    backend.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "add_bos_token": False, "chat_template": template}))
    return tokenizer_from_tokenizer_json(tmp / "tokenizer.json")


def test_a_template_that_writes_names_renders_them(tmp_path: Path) -> None:
    tok = _chatml(tmp_path, NAMED)
    prompts = TokenizerPrompts(tok)
    named = prompts.chat([ChatTurn("user", "hi", "alice")])
    assert tok.decode(named, skip_special=False) == \
        "<|im_start|>user (alice)\nhi<|im_end|>\n<|im_start|>assistant\n"
    # bound: another name is another prompt (and so another ExecRequest and request hash)
    assert prompts.chat([ChatTurn("user", "hi", "bob")]) != named
    assert prompts.chat([ChatTurn("user", "hi")]) != named


def test_a_template_that_ignores_a_name_refuses_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="does not use message names"):
        render_chat(_chatml(tmp_path / "a", CHATML), [ChatMessage("user", "hi", "alice")])
    # one name dropped is one too many: the template writes user names only
    tok = _chatml(tmp_path / "b", USER_NAMES_ONLY)
    assert render_chat(tok, [ChatMessage("user", "hi", "alice")])
    with pytest.raises(InvalidRequestError, match="does not use message names"):
        render_chat(tok, [ChatMessage("system", "be brief", "boss"),
                          ChatMessage("user", "hi", "alice")])


# ---- transport-only fields and neutral options -------------------------------------------------
TRANSPORT: dict[str, Any] = {
    "store": False, "metadata": {"team": "search", "run": "7"}, "service_tier": "auto",
    "user": "u-1", "prompt_cache_key": "k", "safety_identifier": "sid-9",
    "stream_options": {"include_usage": True}, "stream": True,
}


def test_transport_only_fields_change_no_exec_request(tiny_engine: Engine) -> None:
    base = _chat(tiny_engine, [USER], temperature=0.8)
    for name, value in TRANSPORT.items():
        extra = {name: value}
        if name == "stream_options":
            extra["stream"] = True
        assert _chat(tiny_engine, [USER], temperature=0.8, **extra) == base, name
    neutral = {"response_format": {"type": "text"}, "parallel_tool_calls": False,
               "modalities": ["text"]}
    assert _chat(tiny_engine, [USER], temperature=0.8, **TRANSPORT, **neutral) == base
    text = {"model": "m", "prompt": "once", "max_tokens": 3}
    assert _reqs(tiny_engine, {**text, **TRANSPORT}) == _reqs(tiny_engine, text)


@pytest.mark.parametrize(("extra", "param", "match"), [
    ({"reasoning_effort": "low"}, "reasoning_effort", "no reasoning mode"),
    ({"modalities": ["text", "audio"]}, "modalities", "'audio' is not supported"),
    ({"modalities": []}, "modalities", "non-empty"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"service_tier": "gold"}, "service_tier", "one of"),
    ({"metadata": {"k": 1}}, "metadata", "string values"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "up to 16"),
    ({"store": "no"}, "store", "boolean"),
    ({"prompt_cache_key": 5}, "prompt_cache_key", "string"),
])
def test_non_neutral_forms_are_refused_by_name(tiny_engine: Engine, extra: dict[str, Any],
                                               param: str, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as e:
        _chat(tiny_engine, [USER], **extra)
    assert e.value.param == param


def test_chat_only_options_are_not_completions_fields() -> None:
    with pytest.raises(InvalidRequestError, match="unrecognized request argument"):
        parse_body(b'{"model":"m","prompt":"x","response_format":{"type":"text"}}',
                   "completions")


# ---- the client nonce -----------------------------------------------------------------------
def test_a_nonce_gives_a_fresh_bound_seed_and_no_nonce_keeps_the_old_one(
        tiny_engine: Engine) -> None:
    plain = _chat(tiny_engine, [USER], temperature=1)
    assert plain == _chat(tiny_engine, [USER], temperature=1)  # same body, same seed
    seeds = {_chat(tiny_engine, [USER], temperature=1, nonce=f"n{i}")[0].seed for i in range(8)}
    assert len(seeds) == 8 and plain[0].seed not in seeds
    # the same nonce re-derives the same seed: what the verifier does from the sealed body
    assert _chat(tiny_engine, [USER], temperature=1, nonce="n3") == \
        _chat(tiny_engine, [USER], temperature=1, nonce="n3")
    # n > 1: every choice's seed moves with the nonce
    a = _chat(tiny_engine, [USER], temperature=1, n=2, nonce="a")
    b = _chat(tiny_engine, [USER], temperature=1, n=2, nonce="b")
    assert {r.seed for r in a}.isdisjoint({r.seed for r in b})
    text = {"model": "m", "prompt": "once", "max_tokens": 3, "temperature": 1}
    assert _reqs(tiny_engine, {**text, "nonce": "x"})[0].seed != _reqs(tiny_engine, text)[0].seed


def test_seedless_bodies_keep_the_seed_they_had_before_the_nonce() -> None:
    # pinned: a receipt issued before the nonce existed must still verify, so a body without
    # one derives its seed by the old formula, byte for byte
    from verinfer.protocol.request_rule import request_seed

    policy = parse_body(b'{"model":"m","messages":[{"role":"user","content":"x"}],'
                        b'"temperature":0.5,"stop":["\\n"]}', "chat").policy
    assert request_seed(b"\x11" * 32, [1, 2, 3], 7, policy) == 7446315923706030671


@pytest.mark.parametrize(("extra", "match"), [
    ({"nonce": ""}, "1 to 128 printable ASCII"), ({"nonce": "a b"}, "printable ASCII"),
    ({"nonce": "x" * 129}, "1 to 128"), ({"nonce": 5}, "must be a string"),
    ({"nonce": "n", "seed": 1}, "seed or nonce, not both"),
])
def test_bad_nonces_are_refused(tiny_engine: Engine, extra: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as e:
        _chat(tiny_engine, [USER], **extra)
    assert e.value.param == "nonce"
