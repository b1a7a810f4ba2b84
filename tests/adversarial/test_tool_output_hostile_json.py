"""Attacks on the reading of a model's output as tool calls (verinfer.protocol.tools.read_output),
by a user who makes the model write a call whose JSON the operator cannot answer with: the model
follows the prompt ("call f with this argument: ..."), and for ``auto`` nothing constrains it.

Before, each raised out of the rule *after* the generation, in the operator's response writer
(a 500 or a 400 naming ``response_format``, a stream cut before its finish chunk, the compute
spent and no receipt) and in the verified client's check (an exception that is not a
verification error):

1. arguments nested a few hundred deep: ``json.loads`` parses them, the canonical
   re-serialization recurses twice per level and raises RecursionError, at a depth that depends
   on the caller's stack (so the operator and a client could even read one text differently);
2. a number past a double's range (``1e999`` parses to inf): "the schema holds a non-finite
   number" (InvalidRequestError, param response_format);
3. a lone surrogate escape (``"\\ud800"``): read as a call, whose arguments no UTF-8 response can
   carry (the operator's JSON writer raises UnicodeEncodeError).

Now each is no call: the whole text is the content (as any other output the rule does not read
as a call), and the operator's response serializes.

4. The same JSON sent by the user as an earlier turn's tool call (``messages[].tool_calls[]
   .function.arguments``, a string) made the request rule itself raise RecursionError, at a
   depth set by the caller's stack; now it is a 400 (test_history_arguments_...)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from verinfer.errors import InvalidRequestError
from verinfer.operator.chat.protocol import ChatMessageOut, FunctionCall, ToolCall
from verinfer.protocol.request_rule import parse_body
from verinfer.protocol.tools import MAX_OUTPUT_DEPTH, choice_message, tool_policy

REQ_HASH = hashlib.sha256(b"tool-output request").digest()
TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}  # any JSON value
POLICIES: dict[str, dict[str, Any]] = {
    "named": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
    "required": {"tools": [TOOL], "tool_choice": "required"},
    "auto": {"tools": [TOOL]},
}


def _as_written(kind: str, arguments: str) -> str:
    """The output text a model writes for one call of ``f`` under each tool_choice."""
    if kind == "named":
        return arguments
    call = '{"name": "f", "arguments": ' + arguments + "}"
    return "[" + call + "]" if kind == "required" else "<tool_call>" + call + "</tool_call>"


def _served(kind: str, text: str) -> tuple[str | None, list[dict[str, Any]] | None, bytes]:
    """The message the rule reads (as the operator and the verified client do) and the
    operator's JSON of it (verinfer.operator.chat.serving writes tool calls so)."""
    content, calls = choice_message(tool_policy(POLICIES[kind]), text, REQ_HASH)
    msg = ChatMessageOut(content=content, tool_calls=None if calls is None else [
        ToolCall(id=c["id"], function=FunctionCall(**c["function"])) for c in calls])
    return content, calls, msg.model_dump_json(exclude_none=True).encode()


@pytest.mark.parametrize("kind", list(POLICIES))
def test_arguments_nested_past_the_recursion_limit(kind: str) -> None:
    for depth in (MAX_OUTPUT_DEPTH + 1, 600, 5000):
        text = _as_written(kind, '{"a": ' + "[" * depth + "]" * depth + "}")
        content, calls, _ = _served(kind, text)
        assert (content, calls) == (text, None), depth
    # the deepest value the rule reads is a call
    ok = _as_written(kind, '{"a": ' + "[" * (MAX_OUTPUT_DEPTH - 3) + "]" * (MAX_OUTPUT_DEPTH - 3)
                     + "}")
    assert _served(kind, ok)[1] is not None


@pytest.mark.parametrize("kind", list(POLICIES))
def test_arguments_overflowing_a_double(kind: str) -> None:
    for number in ("1e999", "-1e400", "1.5E+309"):
        text = _as_written(kind, '{"x": ' + number + "}")
        content, calls, _ = _served(kind, text)
        assert (content, calls) == (text, None), number
    assert _served(kind, _as_written(kind, '{"x": 1.7976931348623157e308}'))[1] is not None


@pytest.mark.parametrize("kind", list(POLICIES))
def test_arguments_with_a_lone_surrogate_escape(kind: str) -> None:
    for s in (r'"\ud800"', r'"a\udc00b"', r'"\ud800\u0041"'):
        for arguments in ('{"s": ' + s + "}", "{" + s + ": 1}"):
            text = _as_written(kind, arguments)
            content, calls, body = _served(kind, text)
            assert (content, calls) == (text, None), arguments
            assert body.decode() == ChatMessageOut(content=text).model_dump_json(
                exclude_none=True)
    # a pair of escapes is one character: still a call
    _, calls, body = _served(kind, _as_written(kind, r'{"s": "\ud83d\ude00"}'))
    assert calls is not None and "\U0001f600".encode() in body


def _history_body(arguments: str) -> bytes:
    return json.dumps({"model": "m", "tools": [TOOL], "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}).encode()


def _rule_at_stack_depth(frames: int, body: bytes) -> str:
    """The request rule's answer to ``body`` from ``frames`` calls deep (an operator's
    tokenizer thread is shallow; a verifier's judge, an audit worker, a test runner deeper)."""
    if frames:
        return _rule_at_stack_depth(frames - 1, body)
    try:
        parse_body(body, "chat")
        return "accepted"
    except InvalidRequestError as e:
        return f"400 {e.param}"


def test_history_arguments_nested_past_the_recursion_limit() -> None:
    """A 1.3 KB body whose earlier tool call's ``arguments`` string holds JSON nested ~500 deep
    (a string: the body's own depth bound of 64 does not see into it). Before, the rule parsed
    it and its re-serialization raised RecursionError: a 500 for the operator, an exception
    (not a verdict) for the verifier's judge, and at ~450 deep an answer that depended on the
    caller's stack (accepted from a shallow one, a crash from 300 frames deeper): an operator
    could serve what a verifier cannot judge. Now past MAX_OUTPUT_DEPTH it is a 400, from any
    stack, as are a number past a double and a lone surrogate escape in the arguments."""
    for depth in (MAX_OUTPUT_DEPTH - 1, 450, 480, 600, 5000):
        body = _history_body('{"a": ' + "[" * depth + "]" * depth + "}")
        assert len(body) < 11_000
        answers = {_rule_at_stack_depth(frames, body) for frames in (0, 300)}
        assert answers == ({"accepted"} if depth < MAX_OUTPUT_DEPTH
                           else {"400 messages.tool_calls"}), depth
    for arguments in ('{"x": 1e999}', r'{"s": "\ud800"}'):
        assert _rule_at_stack_depth(0, _history_body(arguments)) == "400 messages.tool_calls"
