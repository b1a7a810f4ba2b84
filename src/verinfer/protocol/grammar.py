"""Structured outputs: the body's ``response_format`` → the grammar a sampled output must obey.

Both sides of a dispute derive the same grammar from the same body: the operator constrains its
decode with it and the verifier recomputes every token mask from it (sampling rule
``vi-sample-v3``, verinfer.engine.sampling). The grammar engine is llguidance (a maintained Rust
library, pinned in pyproject.toml): its JSON-schema compiler turns the canonical schema into a
grammar, and its matcher turns (grammar, tokenizer, output so far) into the mask of allowed
tokens. Everything llguidance bounds is a count (lexer fuel, Earley items, lexer states), never
a clock, so a mask is a pure function of the grammar, the tokenizer and the output so far.

What the ExecRequest binds (:class:`Grammar`): the canonical ``response_format`` (``spec``), the
engine and its version (``engine``) and ``sha256`` of the compiled grammar (``compiled``); a
verifier whose llguidance compiles the spec to other bytes refuses to judge rather than guess.

Refused (400, param ``response_format``): an unknown type, a schema that is not an object, a
schema llguidance reports an error *or a warning* for (an unknown ``format``, an unsupported
keyword: it would be ignored, so the output would not be what the schema says), and a schema
that sets llguidance's own options (``x-guidance``: the rule fixes them).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from verinfer.errors import InvalidRequestError
from verinfer.protocol import limits as L

#: The grammar engine, by name and exact version: part of every grammar-constrained request.
GRAMMAR_ENGINE_NAME = "llguidance"
#: The JSON compiler's options, fixed by the rule: compact JSON (no free whitespace: a small
#: model can otherwise spend its whole budget on spaces), no unimplemented keyword ignored.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "lenient": False}
#: llguidance's resource limits, pinned (its defaults at 1.9.1): counts, not time.
PARSER_LIMITS: dict[str, int] = {"max_items_in_row": 2000, "initial_lexer_fuel": 1_000_000,
                                 "step_lexer_fuel": 200_000, "step_max_items": 50_000,
                                 "max_lexer_states": 250_000, "max_grammar_size": 500_000}
PARAM = "response_format"


def grammar_engine() -> str:
    """``llguidance <version>``: the installed engine (pinned, pyproject.toml)."""
    import llguidance

    return f"{GRAMMAR_ENGINE_NAME} {llguidance.__version__}"


def parser_limits() -> Any:
    import llguidance

    return llguidance.LLParserLimits(**PARSER_LIMITS)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Grammar:
    """A grammar-constrained request's grammar: what the ExecRequest binds."""

    spec: str  # canonical JSON of the response format: {"type":"json_object"} or with "schema"
    engine: str  # grammar_engine() of whoever compiled it
    compiled: bytes  # sha256 of the compiled grammar (llguidance's grammar text, UTF-8)

    def grammar_text(self) -> str:
        """The compiled grammar, recompiled from ``spec`` by the installed engine; raises
        :class:`InvalidRequestError` when this engine is not the one the request names or
        compiles it to other bytes (a verifier must not judge with another grammar)."""
        if self.engine != grammar_engine():
            raise InvalidRequestError(f"the request's grammar engine is {self.engine!r}; this "
                                      f"one is {grammar_engine()!r}", param=PARAM)
        text = _compile(self.spec)
        if hashlib.sha256(text.encode()).digest() != self.compiled:
            raise InvalidRequestError("the request's compiled grammar hash is not what this "
                                      "engine compiles its spec to", param=PARAM)
        return text


def _normal(value: Any) -> Any:
    """A schema as a JSON value, canonical: integral floats as integers (``1.0`` is ``1``), no
    ``-0``; objects keep their keys' order."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequestError("the schema holds a non-finite number", param=PARAM)
        if value.is_integer() and abs(value) <= L.MAX_EXACT_FLOAT_INT:
            return int(value)
        return value + 0.0
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Compact JSON of ``value`` with its numbers canonical and its keys **in the body's
    order**: a schema's ``properties`` order is the order the grammar makes the model write the
    keys in (as OpenAI's structured outputs do), so two orders are two different grammars."""
    return json.dumps(_normal(value), separators=(",", ":"), ensure_ascii=False)


def _has_key(value: Any, key: str) -> bool:
    if isinstance(value, Mapping):
        return key in value or any(_has_key(v, key) for v in value.values())
    if isinstance(value, list):
        return any(_has_key(v, key) for v in value)
    return False


def response_format_spec(value: object) -> str | None:
    """The body's ``response_format`` → the canonical spec (None: ``text``, no grammar).
    ``json_schema``'s ``name``, ``description`` and ``strict`` change no output bit (the schema
    is always enforced, strictly) and are not part of the spec."""
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise InvalidRequestError("response_format must be an object with a type", param=PARAM)
    kind = value["type"]
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return canonical_json({"type": "json_object"})
    if kind != "json_schema":
        raise InvalidRequestError(f"response_format type {kind!r} is not supported (text, "
                                  "json_object, json_schema)", param=PARAM)
    js = value.get("json_schema")
    if set(value) != {"type", "json_schema"} or not isinstance(js, Mapping):
        raise InvalidRequestError("response_format json_schema takes one json_schema object",
                                  param=PARAM)
    extra = set(js) - {"name", "schema", "strict", "description"}
    if extra:
        raise InvalidRequestError(f"json_schema does not take {sorted(extra)[0]!r}", param=PARAM)
    if not isinstance(js.get("name"), str) or not js["name"]:
        raise InvalidRequestError("json_schema.name must be a non-empty string", param=PARAM)
    if js.get("strict") is not None and type(js["strict"]) is not bool:
        raise InvalidRequestError("json_schema.strict must be a boolean", param=PARAM)
    if js.get("description") is not None and not isinstance(js["description"], str):
        raise InvalidRequestError("json_schema.description must be a string", param=PARAM)
    schema = js.get("schema", {})
    if not isinstance(schema, Mapping):
        raise InvalidRequestError("json_schema.schema must be an object", param=PARAM)
    if _has_key(schema, "x-guidance"):
        raise InvalidRequestError("a schema may not set x-guidance (the rule fixes the "
                                  "grammar engine's options)", param=PARAM)
    return canonical_json({"type": "json_schema", "schema": schema})


@lru_cache(maxsize=256)
def _compile(spec: str) -> str:
    """The compiled grammar text of a canonical spec (pure: same spec and engine, same text)."""
    from llguidance import LLMatcher

    doc = json.loads(spec)
    schema = {"type": "object"} if doc["type"] == "json_object" else doc["schema"]
    try:
        text = LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)  # type: ignore[arg-type]
    except ValueError as e:
        raise InvalidRequestError(f"the schema cannot be compiled: {str(e)[:300]}",
                                  param=PARAM) from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(text, None,
                                                                  limits=parser_limits())
    if is_error or messages:
        raise InvalidRequestError(f"the schema cannot be compiled exactly: "
                                  f"{'; '.join(messages)[:300]}", param=PARAM)
    return text


def compile_grammar(spec: str) -> Grammar:
    """The request's :class:`Grammar` for a canonical spec (raises InvalidRequestError for a
    schema the engine refuses or would only approximate)."""
    text = _compile(spec)
    return Grammar(spec=spec, engine=grammar_engine(),
                   compiled=hashlib.sha256(text.encode()).digest())
