"""Distinct words BPE'd once each by HF, spread over every core: the one home of the batching
both word paths (``bytelevel_words``, ``spm_words``) use."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from verinfer.errors import TokenizerError


def encode_distinct(backend: Any, distinct: set[str],
                    spell: Callable[[str], str] | None = None) -> dict[str, Sequence[int]]:
    """Each distinct word's ids from ``backend`` (an HF ``tokenizers.Tokenizer``): one
    pre-tokenized sequence per worker, so the batch runs on every core; each word is BPE'd alone
    (its own pre-token). ``spell`` maps a word to the text the backend sees (keys stay the
    words)."""
    words = list(distinct)
    if not words:
        return {}
    # a few thousand words per batch: fewer would cost more in thread hand-offs than BPE
    n = max(1, min(len(words) // 2048, 2 * (os.cpu_count() or 1)))
    batches = [words[k::n] for k in range(n)]
    spelled = batches if spell is None else [[spell(w) for w in b] for b in batches]
    try:
        encodings = backend.encode_batch(spelled, is_pretokenized=True,
                                         add_special_tokens=False)
    except Exception as e:  # the Rust side raises a bare Exception (a lone surrogate...)
        raise TokenizerError(f"tokenizer failed on the input: {e}") from e
    table: dict[str, Sequence[int]] = {}
    for batch, enc in zip(batches, encodings, strict=True):
        ids, word_of = enc.ids, enc.word_ids  # word_of: each id's word, non-decreasing
        starts = [bisect_left(word_of, k) for k in range(len(batch) + 1)]
        table.update(
            zip(batch, map(ids.__getitem__, map(slice, starts, starts[1:])), strict=False))
    return table
