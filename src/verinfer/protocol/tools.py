"""Tool calling: the body's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` → what the
prompt renders, which grammar constrains the output, and how the output text is read back as
OpenAI ``tool_calls``.

Both sides of a dispute apply these functions to the same bytes: the operator plans its jobs and
writes its response with them, and a verifier re-derives the same prompt, grammar and
``tool_calls`` from the sealed body and the re-executed output (the receipt binds the prompt ids
and the grammar through the ExecRequest, and the output tokens through ``outHash``; the
``tool_calls`` of a choice are a function of those and of the body alone, :func:`read_output`).

The rule:

- ``tools``: up to ``MAX_TOOLS`` objects ``{"type": "function", "function": {"name",
  "description"?, "parameters"?, "strict"?}}``; names as OpenAI defines them (letters, digits,
  ``_`` and ``-``, 1 to 64) and unique. ``parameters`` is a JSON schema object (omitted: a
  function without parameters, ``{"type": "object", "properties": {}}``), kept with its
  numbers canonical and its keys in the body's order (verinfer.protocol.grammar.canonical_json).
  ``strict`` changes nothing: arguments are always grammar-constrained when the call is forced
  and never otherwise.
- ``tool_choice``: ``"none"``, ``"auto"`` (the default with tools), ``"required"`` or
  ``{"type": "function", "function": {"name": N}}`` naming a declared tool. Without tools only
  ``"none"`` is accepted. ``parallel_tool_calls`` (default true) bounds a forced answer to one
  call when false, and keeps only the first call of an ``auto`` answer.
- ``"none"``: the tools are not rendered at all (the model is told nothing of them) and the
  output is plain content. A history holding tool calls or tool results is still rendered.
- ``"auto"``: the tools are rendered by the model's chat template; the output is read in the
  Hermes format the tool-capable templates teach (Qwen 2.5, Hermes): ``<tool_call>`` + a JSON
  object ``{"name": ..., "arguments": {...}}`` + ``</tool_call>``, repeated. When every block
  parses and names a declared tool, the choice's ``tool_calls`` are those blocks and its content
  the text before the first block (``null`` when only whitespace); otherwise the whole text is
  content and there are no tool calls.
- ``"required"``: the output is grammar-constrained (vi-sample-v3, the same llguidance
  grammar as ``response_format: json_schema``) to a JSON array of ``{"name", "arguments"}``
  objects, each naming a declared tool with arguments valid under its parameters schema
  (``maxItems: 1`` when ``parallel_tool_calls`` is false) — vLLM's rule.
- a named function: the output is constrained to that function's parameters schema; the
  output text is the arguments (vLLM's rule).
- ``arguments`` of a parsed call is the compact JSON re-serialization of the parsed value
  (:func:`compact`), so it has one spelling. Output JSON nested deeper than
  ``MAX_OUTPUT_DEPTH``, with a number past a double's range (``1e999``) or a string holding a
  lone surrogate escape (``"\\ud800"``) is not read as a call: its text is content (none of
  them has a compact spelling a UTF-8 response can carry, or one every caller's stack reaches).
- Each call's ``id`` is ``call_`` + 24 hex digits of ``sha256(domain || reqHash || call
  index)`` (:func:`call_id`): a function of the choice's receipt request hash (each choice
  has its own ExecRequest, with its own seed), so the verifier derives the same ids and the
  operator chooses none.

A forced call (``required`` or named) and ``response_format`` other than ``text`` both need the
one grammar slot: together they are refused. The legacy ``functions`` / ``function_call`` are
refused with a pointer to ``tools`` (their response shape, ``message.function_call``, is not
served).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verinfer.errors import InvalidRequestError
from verinfer.protocol import limits as L
from verinfer.protocol.grammar import canonical_json
from verinfer.protocol.jsonsafe import max_depth

#: A function name as OpenAI defines it (also keeps it clear of special-token syntax).
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The tool-call id domain (:func:`call_id`).
CALL_ID_DOMAIN = b"verinfer/tool-call-id/v1"
#: The Hermes tool-call markers the ``auto`` reading looks for.
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CHOICES = ("none", "auto", "required")
#: Deepest JSON nesting a tool call read from the output may have (:func:`_loads_output`); a
#: deeper value is content.
MAX_OUTPUT_DEPTH = 64
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolFunction:
    name: str
    description: str | None
    parameters: str  # canonical JSON of the parameters schema (body key order)

    def template_dict(self) -> dict[str, Any]:
        """The tool as HF chat templates read it (``tools`` of ``apply_chat_template``)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = json.loads(self.parameters)
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolPolicy:
    """The body's tool options, canonical."""

    tools: tuple[ToolFunction, ...]
    choice: str  # "none" | "auto" | "required" | "function" (then ``name``)
    name: str | None = None  # the forced function's name
    parallel: bool = True

    @property
    def rendered(self) -> tuple[ToolFunction, ...]:
        """The tools the prompt shows (none for ``tool_choice: none``)."""
        return () if self.choice == "none" else self.tools

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")


@dataclass(frozen=True)
class HistoryCall:
    """An assistant message's earlier tool call (``messages[i].tool_calls[j]``)."""

    id: str
    name: str
    arguments: str  # compact JSON of the parsed arguments object

    def template_dict(self) -> dict[str, Any]:
        # arguments as a mapping: what HF templates expect (`tool_call.arguments | tojson`)
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.loads(self.arguments)}}


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON text (compact)


@dataclass(frozen=True)
class ChoiceOutput:
    """A choice's message as the rule reads it from the output text."""

    content: str | None
    calls: tuple[ParsedCall, ...]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(spelling: str) -> float:
    x = float(spelling)
    if not math.isfinite(x):  # 1e400: a double's inf, which has no JSON spelling either
        raise ValueError(f"{spelling[:40]} overflows a double")
    return x


def _loads(text: str) -> Any:
    """Strict JSON (no NaN/Infinity, which have no JSON spelling to re-serialize to)."""
    return json.loads(text, parse_constant=_reject_constant)


def _loads_output(text: str) -> Any:
    """A JSON value of the model's output, or ValueError when the rule does not read it as
    one: :func:`_loads`, and nested at most ``MAX_OUTPUT_DEPTH`` deep (a deeper value would
    exhaust the interpreter's recursion while re-serialized, at a depth that depends on the
    caller's stack), every number finite, every string valid Unicode (``"\\ud800"`` parses to
    a lone surrogate, which no UTF-8 response can carry)."""
    if max_depth(text.encode("utf-8", "surrogatepass")) > MAX_OUTPUT_DEPTH:
        raise ValueError(f"nested deeper than {MAX_OUTPUT_DEPTH}")
    value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    try:
        _check_text(value, "output")
    except InvalidRequestError:
        raise ValueError("a string that is not valid Unicode") from None
    return value


def _error(msg: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(msg, param=param)


def compact(value: Any) -> str:
    """The one spelling of a parsed JSON value: canonical numbers, keys in order, no spaces."""
    return canonical_json(value)


def _function_name(value: object, param: str) -> str:
    if not isinstance(value, str) or not FUNCTION_NAME.fullmatch(value):
        raise _error("a function name has 1 to 64 letters, digits, '_' or '-'", param)
    return value


def _tool(value: object) -> ToolFunction:
    if not isinstance(value, Mapping) or value.get("type") != "function" \
            or set(value) != {"type", "function"}:
        raise _error("each tool is {\"type\": \"function\", \"function\": {...}} (only "
                     "function tools are supported)", "tools")
    fn = value["function"]
    if not isinstance(fn, Mapping):
        raise _error("tools[].function must be an object", "tools")
    fn = {k: v for k, v in fn.items() if v is not None}
    extra = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if extra:
        raise _error(f"tools[].function does not take {extra[0]!r}", "tools")
    name = _function_name(fn.get("name"), "tools")
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise _error("tools[].function.description must be a string", "tools")
    if "strict" in fn and type(fn["strict"]) is not bool:
        raise _error("tools[].function.strict must be a boolean", "tools")
    params = fn.get("parameters", _NO_PARAMETERS)
    if not isinstance(params, Mapping):
        raise _error("tools[].function.parameters must be a JSON schema object", "tools")
    _check_text(params, "tools")
    if "x-guidance" in _keys(params):
        raise _error("a tool's parameters may not set x-guidance (the rule fixes the grammar "
                     "engine's options)", "tools")
    if desc is not None:
        _check_text(desc, "tools")
    return ToolFunction(name, desc, canonical_json(params))


def _keys(value: Any) -> set[str]:
    """Every object key anywhere in ``value``."""
    if isinstance(value, Mapping):
        return set(value).union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value))
    return set()


def _check_text(value: Any, param: str) -> None:
    """Every string (and key) of ``value`` is valid Unicode (no lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise _error(f"{param} holds a string that is not valid Unicode", param) from None
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_text(k, param)
            _check_text(v, param)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, param)


def tool_policy(body: Mapping[str, Any]) -> ToolPolicy | None:
    """The tool options of a (null-stripped) chat body; None: the body has no ``tools`` and no
    ``tool_choice`` other than ``"none"``."""
    for legacy, new in (("functions", "tools"), ("function_call", "tool_choice")):
        if legacy in body:
            raise _error(f"{legacy} is deprecated and not supported by this server; send "
                         f"{new} instead", legacy)
    parallel = True
    if "parallel_tool_calls" in body:
        if type(body["parallel_tool_calls"]) is not bool:
            raise _error("parallel_tool_calls must be a boolean", "parallel_tool_calls")
        parallel = body["parallel_tool_calls"]
    tools_in = body.get("tools")
    if tools_in is None:
        choice = body.get("tool_choice")
        if choice is not None and choice != "none":
            raise _error("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools_in, list) or not 1 <= len(tools_in) <= L.MAX_TOOLS:
        raise _error(f"tools must be an array of 1 to {L.MAX_TOOLS} tools", "tools")
    tools = tuple(_tool(t) for t in tools_in)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise _error("tool names must be unique", "tools")
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise _error("tool_choice must be 'none', 'auto', 'required' or a named function",
                         "tool_choice")
        return ToolPolicy(tools, choice, None, parallel)
    if (not isinstance(choice, Mapping) or choice.get("type") != "function"
            or set(choice) != {"type", "function"} or not isinstance(choice["function"], Mapping)
            or set(choice["function"]) != {"name"}):
        raise _error("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": "
                     "...}}", "tool_choice")
    name = _function_name(choice["function"]["name"], "tool_choice")
    if name not in names:
        raise _error(f"tool_choice names {name!r}, which is not among the tools",
                     "tool_choice")
    return ToolPolicy(tools, "function", name, parallel)


def grammar_spec(policy: ToolPolicy | None) -> str | None:
    """The canonical json_schema spec (verinfer.protocol.grammar) of a forced call, else None."""
    if policy is None or not policy.forced:
        return None
    if policy.choice == "function":
        fn = next(t for t in policy.tools if t.name == policy.name)
        return canonical_json({"type": "json_schema", "schema": json.loads(fn.parameters)})
    items = [{"type": "object",
              "properties": {"name": {"const": t.name}, "arguments": json.loads(t.parameters)},
              "required": ["name", "arguments"], "additionalProperties": False}
             for t in policy.tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1}
    if not policy.parallel:
        schema["maxItems"] = 1
    schema["items"] = items[0] if len(items) == 1 else {"anyOf": items}
    return canonical_json({"type": "json_schema", "schema": schema})


def history_calls(value: object) -> tuple[HistoryCall, ...]:
    """An assistant message's ``tool_calls`` (earlier turns of a tool conversation)."""
    if not isinstance(value, list) or not value or len(value) > L.MAX_TOOLS:
        raise _error(f"tool_calls must be an array of 1 to {L.MAX_TOOLS} calls",
                     "messages.tool_calls")
    out = []
    for c in value:
        if not isinstance(c, Mapping):
            raise _error("each tool call is an object", "messages.tool_calls")
        c = {k: v for k, v in c.items() if v is not None}
        fn = c.get("function")
        if (set(c) != {"id", "type", "function"} or c["type"] != "function"
                or not isinstance(fn, Mapping) or set(fn) != {"name", "arguments"}):
            raise _error("a tool call is {\"id\", \"type\": \"function\", \"function\": "
                         "{\"name\", \"arguments\"}}", "messages.tool_calls")
        out.append(HistoryCall(call_id_text(c["id"]),
                               _function_name(fn["name"], "messages.tool_calls"),
                               _arguments(fn["arguments"])))
    return tuple(out)


def call_id_text(value: object, param: str = "messages.tool_calls") -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 128 \
            or not all(" " < c <= "~" for c in value):
        raise _error("a tool call id is 1 to 128 printable ASCII characters", param)
    return value


def _arguments(value: object) -> str:
    if not isinstance(value, str):
        raise _error("tool call arguments must be a JSON text (a string)",
                     "messages.tool_calls")
    try:  # bounded as a call read from the output (the JSON is in a string: the body's
        # own depth bound does not see into it, and a deep value would exhaust the recursion)
        parsed = _loads_output(value)
    except (ValueError, RecursionError) as e:
        raise _error(f"tool call arguments are not valid JSON ({str(e)[:80]}; at most "
                     f"{MAX_OUTPUT_DEPTH} deep, finite numbers, valid Unicode)",
                     "messages.tool_calls") from None
    if not isinstance(parsed, dict):
        raise _error("tool call arguments must be a JSON object", "messages.tool_calls")
    return compact(parsed)


# ---- reading the output ------------------------------------------------------------------------
def read_output(policy: ToolPolicy | None, text: str) -> ChoiceOutput:
    """A choice's content and tool calls, from its output ``text`` (deterministic: the operator
    writes its response with it, a verifier re-derives the response with it)."""
    if policy is None or policy.choice == "none":
        return ChoiceOutput(text, ())
    if policy.choice == "function":
        assert policy.name is not None
        try:
            args = _loads_output(text)
        except (ValueError, RecursionError):
            return ChoiceOutput(text, ())  # cut short (max_tokens): not a call
        return ChoiceOutput(None, (ParsedCall(policy.name, compact(args)),))
    names = {t.name for t in policy.tools}
    if policy.choice == "required":
        try:
            items = _loads_output(text)
        except (ValueError, RecursionError):
            return ChoiceOutput(text, ())
        calls = _calls(items, names)
        return ChoiceOutput(None, calls) if calls else ChoiceOutput(text, ())
    at = text.find(CALL_OPEN)
    if at < 0:
        return ChoiceOutput(text, ())
    blocks, pos = [], at
    while True:
        rest = text[pos:]
        stripped = rest.lstrip()
        if not stripped:
            break
        if not stripped.startswith(CALL_OPEN):
            return ChoiceOutput(text, ())
        start = len(rest) - len(stripped) + len(CALL_OPEN)
        end = rest.find(CALL_CLOSE, start)
        if end < 0:
            return ChoiceOutput(text, ())
        try:
            blocks.append(_loads_output(rest[start:end]))
        except (ValueError, RecursionError):
            return ChoiceOutput(text, ())
        pos += end + len(CALL_CLOSE)
    calls = _calls(blocks, names)
    if not calls:
        return ChoiceOutput(text, ())
    if not policy.parallel:
        calls = calls[:1]
    head = text[:at]
    return ChoiceOutput(head if head.strip() else None, calls)


def _calls(items: object, names: set[str]) -> tuple[ParsedCall, ...]:
    """``[{"name": declared, "arguments": {...}}, ...]`` as calls; () if any item is not one."""
    if not isinstance(items, list) or not items:
        return ()
    out = []
    for it in items:
        if (not isinstance(it, dict) or set(it) != {"name", "arguments"}
                or not isinstance(it["name"], str)  # a list or an object is unhashable
                or it["name"] not in names or not isinstance(it["arguments"], dict)):
            return ()
        out.append(ParsedCall(it["name"], compact(it["arguments"])))
    return tuple(out)


def call_id(req_hash: bytes, index: int) -> str:
    """The id of call ``index`` of the choice whose ExecRequest hashes to ``req_hash``."""
    digest = hashlib.sha256(CALL_ID_DOMAIN + req_hash + index.to_bytes(4, "big")).hexdigest()
    return "call_" + digest[:24]


def tool_calls_json(calls: Sequence[ParsedCall], req_hash: bytes) -> list[dict[str, Any]]:
    """A choice's ``message.tool_calls`` as OpenAI writes them."""
    return [{"id": call_id(req_hash, i), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]


def choice_message(policy: ToolPolicy | None, text: str, req_hash: bytes
                   ) -> tuple[str | None, list[dict[str, Any]] | None]:
    """A choice's ``message.content`` and ``message.tool_calls`` (None: no calls) as an honest
    response writes them, from its output text and its ExecRequest hash."""
    out = read_output(policy, text)
    return out.content, (tool_calls_json(out.calls, req_hash) if out.calls else None)
