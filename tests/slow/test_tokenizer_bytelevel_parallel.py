"""Long texts under the byte-level tokenizer (SmolLM2) are cut after "<alnum>\\n<letter>" and
encoded in parallel (bytelevel.cut_for_parallel): the ids must be the ids of the whole text,
in both special-token modes — a cut that moved one id would change reqHash for long prompts.

The whole-text ids come from the same Rust backend in one call (no cuts), so the comparison
isolates the cutting. Negative control: a cut the rule forbids (inside a whitespace run) does
change the ids, so the equality is not vacuous.
"""

from __future__ import annotations

import random

import pytest

from support.bytelevel import smollm2_tokenizer, whole_text_ids
from support.random_text import random_texts
from verinfer.engine.tokenizer import bytelevel
from verinfer.engine.tokenizer.bytelevel import ByteLevelTokenizer, cut_for_parallel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tok() -> ByteLevelTokenizer:
    return smollm2_tokenizer()


_whole = whole_text_ids


def _long_text(seed: int, min_chars: int) -> str:
    """Random lines (every input class of random_text) joined so that many lines end in an
    alphanumeric and start with a letter, i.e. many admissible cuts, beside many inadmissible
    newlines (after spaces, before spaces, inside runs)."""
    rng = random.Random(seed)
    parts: list[str] = []
    texts = random_texts(10**9, seed, specials=("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    size = 0
    while size < min_chars:
        line = next(texts) + rng.choice(["word", "x1", "Zürich", "东", ""])
        sep = rng.choice(["\n", "\n", "\n\n", " \n", "\n ", "\r\n", "\n\t"])
        start = rng.choice(["Alpha ", "beta", "é", "Ω", "", " ", "1", "_"])
        parts.append(start + line + sep)
        size += len(parts[-1])
    return "".join(parts)


def test_smollm2_takes_the_parallel_path(tok: ByteLevelTokenizer) -> None:
    assert tok._parallel_cuts


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("parse_special", [True, False])
def test_cut_text_gives_the_ids_of_the_whole(tok: ByteLevelTokenizer, seed: int,
                                             parse_special: bool) -> None:
    text = _long_text(seed, 3 * bytelevel.PARALLEL_MIN_CHARS)
    chunks = cut_for_parallel(text)
    assert len(chunks) > 2 and "".join(chunks) == text
    assert tok.encode(text, add_bos=False, add_eos=False,
                      parse_special=parse_special) == _whole(tok, text, parse_special)


def test_every_admissible_cut_keeps_the_ids(tok: ByteLevelTokenizer) -> None:
    """10,000 random (left, right) pairs around one admissible newline: ids(left + "\\n" +
    right) == ids(left + "\\n") + ids(right)."""
    rng = random.Random(7)
    lefts = random_texts(10_000, 11, specials=("<|im_start|>", "<|im_end|>"))
    rights = random_texts(10_000, 12, specials=("<|im_start|>", "<|im_end|>"))
    checked = 0
    for a, b in zip(lefts, rights, strict=True):
        a += rng.choice(["a", "Z", "7", "é", "東", "ß", "Ω"])
        b = rng.choice(["a", "Z", "é", "東", "ß", "Ω", "ǅ"]) + b
        joined = a + "\n" + b
        for special in (True, False):
            assert _whole(tok, joined, special) == (
                _whole(tok, a + "\n", special) + _whole(tok, b, special)), repr(joined)
        checked += 1
    assert checked == 10_000


def test_a_forbidden_cut_would_change_the_ids(tok: ByteLevelTokenizer) -> None:
    """Negative control: cutting after a newline that follows a space merges differently."""
    a, b = "hello \n", "world"
    assert _whole(tok, a + b, False) != _whole(tok, a, False) + _whole(tok, b, False)
    assert cut_for_parallel("x" * 70_000 + " \n" + "y" * 70_000) == ["x" * 70_000 + " \n"
                                                                    + "y" * 70_000]
