"""The request rule: an OpenAI request body → the ExecRequests an honest server runs.

One pure function, :func:`plan_request`, used by both sides of a dispute:
- the operator builds its engine jobs from it (verinfer.operator.generation), and
- the verifier checks a sealed ExecRequest with ``request in exec_requests(body, ...)``
  (verinfer.verifier.conformance).
Both apply it to the same bytes (the body exactly as received, which the envelope carries), so
they cannot drift: there is no second copy of any default, limit or seed rule.

The steps, each deterministic:
1. **Parse** the body (bounded: verinfer.protocol.jsonsafe; a repeated key is an error, since
   readers disagree on which value wins) and accept exactly the fields of the endpoint;
   ``null`` means omitted. Unsupported options are refused, never ignored.
2. **Canonicalize numbers**: a JSON number is a value, not a spelling. ``-0.0``, ``-0e5``, ``0``
   and ``0.0`` are the same temperature, and ``8.0`` is the integer 8. Why: the operator once
   derived a seed from ``-0.0`` while the verifier, reading the canonical ExecRequest, used
   ``0.0`` — and an honest operator was slashed. Floats are IEEE doubles with the sign of zero
   dropped; integers written as floats must be exact (|x| <= 2^53, no fraction).
3. **Defaults and limits** from one table (verinfer.protocol.limits).
4. **Prompts** → token ids through the caller's :class:`PromptTokenizer` (the engine's
   tokenizer and chat template; this module imports no engine), bounded in characters first.
5. **max_tokens**: when omitted, fixed by the rule from the *model's* context length and the
   prompt length: ``min(default, context - prompt)`` with the defaults of the limits table (chat
   256, legacy completions 16) — never an operator choice (not its ``--max-context`` window
   either), so an operator cannot truncate the answer or shop for a sample by varying it.
6. **Seeds**: the body's ``seed``, or one derived from (model id, prompt ids, canonical decode
   policy incl. the resolved max_tokens, and the client's ``nonce`` when the body has one) —
   never from transport details (``stream``, ``user``, body bytes) and never from anything the
   operator chooses. Choice ``i`` gets ``choice_seed(seed, i)``: exactly one seed per choice
   index. Why a nonce: without ``seed`` the same body gives the same sample on every call (the
   operator must not pick seeds, or it could grind for the answer it likes); a client that wants
   a fresh sample sends a fresh ``nonce`` (or its own ``seed``), and the verifier re-derives
   the seed from the nonce in the sealed body. A body without a nonce derives the seed exactly
   as before the nonce existed, so receipts already issued still verify.

Transport-only fields (:data:`TRANSPORT_ONLY`) are checked for type and otherwise change
nothing an ExecRequest holds: they are accepted so OpenAI SDKs and gateways that set them work,
and docs/operator.md lists them as not affecting the output.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from verinfer.errors import ContextLengthExceededError, InvalidRequestError, ModelNotFoundError
from verinfer.protocol import limits as L
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.grammar import compile_grammar
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import json_shape, loads_untrusted, require_utf8
from verinfer.protocol.numbers import canonical_float, canonical_int, json_kind
from verinfer.protocol.sampling_options import SamplingOptions, check_bias_vocab, sampling_options
from verinfer.protocol.tools import (
    HistoryCall,
    ToolFunction,
    ToolPolicy,
    call_id_text,
    grammar_spec,
    history_calls,
    tool_policy,
)

Endpoint = Literal["chat", "completions"]
NEUTRAL_OPTIONS = SamplingOptions()  # (frozen: one shared default)
ROLES = ("system", "developer", "user", "assistant", "tool")

#: Fields that never change an output bit (type-checked, then ignored by the rule): OpenAI's
#: storage, billing, caching and abuse-tracking hints. ``stream_options`` is decoding-neutral
#: too but shapes the stream (usage chunk), so it is read by the rule like ``stream``.
TRANSPORT_ONLY = frozenset({"user", "store", "metadata", "service_tier", "prompt_cache_key",
                            "safety_identifier"})
_COMMON = frozenset({
    "model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "temperature", "top_p",
    # verinfer extras
    "top_k", "prompt_commitments", "nonce"}) | TRANSPORT_ONLY
#: The fields each endpoint accepts (the operator's pydantic models must declare exactly these).
FIELDS: dict[Endpoint, frozenset[str]] = {
    "chat": _COMMON | {"messages", "top_logprobs", "max_completion_tokens", "response_format",
                       "tools", "tool_choice", "parallel_tool_calls", "functions",
                       "function_call", "reasoning_effort", "modalities"},
    "completions": _COMMON | {"prompt", "best_of", "echo", "suffix"},
}
#: OpenAI's ``service_tier`` values (a hint about latency and price; it selects no other model).
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
#: A message ``name`` as OpenAI defines it: letters, digits, ``_`` and ``-``, 1 to 64 of them.
#: The charset also keeps a name out of a chat template's special-token syntax (``<|...|>``).
MESSAGE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The client nonce (``nonce``): printable ASCII, 1 to 128 characters (a UUID or 32 hex digits
#: is plenty).
MAX_NONCE_CHARS = 128


# ---- numbers (their reading: verinfer.protocol.numbers) --------------------------------------
def _ranged_int(value: object, param: str, lo: int, hi: int) -> int:
    v = canonical_int(value, param)
    if not lo <= v <= hi:
        raise InvalidRequestError(f"{param} must be in [{lo}, {hi}], got {v}", param=param)
    return v


def _bool(value: object, param: str) -> bool:
    if type(value) is not bool:
        raise InvalidRequestError(f"{param} must be a boolean, got {json_kind(value)}", param=param)
    return value


def _str(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{param} must be a string, got {json_kind(value)}", param=param)
    return value


def _text(value: object, param: str) -> str:
    """A string that is valid Unicode (JSON's "\\ud800" decodes to a lone surrogate, which no
    tokenizer or CBOR text can hold)."""
    s = _str(value, param)
    try:
        s.encode()
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{param} is not valid Unicode (lone surrogate)",
                                  param=param) from None
    return s


# ---- the canonical decode policy -------------------------------------------------------------
@dataclass(frozen=True)
class ChatTurn:
    role: str
    content: str  # text parts joined by "\n" (vLLM's rule); a string as given
    name: str | None = None  # rendered by the chat template, or the body is refused
    # tool conversations (verinfer.protocol.tools): an assistant's earlier calls, and the id of
    # the call a ``tool`` message answers
    tool_calls: tuple[HistoryCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class DecodePolicy:
    """What the body asks for, canonical: equal bodies (as JSON values) give equal policies."""

    endpoint: Endpoint
    max_tokens: int | None  # None: omitted, fixed per prompt by :func:`resolve_max_tokens`
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int | None  # None: derived per prompt by :func:`request_seed`
    n: int
    top_logprobs: int | None  # None: no logprobs
    prompt_commitments: bytes | None
    stream: bool
    include_usage: bool
    nonce: str | None = None  # the client's: folded into a derived seed (step 6)
    # penalties, logit_bias and the response format's grammar (vi-sample-v3; neutral: v2)
    options: SamplingOptions = NEUTRAL_OPTIONS
    # tools, tool_choice, parallel_tool_calls (verinfer.protocol.tools); None: no tools
    tools: ToolPolicy | None = None


@dataclass(frozen=True)
class ParsedBody:
    policy: DecodePolicy
    model: str  # the body's ``model``: a served name, or a model id (see :func:`check_model`)
    messages: tuple[ChatTurn, ...] | None  # chat
    prompts: tuple[str | tuple[int, ...], ...]  # completions: text or token ids per prompt


def endpoint_of(body: Mapping[str, Any]) -> Endpoint:
    """Which endpoint a body is for: only chat bodies have ``messages`` (each endpoint refuses
    the other's fields, so a body accepted by one is never accepted by the other)."""
    return "chat" if "messages" in body else "completions"


def check_body_shape(body: bytes) -> None:
    """Step 1's cheap bound, on the raw bytes before any parser runs: at most
    ``MAX_BODY_STRINGS`` strings, ``MAX_BODY_CONTAINERS`` arrays/objects and
    ``MAX_BODY_VALUES`` values. The operator calls it before its web framework parses a body
    (that parse runs on the event loop), and :func:`load_body` applies it, so both sides
    refuse the same bodies. The body must be UTF-8 first (``require_utf8``, code
    ``invalid_json``): the counts read bytes as UTF-8, and a UTF-16 body (which the stdlib
    decoder would read) passed them while parsing for tens of seconds (issue 32.3)."""
    require_utf8(body, "request body")
    strings, containers, values = json_shape(body, L.MAX_BODY_STRINGS)
    if strings > L.MAX_BODY_STRINGS:
        raise InvalidRequestError(f"the request body holds {strings} strings; the limit is "
                                  f"{L.MAX_BODY_STRINGS}")
    if containers > L.MAX_BODY_CONTAINERS:
        raise InvalidRequestError(f"the request body holds {containers} arrays and objects; "
                                  f"the limit is {L.MAX_BODY_CONTAINERS}")
    if values > L.MAX_BODY_VALUES:
        raise InvalidRequestError(f"the request body holds up to {values} values; the limit "
                                  f"is {L.MAX_BODY_VALUES}")


def load_body(body: bytes | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(body, bytes | bytearray | memoryview):
        if len(body) <= L.MAX_BODY_BYTES:  # (a longer one is refused by the parser, by size)
            check_body_shape(bytes(body))
        obj = loads_untrusted(body, max_bytes=L.MAX_BODY_BYTES, what="request body",
                              unique_keys=True)
    else:
        obj = body
    if not isinstance(obj, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    return dict(obj)


def parse_body(body: bytes | Mapping[str, Any], endpoint: Endpoint) -> ParsedBody:
    """Steps 1-3: the body's fields, checked and canonical, with defaults applied."""
    b = {k: v for k, v in load_body(body).items() if v is not None}  # null == omitted
    unknown = sorted(set(b) - FIELDS[endpoint])
    if unknown:
        raise InvalidRequestError(f"unrecognized request argument: {unknown[0]}",
                                  param=unknown[0])
    model_name = _str(b.get("model"), "model")
    # penalties, logit_bias, response_format: sampling rule vi-sample-v3 (sampling_options.py)
    options = sampling_options(b)
    _transport_only(b)
    stream = _bool(b["stream"], "stream") if "stream" in b else False
    include_usage = False
    if "stream_options" in b:
        so = b["stream_options"]
        if not isinstance(so, Mapping) or set(so) - {"include_usage"}:
            raise InvalidRequestError("stream_options takes only include_usage",
                                      param="stream_options")
        if not stream:
            raise InvalidRequestError("stream_options is only allowed with stream: true",
                                      param="stream_options")
        if so.get("include_usage") is not None:
            include_usage = _bool(so["include_usage"], "stream_options.include_usage")

    n = _ranged_int(b["n"], "n", 1, L.MAX_CHOICES) if "n" in b else L.DEFAULT_N
    temperature = (canonical_float(b["temperature"], "temperature") if "temperature" in b
                   else L.DEFAULT_TEMPERATURE)
    if (not L.MIN_TEMPERATURE <= temperature <= L.MAX_TEMPERATURE
            or 0.0 < temperature < L.MIN_POSITIVE_TEMPERATURE):
        raise InvalidRequestError(f"temperature must be 0 or in [{L.MIN_POSITIVE_TEMPERATURE}, "
                                  f"{L.MAX_TEMPERATURE}], got {temperature!r}",
                                  param="temperature")
    top_p = canonical_float(b["top_p"], "top_p") if "top_p" in b else L.DEFAULT_TOP_P
    if not 0.0 < top_p <= L.MAX_TOP_P:
        raise InvalidRequestError(f"top_p must be in (0, {L.MAX_TOP_P}], got {top_p!r}",
                                  param="top_p")
    top_k = _ranged_int(b["top_k"], "top_k", 0, L.MAX_TOP_K) if "top_k" in b else 0
    seed = _ranged_int(b["seed"], "seed", 0, L.MAX_SEED) if "seed" in b else None
    nonce = _nonce(b["nonce"]) if "nonce" in b else None
    if nonce is not None and seed is not None:
        raise InvalidRequestError("send seed or nonce, not both: a nonce only varies the seed "
                                  "the server derives when the body has none", param="nonce")
    stop = _stop(b.get("stop"))
    commitments = _root(b["prompt_commitments"]) if "prompt_commitments" in b else None

    messages: tuple[ChatTurn, ...] | None = None
    prompts: tuple[str | tuple[int, ...], ...] = ()
    if endpoint == "chat":
        limit_name = ("max_completion_tokens" if "max_completion_tokens" in b
                      else "max_tokens")  # OpenAI: max_completion_tokens replaces max_tokens
        top_logprobs: int | None = None
        logprobs = _bool(b["logprobs"], "logprobs") if "logprobs" in b else False
        if "top_logprobs" in b:
            if not logprobs:
                raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                          param="top_logprobs")
            top_logprobs = _ranged_int(b["top_logprobs"], "top_logprobs", 0,
                                       L.MAX_TOP_LOGPROBS)
        elif logprobs:
            top_logprobs = 0
        messages = _messages(b.get("messages"))
        _chat_only_options(b)
        tools = tool_policy(b)
        if tools is not None:  # rendered text too: bounded with the messages, before any render
            _check_chars(sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls)
                             for m in messages)
                         + sum(len(t.name) + len(t.description or "") + len(t.parameters)
                               for t in tools.tools), "tools")
        spec = grammar_spec(tools)
        if spec is not None:  # a forced call: its arguments by grammar (the one grammar slot)
            if options.grammar is not None:
                raise InvalidRequestError("a forced tool call (tool_choice 'required' or a "
                                          "named function) cannot be combined with a "
                                          "response_format", param="tool_choice")
            try:
                options = replace(options, grammar=compile_grammar(spec))
            except InvalidRequestError as e:  # the forced call's schema: name the tools
                raise InvalidRequestError(f"a tool's parameters: {e.message}",
                                          param="tools") from None
    else:
        tools = None
        limit_name = "max_tokens"
        top_logprobs = (_ranged_int(b["logprobs"], "logprobs", 0, L.MAX_LEGACY_LOGPROBS)
                        if "logprobs" in b else None)
        if "echo" in b and _bool(b["echo"], "echo"):
            raise InvalidRequestError("echo is not supported by this server", param="echo")
        if "suffix" in b:
            _str(b["suffix"], "suffix")
            raise InvalidRequestError("suffix is not supported by this server", param="suffix")
        if "best_of" in b and _ranged_int(b["best_of"], "best_of", 1, L.MAX_CHOICES) != n:
            raise InvalidRequestError("best_of other than n is not supported by this server",
                                      param="best_of")
        prompts = _prompts(b.get("prompt"))
    max_tokens = (_ranged_int(b[limit_name], limit_name, 1, L.MAX_MAX_TOKENS)
                  if limit_name in b else None)
    policy = DecodePolicy(endpoint=endpoint, max_tokens=max_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, stop=stop, seed=seed, n=n,
                          top_logprobs=top_logprobs, prompt_commitments=commitments,
                          stream=stream, include_usage=include_usage, nonce=nonce,
                          options=options, tools=tools)
    return ParsedBody(policy, model_name, messages, prompts)


def _transport_only(b: Mapping[str, Any]) -> None:
    """The :data:`TRANSPORT_ONLY` fields: OpenAI's types and bounds, no effect on the output."""
    if "user" in b:
        _str(b["user"], "user")  # as before the other fields existed (no Unicode check)
    for name in ("prompt_cache_key", "safety_identifier"):
        if name in b:
            _text(b[name], name)
    if "store" in b:
        _bool(b["store"], "store")
    if "service_tier" in b and _str(b["service_tier"], "service_tier") not in SERVICE_TIERS:
        raise InvalidRequestError(f"service_tier must be one of {', '.join(SERVICE_TIERS)}",
                                  param="service_tier")
    if "metadata" in b:  # OpenAI: up to 16 string pairs, keys <= 64 and values <= 512 chars
        md = b["metadata"]
        if (not isinstance(md, Mapping) or len(md) > 16
                or any(not isinstance(v, str) or len(k) > 64 or len(v) > 512
                       for k, v in md.items())):
            raise InvalidRequestError("metadata must be an object of up to 16 string values "
                                      "(keys up to 64, values up to 512 characters)",
                                      param="metadata")
        for k, v in md.items():
            _text(k, "metadata")
            _text(v, "metadata")


def _chat_only_options(b: Mapping[str, Any]) -> None:
    """Chat options accepted only in the form that changes nothing this server does, and
    refused by name otherwise (never ignored)."""
    if "parallel_tool_calls" in b:  # read by the tool rule (verinfer.protocol.tools)
        _bool(b["parallel_tool_calls"], "parallel_tool_calls")
    if "reasoning_effort" in b:
        _str(b["reasoning_effort"], "reasoning_effort")
        raise InvalidRequestError("reasoning_effort is not supported: the served models have "
                                  "no reasoning mode", param="reasoning_effort")
    if "modalities" in b:
        mods = b["modalities"]
        if not isinstance(mods, list) or not mods or any(not isinstance(m, str) for m in mods):
            raise InvalidRequestError("modalities must be a non-empty array of strings",
                                      param="modalities")
        other = sorted(set(mods) - {"text"})
        if other:
            raise InvalidRequestError(f"modality {other[0]!r} is not supported by this server "
                                      "(only 'text')", param="modalities")


def _nonce(value: object) -> str:
    s = _str(value, "nonce")
    if not 1 <= len(s) <= MAX_NONCE_CHARS or not all(" " < c <= "~" for c in s):
        raise InvalidRequestError(f"nonce must be 1 to {MAX_NONCE_CHARS} printable ASCII "
                                  "characters (no spaces)", param="nonce")
    return s


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > L.MAX_STOP:
        raise InvalidRequestError(f"stop must be a string or up to {L.MAX_STOP} strings",
                                  param="stop")
    out = tuple(_text(s, "stop") for s in items)
    if any(not s or len(s) > L.MAX_STOP_CHARS for s in out):
        raise InvalidRequestError(f"stop strings must have 1 to {L.MAX_STOP_CHARS} characters",
                                  param="stop")
    return out


def _root(value: object) -> bytes:
    s = _str(value, "prompt_commitments")
    body = s[2:] if s.startswith("0x") else ""
    if len(body) != 64 or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise InvalidRequestError("prompt_commitments must be 0x followed by 64 hex digits",
                                  param="prompt_commitments")
    return bytes.fromhex(body)


def _messages(value: object) -> tuple[ChatTurn, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidRequestError("messages must be a non-empty array", param="messages")
    if len(value) > L.MAX_MESSAGES:
        raise InvalidRequestError(f"at most {L.MAX_MESSAGES} messages, got {len(value)}",
                                  param="messages")
    out, chars = [], 0
    called: set[str] = set()  # the ids of the tool calls made so far
    for m in value:
        if not isinstance(m, Mapping):
            raise InvalidRequestError("each message is an object with role, content and an "
                                      "optional name", param="messages")
        # null == omitted for the message keys (an SDK echoing an answer back writes
        # ``refusal: null``, ``tool_calls: null``); any other key is refused below
        m = {k: v for k, v in m.items() if v is not None or k not in _NULLABLE_KEYS}
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"message role must be one of {', '.join(ROLES)}",
                                      param="messages")
        if set(m) - _MESSAGE_KEYS[role]:
            raise InvalidRequestError(f"a {role} message takes only "
                                      f"{', '.join(sorted(_MESSAGE_KEYS[role]))}; got "
                                      f"{sorted(set(m) - _MESSAGE_KEYS[role])[0]}",
                                      param="messages")
        calls = history_calls(m["tool_calls"]) if "tool_calls" in m else ()
        call_ref = (call_id_text(m.get("tool_call_id"), "messages.tool_call_id")
                    if role == "tool" else None)
        if call_ref is not None and call_ref not in called:
            raise InvalidRequestError("a tool message answers a tool call of an earlier "
                                      "assistant message (its tool_call_id names none)",
                                      param="messages.tool_call_id")
        called.update(c.id for c in calls)
        if role == "assistant" and calls and "content" not in m:
            m["content"] = ""  # an assistant turn that only calls tools
        name = None
        if m.get("name") is not None:
            name = _str(m["name"], "messages.name")
            if not MESSAGE_NAME.fullmatch(name):
                raise InvalidRequestError("a message name has 1 to 64 letters, digits, '_' or "
                                          "'-'", param="messages.name")
        content = message_text(m.get("content"))
        chars += len(content) + sum(len(c.arguments) for c in calls)
        out.append(ChatTurn(role, content, name, calls, call_ref))
    _check_chars(chars, "messages")
    return tuple(out)


_MESSAGE_KEYS = {r: frozenset({"role", "content", "name"}) for r in ROLES} | {
    "assistant": frozenset({"role", "content", "name", "tool_calls"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
_NULLABLE_KEYS = frozenset().union(*_MESSAGE_KEYS.values()) | {"refusal"}
#: Joins a message's text parts (vLLM's rule for string-content chat templates).
PART_SEPARATOR = "\n"


def message_text(content: object) -> str:
    """A message's ``content`` as the one string the chat template renders: a string as given,
    or an array of text parts ``{"type": "text", "text": ...}`` joined by :data:`PART_SEPARATOR`.
    Other part types (``image_url``, ``input_audio``, ``file``, ``refusal``) are refused by
    name: this server runs text models only."""
    if isinstance(content, str) or not isinstance(content, list):
        return _text(content, "messages.content")
    if not content:
        raise InvalidRequestError("messages.content must be a string or a non-empty array of "
                                  "content parts", param="messages.content")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise InvalidRequestError("each content part is an object with a type",
                                      param="messages.content")
        if part["type"] != "text":
            raise InvalidRequestError(f"content part type {part['type']!r} is not supported by "
                                      "this server (text parts only)",
                                      param="messages.content")
        if set(part) != {"type", "text"}:
            raise InvalidRequestError("a text content part has exactly type and text",
                                      param="messages.content")
        texts.append(_text(part["text"], "messages.content.text"))
    return PART_SEPARATOR.join(texts)


def _prompts(value: object) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(
            not isinstance(x, str | list) for x in value):
        items = [value]  # one prompt given as token ids
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidRequestError("prompt must be a string, an array of strings or token ids",
                                  param="prompt")
    if not 1 <= len(items) <= L.MAX_PROMPTS:
        raise InvalidRequestError(f"prompt must hold 1 to {L.MAX_PROMPTS} prompts, got "
                                  f"{len(items)}", param="prompt")
    out: list[str | tuple[int, ...]] = []
    chars = 0
    for item in items:
        if isinstance(item, str):
            out.append(_text(item, "prompt"))
            chars += len(item)
        elif isinstance(item, list) and item:
            out.append(tuple(canonical_int(t, "prompt") for t in item))
        else:
            raise InvalidRequestError("each prompt must be a string or a non-empty array of "
                                      "token ids", param="prompt")
    _check_chars(chars, "prompt")
    return tuple(out)


def _check_chars(chars: int, param: str) -> None:
    if chars > L.MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"the prompt text has {chars} characters; the limit is "
                                  f"{L.MAX_PROMPT_CHARS}", param=param)


# ---- prompts, context and seeds ----------------------------------------------------------------
class PromptTokenizer(Protocol):
    """The engine's prompt rendering, as the rule needs it (implemented over the real tokenizer
    by verinfer.engine.chat.TokenizerPrompts)."""

    def chat(self, messages: Sequence[ChatTurn]) -> list[int]:
        """Prompt ids of a chat (template applied)."""
        ...

    def chat_with_tools(self, messages: Sequence[ChatTurn], tools: Sequence[ToolFunction]
                        ) -> list[int]:
        """Prompt ids of a chat whose template renders ``tools`` (or whose history holds tool
        calls or results); refuses (400) a model whose template has no tool syntax."""
        ...

    def text(self, text: str) -> list[int]:
        """Prompt ids of a legacy completion prompt (BOS rule applied, no special tokens)."""
        ...


@dataclass(frozen=True)
class ServedModel:
    """The facts about the model the rule reads (all bound to ``model_id``, the weights file's
    hash, or to the engine fingerprint the ExecRequest names)."""

    model_id: bytes
    tokenizer_hash: bytes
    engine_fingerprint: str
    context_length: int  # the model's own, not a server's smaller window
    vocab_size: int


def resolve_max_tokens(policy: DecodePolicy, prompt_len: int, context_length: int) -> int:
    """Step 5: the output limit, from the body or — when omitted — from the model's context
    and the prompt length alone. The context is the model's, but never more than the protocol
    carries (``MAX_CONTEXT_TOKENS``: what the CBOR decoder lets an ExecRequest/ExecResult hold)."""
    context_length = min(context_length, L.MAX_CONTEXT_TOKENS)
    room = context_length - prompt_len
    param = "messages" if policy.endpoint == "chat" else "prompt"
    if room < 1:
        raise ContextLengthExceededError(
            f"this model's maximum context length is {context_length} tokens; the prompt has "
            f"{prompt_len}", param=param)
    if policy.max_tokens is None:
        default = (L.DEFAULT_CHAT_MAX_TOKENS if policy.endpoint == "chat"
                   else L.DEFAULT_COMPLETION_MAX_TOKENS)
        return min(default, room)
    if policy.max_tokens > room:
        raise ContextLengthExceededError(
            f"this model's maximum context length is {context_length} tokens; the prompt has "
            f"{prompt_len} and max_tokens asks for {policy.max_tokens} more",
            param="max_completion_tokens" if policy.endpoint == "chat" else "max_tokens")
    return policy.max_tokens


SEED_DOMAIN = b"verinfer/seed/v1"
CHOICE_DOMAIN = b"verinfer/choice/v1"


def derive_seed(digest: bytes) -> int:
    return int.from_bytes(hashlib.sha256(SEED_DOMAIN + digest).digest()[:8], "big")


def request_seed(model_id: bytes, prompt_ids: Sequence[int], max_tokens: int,
                 policy: DecodePolicy) -> int:
    """Step 6, a body without ``seed``: derived from what decides the output — model id, prompt
    ids, the canonical decode policy and the client's nonce — so the operator has nothing to
    choose."""
    fields: list[Any] = [to_hex(model_id), list(prompt_ids), max_tokens, policy.temperature,
                         policy.top_k, policy.top_p, list(policy.stop), False]
    if policy.nonce is not None:  # appended only when given: older bodies keep their seeds
        fields.append({"nonce": policy.nonce})
    doc = json.dumps(fields, separators=(",", ":"))
    return derive_seed(hashlib.sha256(doc.encode()).digest())


def choice_seed(seed: int, index: int) -> int:
    """Choice 0 uses the request's seed; choice i > 0 one derived from (seed, i)."""
    if index == 0:
        return seed
    return derive_seed(hashlib.sha256(CHOICE_DOMAIN + seed.to_bytes(8, "big")
                                      + index.to_bytes(4, "big")).digest())


MODEL_ID = re.compile(r"0x[0-9a-fA-F]{64}")


def check_model(name: str, model: ServedModel) -> None:
    """A body whose ``model`` is a model id (``0x`` + 64 hex digits, the weights' sha256) is
    run by that model only. Why: a served name is the operator's own label, but an id is the
    client pinning the weights; without this rule an operator could answer a body naming
    model A with the cheaper model B (both allowlisted) and every verifier, applying the rule
    with B's facts, found B's ExecRequest conformant. Names stay unbound (docs/protocol.md)."""
    if MODEL_ID.fullmatch(name) and bytes.fromhex(name[2:]) != model.model_id:
        raise ModelNotFoundError(f"the body names model {name}; this request runs model "
                                 f"{to_hex(model.model_id)}", param="model")


# ---- the whole rule -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestPlan:
    policy: DecodePolicy
    requests: tuple[ExecRequest, ...]  # index k is response choice k (prompt k // n, choice k % n)


def plan_request(body: bytes | Mapping[str, Any], endpoint: Endpoint, model: ServedModel,
                 prompts: PromptTokenizer) -> RequestPlan:
    """Steps 1-6: every ExecRequest an honest server runs for ``body``, in choice order.
    Raises a ClientError (InvalidRequestError, ContextLengthExceededError, ...) for a body an
    honest server refuses."""
    parsed = parse_body(body, endpoint)
    check_model(parsed.model, model)
    pol = parsed.policy
    check_bias_vocab(pol.options.logit_bias, model.vocab_size)
    prompt_ids: Iterable[list[int]]
    if parsed.messages is not None:
        shown = pol.tools.rendered if pol.tools is not None else ()
        if shown or any(m.role == "tool" or m.tool_calls for m in parsed.messages):
            prompt_ids = [prompts.chat_with_tools(parsed.messages, shown)]
        else:
            prompt_ids = [prompts.chat(parsed.messages)]
    else:
        # lazily: a prompt that does not fit is refused before the next one is tokenized (16
        # unfittable prompts of 15,000 spaces each cost the operator's one tokenizer thread
        # 1.8 s, all tokenized before the first was refused)
        prompt_ids = (prompts.text(p) if isinstance(p, str) else list(p)
                      for p in parsed.prompts)
    out = []
    for ids in prompt_ids:
        if not ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        bad = next((t for t in ids if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} is outside the vocabulary "
                                      f"[0, {model.vocab_size})", param="prompt")
        max_tokens = resolve_max_tokens(pol, len(ids), model.context_length)
        base = (pol.seed if pol.seed is not None
                else request_seed(model.model_id, ids, max_tokens, pol))
        for i in range(pol.n):
            out.append(ExecRequest(
                model_id=model.model_id, tokenizer_hash=model.tokenizer_hash,
                engine_fingerprint=model.engine_fingerprint, prompt_token_ids=tuple(ids),
                max_tokens=max_tokens, temperature=pol.temperature, top_k=pol.top_k,
                top_p=pol.top_p, stop=pol.stop, seed=choice_seed(base, i), ignore_eos=False,
                prompt_commitments=pol.prompt_commitments, top_logprobs=pol.top_logprobs,
                presence_penalty=pol.options.presence_penalty,
                frequency_penalty=pol.options.frequency_penalty,
                logit_bias=pol.options.logit_bias, grammar=pol.options.grammar))
    return RequestPlan(pol, tuple(out))


def exec_requests(body: bytes | Mapping[str, Any], model: ServedModel,
                  prompts: PromptTokenizer, endpoint: Endpoint | None = None
                  ) -> tuple[ExecRequest, ...]:
    """The ExecRequests an honest server runs for ``body`` (endpoint read from the body when
    not given): a sealed request conforms iff ``request in exec_requests(body, ...)``."""
    loaded = load_body(body)
    return plan_request(loaded, endpoint or endpoint_of(loaded), model, prompts).requests
