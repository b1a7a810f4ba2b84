"""The stop rule (one home): when a generation ends and what text it returns.

Rule (protocol; operator decode, verifier replay and every backend apply it alike): after each
generated token, with ``generated`` the tokens so far,

1. ``ended``: the last token is an EOS/EOT id of the tokenizer and ``ignore_eos`` is off;
2. ``text`` = ``tokenizer.decode(generated[:-1] if ended else generated)`` (special tokens
   dropped, the space-prefix strip, UTF-8 with ``errors="replace"`` applied once at the end);
3. the first stop string *in the order of* ``params.stop`` that occurs anywhere in ``text``
   cuts it before its first occurrence: ``("stop", text[:cut])``;
4. else ``("stop", text)`` when ``ended``; else ``("length", text)`` once
   ``len(generated) >= max_tokens``; else ``(None, text)`` — the generation goes on.

:func:`stop_rule` is that definition, written out over the whole token list (the verifier's
``output_state`` and the tests use it). :class:`StopState` is the same rule evaluated one token
at a time, in O(1) amortised work per token instead of a re-decode of the whole output: decode
and replay push each token and stop at the first finish, and for every such sequence
``StopState.push`` returns exactly ``stop_rule`` of the prefix pushed so far (proven by the
property tests in tests/unit/test_stop_rule.py against this definition, on the tiny,
Gemma 3 and SmolLM2 tokenizers).

Why an incremental form is exact although detokenization is not prefix-stable:
- the decoded *bytes* only grow by appending: each token adds its bytes, special tokens add
  none, and the space-prefix strip touches only the first token that emits bytes;
- UTF-8 decoding with ``errors="replace"`` is what Python's incremental decoder computes: it
  commits every character (or U+FFFD) it can, holding back at most 3 bytes of an incomplete
  trailing sequence. The committed text is a prefix of the decode of *every* extension; only
  the held-back tail (decoded with ``final=True``: U+FFFD, or nothing) may change;
- no stop string occurred in the previous text (else the generation had ended), and the
  committed text before this token is a prefix of it, so a stop string can only newly occur
  ending past that committed prefix: the search starts ``len(stop) - 1`` characters before it.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from verinfer.errors import VerinferError

if TYPE_CHECKING:
    from verinfer.engine.tokenizer.base import Tokenizer
    from verinfer.protocol.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]

__all__ = ["FinishReason", "StopState", "StopStateFinishedError", "stop_rule"]


class StopStateFinishedError(VerinferError):
    """A token was pushed into a :class:`StopState` after the rule had finished: the
    incremental form is only defined up to the first finish (a caller bug, not the client's)."""

    code = "stop_state_finished"


def stop_rule(tokenizer: Tokenizer, generated: Sequence[int], params: SamplingParams
              ) -> tuple[FinishReason | None, str]:
    """The stop rule over a whole, non-empty token list (the definition; see the module doc)."""
    generated = list(generated)
    ended = not params.ignore_eos and generated[-1] in tokenizer.spec.eot_ids
    text = tokenizer.decode(generated[:-1] if ended else generated)
    for stop in params.stop:
        cut = text.find(stop)
        if cut >= 0:
            return "stop", text[:cut]
    if ended:
        return "stop", text
    return ("length" if len(generated) >= params.max_tokens else None), text


class StopState:
    """:func:`stop_rule` one token at a time (see the module doc for why it is exact).

    ``push(token_id)`` returns the finish reason and :attr:`text` is the text, together equal
    to ``stop_rule(tokenizer, pushed, params)``; after a finish, ``push`` raises
    :class:`StopStateFinishedError`. A push costs O(1) amortised: the token's bytes are decoded
    once and only the last ``max(len(stop)) - 1`` characters before them are searched again;
    the whole text is built only when :attr:`text` is read (a stream reads it every step, and
    then pays one copy of it, as before).
    """

    __slots__ = (
        "_base",
        "_chunks",
        "_committed",
        "_dec",
        "_eot",
        "_final",
        "_keep",
        "_max_tokens",
        "_n",
        "_recent",
        "_stops",
        "_strip",
        "_tail",
        "_tok",
        "finish",
    )

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams) -> None:
        self._tok = tokenizer
        self._eot = frozenset(() if params.ignore_eos else tokenizer.spec.eot_ids)
        self._stops = tuple(params.stop)
        self._keep = max((len(s) for s in self._stops), default=1) - 1
        self._max_tokens = params.max_tokens
        self._strip = tokenizer.spec.add_space_prefix  # until the first token that emits bytes
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._n = 0
        # INVARIANT: the text is _committed + "".join(_chunks) + _tail, and _base is the length
        # of its committed part (all but _tail); the committed part is a prefix of the decode of
        # every extension of the bytes so far; _tail is the held-back bytes (<= 3) decoded as
        # final; _recent is the last _keep characters of the committed part; no stop string
        # occurs in the text while finish is None.
        self._committed = ""
        self._chunks: list[str] = []
        self._base = 0
        self._recent = ""
        self._tail = ""
        self._final: str | None = None  # the text once a stop string has cut it
        self.finish: FinishReason | None = None

    @property
    def text(self) -> str:
        """The output text so far (cut before a stop string once one occurred)."""
        if self._final is not None:
            return self._final
        if self._chunks:
            self._committed += "".join(self._chunks)
            self._chunks.clear()
        return self._committed + self._tail if self._tail else self._committed

    def push(self, token_id: int) -> FinishReason | None:
        if self.finish is not None:
            raise StopStateFinishedError(
                f"token {token_id} pushed after the stop rule finished ({self.finish!r}, "
                f"{self._n} tokens)")
        tok = self._tok
        self._n += 1
        before = self._base  # no stop string occurs within text[:before]
        new = ""
        ended = token_id in self._eot
        if not ended and not tok.is_special(token_id):  # is_special checks the id, as decode
            b = tok.token_bytes(token_id)
            if self._strip and b:
                if b[:1] == b" ":
                    b = b[1:]
                self._strip = False
            if b:
                new = self._dec.decode(b, final=False)
                pending = self._dec.getstate()[0]
                self._tail = pending.decode("utf-8", errors="replace") if pending else ""
        # the text from the first place a new occurrence can start: text[origin:]
        origin = before - len(self._recent)
        window = self._recent + new + self._tail
        for stop in self._stops:
            # a new occurrence ends past `before`; an empty stop string (refused by
            # SamplingParams.validate, kept exact anyway) occurs at 0 of the first text
            start = max(0, before - len(stop) + 1) if stop else (0 if self._n == 1 else -1)
            if start < 0:
                continue
            cut = window.find(stop, start - origin)
            if cut >= 0:
                self.finish = "stop"
                self._final = (self.text[:origin] + window)[:origin + cut]
                return self.finish
        if new:
            self._chunks.append(new)
            self._base += len(new)
            if self._keep:
                self._recent = (self._recent + new)[-self._keep:]
        if ended:
            self.finish = "stop"
        elif self._n >= self._max_tokens:
            self.finish = "length"
        return self.finish
