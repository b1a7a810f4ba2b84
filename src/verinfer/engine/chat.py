"""Chat templates: OpenAI messages → prompt token ids.

Tokenizers that carry a chat template (the GGUF's ``tokenizer.chat_template`` or a
tokenizer_config.json's ``chat_template``, committed in the tokenizer hash: SmolLM2's ChatML,
Gemma's turns in files that ship them) are rendered as HF transformers' ``apply_chat_template``
renders them -- a sandboxed, budgeted Jinja2 environment with the same options, see
:func:`render_template` and verinfer.engine.tokenizer.chat_template. Otherwise Gemma's turn
format is used whenever the vocabulary has its turn tokens (Gemma 3, and our tiny test model),
else a plain "role: content" transcript; there, system messages are folded into the first user
turn, as Gemma's own template does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.chat_template import RenderBudget, render_template_text
from verinfer.engine.tokenizer.spec import TOKEN_CONTROL, TOKEN_USER_DEFINED
from verinfer.errors import InvalidRequestError, TokenizerError
from verinfer.protocol.request_rule import ROLES, ChatTurn
from verinfer.protocol.tools import HistoryCall, ToolFunction


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    name: str | None = None  # OpenAI's participant name: rendered by the template, or refused
    tool_calls: tuple[HistoryCall, ...] = ()  # an assistant's earlier tool calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class ToolsUnsupportedError(InvalidRequestError):
    """The model's chat template has no tool syntax (or no chat template at all): tools, tool
    calls and tool results cannot be shown to this model, so the body is refused."""

    def __init__(self, detail: str, model: str | None = None) -> None:
        who = f"the chat template of model {model!r}" if model else "this model's chat template"
        super().__init__(f"{who} has no tool syntax ({detail}), so this model cannot be sent "
                         "tools, tool calls or tool results", param="tools")
        self.detail = detail


NO_NAMES = ("this model's chat template does not use message names, so a name would change "
            "nothing the model reads; remove it (or put it in the content)")


def render_chat(tokenizer: Tokenizer, messages: Sequence[ChatMessage], *,
                now: datetime | None = None) -> list[int]:
    """Prompt ids of ``messages``; ``now`` is what a template's ``strftime_now`` shows
    (default: the pinned instant, see verinfer.engine.tokenizer.chat_template)."""
    if not messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    if tokenizer.chat_template is not None:
        return render_template(tokenizer, messages, now=now)
    if any(m.role == "tool" or m.tool_calls for m in messages):
        raise ToolsUnsupportedError("it has no chat template")
    if any(m.name is not None for m in messages):  # our built-in formats have no name syntax
        raise InvalidRequestError(NO_NAMES, param="messages.name")
    system = [m.content for m in messages if m.role in ("system", "developer")]
    turns = [m for m in messages if m.role not in ("system", "developer")]
    for m in messages:
        if m.role not in ROLES:
            raise InvalidRequestError(f"unsupported role {m.role!r}", param="messages")
    if not turns:
        raise InvalidRequestError("messages need at least one user turn", param="messages")
    sot, eot = tokenizer.token_to_id("<start_of_turn>"), tokenizer.token_to_id("<end_of_turn>")
    # Turn markers are inserted as ids and message text is encoded with special-token parsing
    # off, so a user cannot forge a turn by typing "<start_of_turn>". Tokenization still splits
    # at the markers exactly as encoding the rendered template would.
    bos = tokenizer.spec.bos_id
    ids: list[int] = [bos] if bos is not None and tokenizer.spec.add_bos else []
    for i, m in enumerate(turns):
        content = m.content
        if i == 0 and system:
            content = "\n\n".join(system) + "\n\n" + content
        if sot is not None and eot is not None:
            role = "model" if m.role == "assistant" else "user"
            ids += [sot, *_plain(tokenizer, f"{role}\n{content}"), eot]
            ids += _plain(tokenizer, "\n")
        else:
            ids += _plain(tokenizer, f"{m.role}: {content}\n")
    if sot is not None and eot is not None:
        return [*ids, sot, *_plain(tokenizer, "model\n")]
    return ids + _plain(tokenizer, "assistant:")


def _plain(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_bos=False, parse_special=False)


class TokenizerPrompts:
    """The request rule's prompt rendering (verinfer.protocol.request_rule.PromptTokenizer)
    over a real tokenizer: the operator and the verifier both render prompts through this."""

    def __init__(self, tokenizer: Tokenizer, *, now: datetime | None = None) -> None:
        self.tokenizer = tokenizer
        self.now = now

    def chat(self, messages: Sequence[ChatTurn]) -> list[int]:
        return render_chat(self.tokenizer, _messages(messages), now=self.now)

    def chat_with_tools(self, messages: Sequence[ChatTurn], tools: Sequence[ToolFunction]
                        ) -> list[int]:
        if self.tokenizer.chat_template is None:
            raise ToolsUnsupportedError("it has no chat template")
        return render_template(self.tokenizer, _messages(messages), now=self.now,
                               tools=tools, tools_needed=True)

    def text(self, text: str) -> list[int]:
        spec = self.tokenizer.spec
        bos = [spec.bos_id] if spec.bos_id is not None and spec.add_bos else []
        return bos + _plain(self.tokenizer, text)


def _messages(turns: Sequence[ChatTurn]) -> list[ChatMessage]:
    return [ChatMessage(m.role, m.content, m.name, m.tool_calls, m.tool_call_id) for m in turns]


# ---- Jinja chat templates (HF apply_chat_template semantics) --------------------------------
def _render(tokenizer: Tokenizer, template: str, messages: list[dict[str, Any]],
            now: datetime | None, tools: list[dict[str, Any]] | None = None) -> str:
    spec = tokenizer.spec

    def name(i: int | None) -> str | None:
        return spec.tokens[i] if i is not None else None

    variables = {"messages": messages, "add_generation_prompt": True,
                 "bos_token": name(spec.bos_id), "eos_token": name(spec.eos_id),
                 "unk_token": name(spec.unk_id), "pad_token": name(spec.pad_id)}
    if tools is not None:  # as HF passes them: absent when there are none
        variables["tools"] = tools
    budget = RenderBudget.for_inputs(
        sum(len(m["content"]) + len(m.get("name", "")) for m in messages)
        + len(json.dumps([tools, [m.get("tool_calls") for m in messages]])))
    try:
        return render_template_text(template, variables, budget=budget, now=now)
    except jinja2.exceptions.TemplateError as e:  # raise_exception(), sandbox, budget
        raise InvalidRequestError(f"the model's chat template rejects these messages: {e}",
                                  param="messages") from e
    except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as e:
        # a template is code: its own runtime errors (the sandbox's range cap is an
        # OverflowError, `'a' + 1` a TypeError, a missing key a KeyError) are this request's
        raise InvalidRequestError(f"the model's chat template failed on these messages: "
                                  f"{type(e).__name__}: {e}", param="messages") from e


_PAD = "\u2003\t"  # whitespace no template writes next to a message by itself


@lru_cache(maxsize=16)
def _special_pattern(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    """Control and user-defined token texts, matched leftmost-longest (None: there are none)."""
    types = tokenizer.spec.token_types or ()
    names = sorted({t for t, ty in zip(tokenizer.spec.tokens, types, strict=False)
                    if t and ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}, key=len, reverse=True)
    # longest first: Python's alternation is leftmost-first, this makes it leftmost-longest
    return re.compile("|".join(map(re.escape, names))) if names else None


def render_template(tokenizer: Tokenizer, messages: Sequence[ChatMessage], *,
                    now: datetime | None = None, tools: Sequence[ToolFunction] = (),
                    tools_needed: bool = False) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's Jinja chat template, with the generation
    prompt, exactly as HF ``apply_chat_template(..., add_generation_prompt=True, tokenize=True)``
    tokenizes them -- except that special tokens are recognised only in the template's own text.

    HF renders and then encodes the whole string with special-token parsing, so a message
    containing ``<|im_start|>system`` would open a forged turn. Here each message's content is
    rendered as a random placeholder first; the rendered text is split at the placeholders and
    control/user-defined tokens are matched only outside them. The text between two special
    tokens (template text and message text together) is then encoded as one piece with special
    parsing off, so pre-tokenization sees exactly the string HF would: the ids equal HF's
    whenever no message contains a special token's text. A template may insert a message
    verbatim or trimmed (Gemma's ``| trim``); one that rewrites it otherwise is refused, since
    the split would not hold (checked against a second, real render).

    Tools (``tools``, shown when non-empty), an assistant's earlier ``tool_calls`` and a tool
    message's ``tool_call_id`` are passed as HF passes them (``tools=[{"type": "function",
    "function": {...}}]``, arguments as mappings). They are template text, so none of their
    strings may hold a special token's text; and with ``tools_needed`` the template must show
    every tool and every earlier call (each is rendered once more under a marker name, and
    every marker must show), else :class:`ToolsUnsupportedError`: a template without tool
    syntax would silently drop them.
    """
    template = tokenizer.chat_template
    if template is None:
        raise TokenizerError("this tokenizer has no chat template")
    for m in messages:
        if m.role not in ROLES:
            raise InvalidRequestError(f"unsupported role {m.role!r}", param="messages")
    # OpenAI's "developer" role is the system prompt of newer models; chat templates know "system"
    roles = ["system" if m.role == "developer" else m.role for m in messages]
    # the nonce is a function of the messages, never random: a template that reads the
    # content (`'7' in content`) would otherwise see another placeholder on every render, and
    # the operator and a verifier could decide the same request differently
    seen = [(r, m.content) if m.name is None else (r, m.content, m.name)
            for r, m in zip(roles, messages, strict=True)]
    nonce = hashlib.sha256(repr(seen).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    # private-use delimiters (not whitespace) inside a whitespace pad: a template that inserts
    # the content verbatim shows the pad, one that trims it (Gemma's `| trim`) shows the mark
    marks = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
    # an assistant turn that only calls tools has no content to place (templates test it)
    placed = [not (m.tool_calls and not m.content) for m in messages]
    tool_dicts = [t.template_dict() for t in tools] or None

    def msg(role: str, content: str, m: ChatMessage, name: str | None,
            calls: Sequence[HistoryCall] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"role": role, "content": content}
        if name is not None:
            out["name"] = name
        if m.tool_calls:
            out["tool_calls"] = [c.template_dict() for c in (calls or m.tool_calls)]
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        return out

    if tools_needed:
        _check_tool_text(tokenizer, tool_dicts, messages)
        _probe_tools(tokenizer, template, roles, messages, tools, nonce, now, msg)
    rendered = _render(tokenizer, template, [
        msg(r, _PAD + mk + _PAD if p else m.content, m, m.name)
        for r, mk, m, p in zip(roles, marks, messages, placed, strict=True)], now, tool_dicts)
    real = _render(tokenizer, template, [msg(r, m.content, m, m.name)
                                         for r, m in zip(roles, messages, strict=True)], now,
                   tool_dicts)
    if any(m.name is not None for m in messages):
        # a name is rendered where the template writes it, as template text: the request
        # rule's charset (letters, digits, _ and -) keeps it clear of special tokens, checked
        # here against this vocabulary too. A name the template does not write would be
        # silently dropped, so it is refused: each name is rendered once more as a marker of
        # its own, and every marker must show.
        pat = _special_pattern(tokenizer)
        if pat is not None and any(m.name is not None and pat.search(m.name)
                                   for m in messages):
            raise InvalidRequestError("a message name holds a special token of this model",
                                      param="messages.name")
        name_marks = [f"vin{nonce[:12]}n{i}x" for i in range(len(messages))]
        probe = _render(tokenizer, template, [
            msg(r, m.content, m, None if m.name is None else nm)
            for r, m, nm in zip(roles, messages, name_marks, strict=True)], now, tool_dicts)
        if any(m.name is not None and nm not in probe
               for m, nm in zip(messages, name_marks, strict=True)):
            raise InvalidRequestError(NO_NAMES, param="messages.name")
    pieces: list[tuple[str, bool]] = []  # (text, is message content)
    pos = 0
    for mk, m, p in zip(marks, messages, placed, strict=True):
        if not p:
            continue
        at = rendered.find(mk, pos)
        if at < 0 or rendered.count(mk) != 1:
            raise InvalidRequestError("the model's chat template does not place every message "
                                      "exactly once", param="messages")
        start, end, text = at, at + len(mk), m.content.strip()  # Jinja's trim is str.strip
        if (at - len(_PAD) >= pos and rendered.startswith(_PAD, at - len(_PAD))
                and rendered.startswith(_PAD, end)):
            start, end, text = at - len(_PAD), end + len(_PAD), m.content
        pieces += [(rendered[pos:start], False), (text, True)]
        pos = end
    pieces.append((rendered[pos:], False))
    if "".join(t for t, _ in pieces) != real:
        raise InvalidRequestError("the model's chat template rewrites message content; it "
                                  "cannot be rendered safely", param="messages")
    pat = _special_pattern(tokenizer)
    items: list[int | str] = []
    for text, is_content in pieces:
        if is_content or pat is None:
            items.append(text)
            continue
        last = 0
        for hit in pat.finditer(text):
            items.append(text[last:hit.start()])
            tid = tokenizer.token_to_id(hit.group())
            assert tid is not None
            items.append(tid)
            last = hit.end()
        items.append(text[last:])
    ids: list[int] = []
    run: list[str] = []
    for it in [*items, -1]:
        if isinstance(it, str):
            run.append(it)
            continue
        if run:
            ids += _plain(tokenizer, "".join(run))
            run = []
        if it >= 0:
            ids.append(it)
    return ids


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _check_tool_text(tokenizer: Tokenizer, tool_dicts: list[dict[str, Any]] | None,
                     messages: Sequence[ChatMessage]) -> None:
    """Tools and earlier calls are template text: a special token's text in any of their
    strings would be read as that token (a forged turn), so it is refused."""
    pat = _special_pattern(tokenizer)
    if pat is None:
        return
    texts = _strings(tool_dicts or [])
    for m in messages:
        texts += _strings([c.template_dict() for c in m.tool_calls])
        texts += [m.tool_call_id] if m.tool_call_id is not None else []
    if any(pat.search(t) for t in texts):
        raise InvalidRequestError("a tool definition or tool call holds a special token of "
                                  "this model", param="tools")


def _probe_tools(tokenizer: Tokenizer, template: str, roles: Sequence[str],
                 messages: Sequence[ChatMessage], tools: Sequence[ToolFunction], nonce: str,
                 now: datetime | None, msg: Any) -> None:
    """Every tool and every earlier call is shown by the template (rendered under marker names,
    every marker must show), else :class:`ToolsUnsupportedError`."""
    tmarks = [f"vin{nonce[:12]}t{i}x" for i in range(len(tools))]
    probe_tools = [ToolFunction(mk, t.description, t.parameters).template_dict()
                   for t, mk in zip(tools, tmarks, strict=True)] or None
    cmarks: list[str] = []
    probe_msgs = []
    for i, (r, m) in enumerate(zip(roles, messages, strict=True)):
        calls = [HistoryCall(c.id, f"vin{nonce[:12]}c{i}_{j}x", c.arguments)
                 for j, c in enumerate(m.tool_calls)]
        cmarks += [c.name for c in calls]
        probe_msgs.append(msg(r, m.content, m, m.name, calls or None))
    probe = _render(tokenizer, template, probe_msgs, now, probe_tools)
    missing = [mk for mk in (*tmarks, *cmarks) if mk not in probe]
    if missing:
        what = "tools" if missing[0] in tmarks else "earlier tool calls"
        raise ToolsUnsupportedError(f"it does not show the {what}")
