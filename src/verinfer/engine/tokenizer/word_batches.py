"""Distinct words BPE'd once each by HF, spread over the cores: the one home of the batching
both word paths (``bytelevel_words``, ``spm_words``) use, and of the pipeline that hands HF
each group's new words while the next group is cut (:class:`Pipeline`; ``spm_words`` only: on
the shared AMD 2-core SmolLM2's path measured 2-17% slower with it in three same-process runs,
never faster -- within that machine's noise, an A/A spread of ~13% -- so ``bytelevel_words``
keeps one batch after the whole cut; docs/tokenizer.md, "The pipeline")."""

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
    batches, spelled = _batches(distinct, spell, cores)
    return _table(batches, _run(backend, spelled))


def _batches(distinct: Iterable[str], spell: Callable[[str], str] | None,
             cores: int | None) -> tuple[list[list[str]], list[list[str]]]:
    """The words in one batch per worker, and as the backend is to see them."""
    words = list(distinct)
    if not words:
        return [], []
    # a few thousand words per batch: fewer would cost more in thread hand-offs than BPE
    cores = cores or os.cpu_count() or 1
    n = max(1, min(len(words) // 2048, 2 * cores if cores > 1 else 1))
    batches = [words[k::n] for k in range(n)]
    return batches, batches if spell is None else [[spell(w) for w in b] for b in batches]


def _run(backend: Any, spelled: list[list[str]]) -> list[Any]:
    """HF's batch call alone (it releases the GIL: a worker thread runs only this)."""
    if not spelled:
        return []
    try:
        return list(backend.encode_batch(spelled, is_pretokenized=True,
                                         add_special_tokens=False))
    except Exception as e:  # the Rust side raises a bare Exception (a lone surrogate...)
        raise TokenizerError(f"tokenizer failed on the input: {e}") from e


def _table(batches: list[list[str]], encodings: list[Any]) -> dict[str, Sequence[int]]:
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
        # each batch: its table, or (its words, the worker's pending encodings)
        self._batches: list[dict[str, Sequence[int]]
                            | tuple[list[list[str]], Future[list[Any]]]] = []

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
            return
        # one core is busy cutting the next group here: HF gets the others. The worker runs
        # HF's call alone: Python work there would contend for the GIL with the cutting (on a
        # loaded machine a descheduled holder stalls the other thread)
        batches, spelled = _batches(todo, self._spell, max(1, (os.cpu_count() or 1) - 1))
        self._batches.append((batches, self._pool.submit(_run, self._backend, spelled)))

    def table(self) -> dict[Any, Sequence[int]]:
        table: dict[Any, Sequence[int]] = {}
        for batch in self._batches:
            if isinstance(batch, dict):
                table.update(batch)
            else:
                words, encodings = batch
                table.update(_table(words, encodings.result()))
        return table
