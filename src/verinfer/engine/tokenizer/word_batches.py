"""Distinct words BPE'd once each by HF, spread over the cores: the one home of the batching
both word paths (``bytelevel_words``, ``spm_words``) use, and of the pipeline that hands HF
each group's new words while the next group is cut (:class:`Pipeline`)."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from verinfer.errors import TokenizerError

# texts are cut into words a group of about this many characters at a time, each group's new
# distinct words BPE'd by HF in a worker thread while the next group is cut (HF's batch call
# releases the GIL): with a core to spare, HF's share of the time (~40% of the CPU on 4 MB of
# Gemma) hides behind the cutting. Smaller groups start HF sooner but hand it more, smaller
# batches; a text of one group needs no thread
GROUP_CHARS = 1 << 18


def encode_distinct(backend: Any, distinct: Iterable[str],
                    spell: Callable[[str], str] | None = None, *,
                    cores: int | None = None) -> dict[str, Sequence[int]]:
    """Each distinct word's ids from ``backend`` (an HF ``tokenizers.Tokenizer``): one
    pre-tokenized sequence per worker, so the batch runs on ``cores`` cores (default: every
    core); each word is BPE'd alone (its own pre-token). ``spell`` maps a word to the text the
    backend sees (keys stay the words)."""
    words = list(distinct)
    if not words:
        return {}
    # a few thousand words per batch: fewer would cost more in thread hand-offs than BPE
    cores = cores or os.cpu_count() or 1
    n = max(1, min(len(words) // 2048, 2 * cores if cores > 1 else 1))
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


def groups(parts: Sequence[str], size: int) -> list[list[str]]:
    """``parts`` in order, in runs of about ``size`` characters (at least one part each)."""
    out: list[list[str]] = [[]]
    held = 0
    for p in parts:
        if held >= size:
            out.append([])
            held = 0
        out[-1].append(p)
        held += len(p)
    return out


class Pipeline:
    """The distinct words of one call, BPE'd as they are found: :meth:`add` hands HF the words
    not handed before (in a worker thread where ``threaded``), :meth:`table` waits for every
    batch and returns word -> ids. ``known``: words never to BPE (added-token texts).

    INVARIANT: the worker only runs HF's batch call on words already cut; ids are looked up by
    the caller, in text order, after :meth:`table` -- so which thread BPE'd a word, and when,
    never changes an id. Use as a context manager (the worker is joined on exit)."""

    def __init__(self, backend: Any, spell: Callable[[str], str] | None, known: Iterable[str],
                 *, threaded: bool) -> None:
        self._backend, self._spell = backend, spell
        self._handed: set[str] = set(known)
        self._pool = ThreadPoolExecutor(max_workers=1) if threaded else None
        self._batches: list[Future[dict[str, Sequence[int]]] | dict[str, Sequence[int]]] = []

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def add(self, words: set[str]) -> None:
        todo = words.difference(self._handed)
        if not todo:
            return
        self._handed.update(todo)
        if self._pool is None:
            self._batches.append(encode_distinct(self._backend, todo, self._spell))
        else:
            # one core is busy cutting the next group here: HF gets the others
            self._batches.append(self._pool.submit(
                encode_distinct, self._backend, todo, self._spell,
                cores=max(1, (os.cpu_count() or 1) - 1)))

    def table(self) -> dict[Any, Sequence[int]]:
        table: dict[Any, Sequence[int]] = {}
        for batch in self._batches:
            table.update(batch if isinstance(batch, dict) else batch.result())
        return table
