"""Helpers for the SentencePiece word-path tests (engine/tokenizer/spm_words.py): the backend's
whole-text ids (what the word path must reproduce), the word encoder of a fast tokenizer, and
text generators that stress whitespace and added tokens."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer
from verinfer.engine.tokenizer.spm_words import SpmWordEncoder


def backend_and_words(tok: FastSpmTokenizer, parse_special: bool) -> tuple[Any, SpmWordEncoder]:
    """The Rust backend of one special-token mode and its word encoder (built on first use)."""
    backend = tok._rust(parse_special)
    words = tok._mine_words.get(parse_special)
    assert backend is not None and words is not None, "this vocabulary has no word path"
    return backend, words


def whole_ids(backend: Any, text: str) -> list[int]:
    """The ids of one whole-text call of the backend: the path the word encoder replaces."""
    return list(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)


_SPACES = [" ", "  ", " " * 7, "\u2581", "\u2581 ", " \u2581\u2581", "\t", "\t\t", "\n", "\n\n",
           "\n" * 40, "\r\n", "\r", "\x0b", "\x0c", "\u00a0", "\u3000", "\u200b", "\x1b["]
_BITS = ["a", "ab", "The", "x1", "42", "3.14", "(", ")", ".", ",", ">", "<", "</", "/>", "> </",
         ">\u2581</", "_", "[", "]", "é", "東京", "👍", "\ue000", "-", "--", "==", "'s", "\""]


def whitespace_heavy(n: int, seed: int) -> Iterator[str]:
    """``n`` strings mostly of space, metaspace, tab, newline and control runs, with short
    words and punctuation between them (``>`` before spaces: the glued case)."""
    rng = random.Random(seed)
    for _ in range(n):
        yield "".join(rng.choice(_SPACES) * rng.randint(1, 3) if rng.random() < 0.6
                      else rng.choice(_BITS) for _ in range(rng.randint(1, 14)))


def added_heavy(n: int, seed: int, added: Sequence[str]) -> Iterator[str]:
    """``n`` strings dense in the vocabulary's added-token texts, whole, cut, doubled and glued
    to letters, digits, punctuation and spaces on either side."""
    rng = random.Random(seed)
    pool = list(added)

    def piece() -> str:
        t = rng.choice(pool)
        kind = rng.randrange(6)
        if kind == 0 and len(t) > 1:
            return t[: rng.randint(1, len(t) - 1)]
        if kind == 1 and len(t) > 1:
            return t[rng.randint(1, len(t) - 1):]
        if kind == 2:
            return t + t
        return t

    for _ in range(n):
        yield "".join(piece() if rng.random() < 0.5 else rng.choice(_BITS + _SPACES)
                      for _ in range(rng.randint(1, 12)))
