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
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import jinja2

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.chat_template import RenderBudget, render_template_text
from verinfer.engine.tokenizer.spec import TOKEN_CONTROL, TOKEN_USER_DEFINED
from verinfer.errors import InvalidRequestError, TokenizerError
from verinfer.protocol.request_rule import ROLES, ChatTurn


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    name: str | None = None  # OpenAI's participant name: rendered by the template, or refused


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
        return render_chat(self.tokenizer,
                           [ChatMessage(m.role, m.content, m.name) for m in messages],
                           now=self.now)

    def text(self, text: str) -> list[int]:
        spec = self.tokenizer.spec
        bos = [spec.bos_id] if spec.bos_id is not None and spec.add_bos else []
        return bos + _plain(self.tokenizer, text)


# ---- Jinja chat templates (HF apply_chat_template semantics) --------------------------------
def _render(tokenizer: Tokenizer, template: str, messages: list[dict[str, str]],
            now: datetime | None) -> str:
    spec = tokenizer.spec

    def name(i: int | None) -> str | None:
        return spec.tokens[i] if i is not None else None

    variables = {"messages": messages, "add_generation_prompt": True,
                 "bos_token": name(spec.bos_id), "eos_token": name(spec.eos_id),
                 "unk_token": name(spec.unk_id), "pad_token": name(spec.pad_id)}
    budget = RenderBudget.for_inputs(sum(len(m["content"]) + len(m.get("name", ""))
                                         for m in messages))
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
                    now: datetime | None = None) -> list[int]:
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

    def msg(role: str, content: str, name: str | None) -> dict[str, str]:
        return {"role": role, "content": content} if name is None else {
            "role": role, "content": content, "name": name}

    rendered = _render(tokenizer, template, [msg(r, _PAD + mk + _PAD, m.name) for r, mk, m
                                             in zip(roles, marks, messages, strict=True)], now)
    real = _render(tokenizer, template, [msg(r, m.content, m.name)
                                         for r, m in zip(roles, messages, strict=True)], now)
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
            msg(r, m.content, None if m.name is None else nm)
            for r, m, nm in zip(roles, messages, name_marks, strict=True)], now)
        if any(m.name is not None and nm not in probe
               for m, nm in zip(messages, name_marks, strict=True)):
            raise InvalidRequestError(NO_NAMES, param="messages.name")
    pieces: list[tuple[str, bool]] = []  # (text, is message content)
    pos = 0
    for mk, m in zip(marks, messages, strict=True):
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
