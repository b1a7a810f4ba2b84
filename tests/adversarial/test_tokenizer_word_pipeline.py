"""Gemma's word path's pipeline (engine/tokenizer/word_batches.Pipeline): each group of chunks is
cut while HF BPEs the previous group's new words in a worker thread. Token ids are a protocol rule
(the operator and every verifier must get the same ones), so whoever could make the ids depend
on thread timing, group boundaries or which group first holds a word would make an honest
verifier disagree with an honest operator. These tests cut texts into many small groups and
check the ids against the whole-text call and the pure-Python reference, with words first met
in coarse (non-ASCII) chunks and later in fine ones and the other way round, and several
threads encoding at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from support.random_text import random_texts
from support.spm_words import backend_and_words, whole_ids
from verinfer.engine.tokenizer import word_batches
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spm import SpmTokenizer, tiny_spm_vocab

FINE_EXTRA = ("> </", "  x", "\x1b[", ")\x1b[", "\u00e9\u00e9", "東京", "👍")


@pytest.fixture(scope="module")
def spm() -> FastSpmTokenizer:
    tok = tokenizer_from_gguf_fields(tiny_spm_vocab(FINE_EXTRA), variant="gemma")
    assert isinstance(tok, FastSpmTokenizer)
    return tok


@pytest.fixture
def workers(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Small groups (many batches per text), and the threads HF's batches ran on."""
    monkeypatch.setattr(word_batches, "GROUP_CHARS", 3000)
    seen: set[int] = set()
    real: Callable[..., Any] = word_batches._run

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.add(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(word_batches, "_run", spy)
    return seen


def _mixed_text(seed: int) -> str:
    """Random text whose words recur across groups in all-ASCII chunks (the fine pattern) and
    in chunks holding a non-ASCII character (the coarse one, then refined)."""
    parts = list(random_texts(1500, seed=seed, max_chunks=10))
    ascii_words = "\n".join(f"def f{i}(x): return x.y[{i}] > </a> " for i in range(400))
    block = ascii_words + "\n"
    accented = block.replace("return", "retürn", 7)  # same words, now in coarse chunks
    return "".join([accented, block, *(p + "\n" * (i % 3) for i, p in enumerate(parts)),
                    block, accented])


@pytest.mark.parametrize("seed", [41, 42])
def test_spm_groups_give_the_whole_texts_ids(spm: FastSpmTokenizer, workers: set[int],
                                            seed: int) -> None:
    text = _mixed_text(seed)
    ref = SpmTokenizer(spm.spec)
    for special in (True, False):
        backend, words = backend_and_words(spm, special)
        assert len(word_batches.groups(words._cut(text), 3000)) > 5  # type: ignore[misc]
        got = words.encode(text)
        if got is None:  # only a special token left as text may refuse
            assert not special
            continue
        assert got == whole_ids(backend, text), special
        assert got == ref.encode(text, add_bos=False, parse_special=special), special
    # HF's batches ran beside the cutting, never on the calling thread
    assert workers and threading.get_ident() not in workers


def test_spm_concurrent_calls_agree(spm: FastSpmTokenizer, workers: set[int]) -> None:
    texts = [_mixed_text(s) for s in (43, 44, 45, 46)]
    want = [whole_ids(backend_and_words(spm, True)[0], t) for t in texts]
    got: dict[int, list[int]] = {}

    def run(k: int) -> None:
        got[k] = spm.encode(texts[k], add_bos=False)

    threads = [threading.Thread(target=run, args=(k % 4,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[k] for k in range(4)] == want


def test_negative_control_a_lost_batch_is_caught(spm: FastSpmTokenizer, workers: set[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above see every group's batch: keeping only the last one breaks the call."""
    real = word_batches.Pipeline.table

    def last_only(self: word_batches.Pipeline) -> Any:
        self._batches = self._batches[-1:]
        return real(self)

    monkeypatch.setattr(word_batches.Pipeline, "table", last_only)
    with pytest.raises(KeyError):
        backend_and_words(spm, True)[1].encode(_mixed_text(41))
