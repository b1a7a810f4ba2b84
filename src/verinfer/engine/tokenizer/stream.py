"""Incremental detokenization, shared by every tokenizer implementation."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

from verinfer.engine.tokenizer.spec import TOKEN_CONTROL, TOKEN_UNKNOWN

if TYPE_CHECKING:
    from verinfer.engine.tokenizer.base import Tokenizer


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the newly completed text.

    Never emits part of a multi-byte UTF-8 character (bytes of an incomplete character are held
    back until completed). ``"".join(push(i) for i in ids) + flush()`` equals
    ``tokenizer.decode(ids, skip_special=...)`` exactly, including U+FFFD replacements.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = tokenizer.spec.add_space_prefix
        self.ids: list[int] = []

    def push(self, token_id: int) -> str:
        tok = self._tok
        tok._check_id(token_id)
        self.ids.append(token_id)
        if self._skip and tok._types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            return ""
        b = tok.token_bytes(token_id)
        if self._strip and b:
            if b[:1] == b" ":
                b = b[1:]
            self._strip = False
        return self._dec.decode(b, final=False)

    def flush(self) -> str:
        """Text of any trailing incomplete character (as U+FFFD); call at end of stream."""
        return self._dec.decode(b"", final=True)
