"""The distinct-word path of the byte-level tokenizer (bytelevel_words) gives the ids of HF's
whole-text call, on SmolLM2's real vocabulary, in both special-token modes.

The reference is the same Rust backend encoding the text in one call (no cuts, no words): the
path the slow tests prove equal to transformers' own conversion of the GGUF. Checked: a corpus
of real text cut into chunks for both pre-token searches, 10,000 random strings of every
input class, 4,000 strings over the characters where the fused digit rule and the whitespace
lookahead interact, the code points whose Unicode class the two libraries see differently
(and that every other code point is classed alike), and negative controls: the digit step
left out, an illegal reordering of the pattern, a disagreeing code point let through.
"""

from __future__ import annotations

import itertools
import random
import re
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import regex

from support.bytelevel import smollm2_tokenizer, whole_text_ids
from support.random_text import random_texts
from verinfer.engine.loader import smollm2_model_path
from verinfer.engine.tokenizer import bytelevel_words
from verinfer.engine.tokenizer.bytelevel import ByteLevelTokenizer, cut_for_parallel
from verinfer.engine.tokenizer.bytelevel_words import (
    CLASS_DISAGREEMENTS,
    WordEncoder,
    class_disagreements,
)
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import read_gguf_tokenizer_fields
from verinfer.errors import TokenizerError

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>")


@pytest.fixture(scope="module")
def tok() -> ByteLevelTokenizer:
    return smollm2_tokenizer()


_whole = whole_text_ids


def _words(tok: ByteLevelTokenizer, parse_special: bool) -> WordEncoder:
    encoder = tok._word_encoder(parse_special)
    assert encoder is not None
    return encoder


def _disagrees(text: str) -> bool:
    return any(a <= ord(c) <= b for c in text for a, b in CLASS_DISAGREEMENTS)


def _corpus() -> str:
    """~300 kB of real text: the standard library's first modules, and the multilingual lines
    below with the chat markup (in both modes special tokens must come out right)."""
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]
    lines = [
        "Café owners in Zürich, naïve coöperators — 東京, 서울, Москва, القاهرة.",
        "<|im_start|>user\nWhat is 2³ + ½ + ٣ + Ⅻ?<|im_end|>\n<|im_start|>assistant\n",
        "Emoji: 😀😃 👍🏽 🇫🇷 👨‍👩‍👧‍👦 and don't I'll we've they're it's",
        "\t\ttabs\r\n  spaces   \u00a0nbsp\u2003em  \n\n\n1,000,000 people: -42 +7.5e-3",
    ]
    return "\n".join([p.read_text(encoding="utf-8") for p in paths] + lines * 50)


def test_smollm2_takes_the_word_path(tok: ByteLevelTokenizer) -> None:
    assert bytelevel_words.word_path_available()
    assert _words(tok, True) is not _words(tok, False)


@pytest.mark.parametrize("parse_special", [True, False])
def test_corpus_same_ids_as_the_whole_text(tok: ByteLevelTokenizer, parse_special: bool) -> None:
    text = _corpus()
    chunks = cut_for_parallel(text, step=bytelevel_words.CHUNK_CHARS)
    # chunks for both searches: re (all ASCII) and the regex package
    assert sum(c.isascii() for c in chunks) > 1 and sum(not c.isascii() for c in chunks) > 1
    ids = _words(tok, parse_special).encode(text)
    assert ids is not None and ids == _whole(tok, text, parse_special)
    assert tok.encode(text, parse_special=parse_special) == ids


def test_random_strings_same_ids_as_the_whole_text(tok: ByteLevelTokenizer) -> None:
    """10,000 strings of every input class of support.random_text (specials included)."""
    on_word_path = 0
    for text in random_texts(10_000, seed=1905, specials=SPECIALS):
        for special in (True, False):
            ids = _words(tok, special).encode(text)
            if ids is None:  # (its random BMP characters hold a disagreeing code point)
                assert _disagrees(text), repr(text)
                ids = tok.encode(text, parse_special=special)
            else:
                on_word_path += 1
            assert ids == _whole(tok, text, special), (repr(text), special)
    assert on_word_path > 19_800


def test_digits_spaces_and_apostrophes_same_ids(tok: ByteLevelTokenizer) -> None:
    """The characters where the fused digit rule, the whitespace lookahead and the reordered
    alternatives meet: ASCII and other numerals (Nd, Nl, No), spaces, newlines, apostrophes,
    letters, symbols and a special token: 4,000 random strings of up to 24 of them."""
    alphabet = [
        " ",
        " ",
        "  ",
        "\n",
        "\t",
        "\u00a0",
        "1",
        "7",
        "²",
        "½",
        "٣",
        "Ⅻ",
        "a",
        "s",
        "t",
        "re",
        "ll",
        "'",
        "'s",
        "é",
        "東",
        ".",
        "-",
        "_",
        "😀",
        "<|im_end|>",
    ]
    rng = random.Random(19)
    for _ in range(4_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        for special in (True, False):
            assert _words(tok, special).encode(text) == _whole(tok, text, special), repr(text)


def _ascii_strings() -> list[str]:
    """Every ASCII string of up to 2 characters; every one of 3 over a representative alphabet
    (spaces, the \\x1c-\\x1f separators Python's own \\s would take, letters, an apostrophe
    and contraction letters, a digit, symbols, controls) and of 4 over a smaller one; 10,000
    random ones of up to 40 characters."""
    every = [chr(c) for c in range(128)]
    rep = [" ", "\t", "\n", "\x0b", "\x1c", "\x1f", "a", "Z", "s", "l", "'", "1", ".", "_", "\x00"]
    small = [" ", "\n", "a", "'", "s", "1", "."]
    out = ["", *every, *(a + b for a in every for b in every)]
    out += ["".join(t) for t in itertools.product(rep, repeat=3)]
    out += ["".join(t) for t in itertools.product(small, repeat=4)]
    rng = random.Random(128)
    out += [
        "".join(rng.choice(every + rep * 4) for _ in range(rng.randint(0, 40)))
        for _ in range(10_000)
    ]
    return out


@pytest.mark.parametrize("pre", ["smollm", "gpt2"])
def test_ascii_pattern_finds_the_same_pieces(pre: str) -> None:
    """ASCII chunks are searched by the standard library's re with spelled-out classes: the same
    pieces as the regex package's pattern (itself equal to HF's, above) on every short ASCII
    string and many random ones. Negative control: Python's own \\s (which takes \\x1c-\\x1f)
    in place of the spelled-out spaces finds other pieces."""
    ours = re.compile(bytelevel_words.pattern(pre, ascii_only=True))
    unicode_pattern = regex.compile(bytelevel_words.pattern(pre))
    strings = _ascii_strings()
    for text in strings:
        assert ours.findall(text) == unicode_pattern.findall(text), repr(text)
    python_spaces = re.compile(
        bytelevel_words.pattern(pre, ascii_only=True).replace(r"[\t\n\x0b\x0c\r ]", r"\s")
    )
    assert any(python_spaces.findall(t) != unicode_pattern.findall(t) for t in strings)


def test_every_other_code_point_is_classed_alike() -> None:
    """Each code point's letter/numeral/space class, HF (Oniguruma, Rust) against the regex
    package: they differ exactly on CLASS_DISAGREEMENTS, the code points that send a text to
    HF's whole-text path. (If this fails after an upgrade, the new value is printed.)"""
    assert class_disagreements() == CLASS_DISAGREEMENTS


@pytest.mark.parametrize("parse_special", [True, False])
def test_disagreeing_code_points_go_to_the_whole_text_path(
    tok: ByteLevelTokenizer, parse_special: bool
) -> None:
    """Negative control of the guard: a code point the regex package calls a letter and HF
    does not would split differently, so such texts are encoded whole -- and come out equal."""
    rng = random.Random(5)
    for a, b in CLASS_DISAGREEMENTS:
        for cp in {a, b, rng.randint(a, b)}:
            text = f"x{chr(cp)}y {chr(cp)}1 \n{chr(cp)}"
            assert _words(tok, parse_special).encode(text) is None
            assert tok.encode(text, parse_special=parse_special) == _whole(tok, text, parse_special)
    long_text = _corpus()[:20_000] + chr(CLASS_DISAGREEMENTS[0][0]) + " end"
    assert len(long_text) >= bytelevel_words.WORDS_MIN_CHARS
    assert _words(tok, parse_special).encode(long_text) is None
    assert tok.encode(long_text, parse_special=parse_special) == _whole(
        tok, long_text, parse_special
    )
    armenian = "a\u0558b"  # U+0558: a letter for the regex package, unassigned for Oniguruma
    pieces = regex.findall(bytelevel_words.SMOLLM_PATTERN, armenian)
    hf = tok._backend.pre_tokenizer.pre_tokenize_str(armenian)
    assert len(pieces) != len(hf)  # without the guard the pre-tokens would differ


def _with_pattern(tok: ByteLevelTokenizer, pattern: str) -> WordEncoder:
    added = tok._backend.get_added_tokens_decoder()
    encoder = WordEncoder(
        _words(tok, True)._words,
        "smollm",
        [(t.content, i, t.special) for i, t in added.items()],
        parse_special=True,
        cut=cut_for_parallel,
    )
    encoder._pieces = regex.compile(pattern)
    return encoder


def test_negative_controls_the_pattern_is_not_arbitrary(tok: ByteLevelTokenizer) -> None:
    """The equality tests can fail: HF's GPT-2 pattern without the fused digit step, or the
    whitespace alternatives moved before the letters', change the ids of ordinary text."""
    text = "In 2024, x ² and ³ we've had 366 days  of\n text."
    assert _with_pattern(tok, bytelevel_words.SMOLLM_PATTERN).encode(text) == _whole(
        tok, text, True
    )
    no_digits = _with_pattern(tok, bytelevel_words.HF_GPT2_PATTERN).encode(text)
    assert no_digits is not None and no_digits != _whole(tok, text, True)
    spaces_first = (
        r"""\s+(?![^\s\p{N}])|\s+| ?\p{L}+|'(?:[stmd]|re|ve|ll)|\p{N}|"""
        r""" ?[^\s\p{L}\p{N}]+"""
    )
    moved = _with_pattern(tok, spaces_first).encode(text)
    assert moved is not None and moved != _whole(tok, text, True)


def test_gpt2_pre_tokenizer_same_ids(tok: ByteLevelTokenizer) -> None:
    """The same vocabulary under ``pre = "gpt2"`` (no digit step): the GPT-2 pattern path."""
    fields: dict[str, Any] = dict(read_gguf_tokenizer_fields(smollm2_model_path()))
    fields["tokenizer.ggml.pre"] = "gpt2"
    gpt2 = tokenizer_from_gguf_fields(fields)
    assert isinstance(gpt2, ByteLevelTokenizer)
    for text in random_texts(2_000, seed=2, specials=SPECIALS):
        for special in (True, False):
            ids = _words(gpt2, special).encode(text)
            assert ids is not None and ids == _whole(gpt2, text, special), repr(text)


def test_lone_surrogate_is_a_tokenizer_error(tok: ByteLevelTokenizer) -> None:
    with pytest.raises(TokenizerError):
        tok.encode("abc \ud800 def")


def test_the_path_changes_neither_ids_nor_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer's identity is its spec: with the word path turned off (as under other
    library versions) the hash and the ids of a long text are the same."""
    fields = read_gguf_tokenizer_fields(smollm2_model_path())
    fast = tokenizer_from_gguf_fields(fields)
    assert isinstance(fast, ByteLevelTokenizer)
    _words(fast, True), _words(fast, False)  # built now, before the versions are patched
    monkeypatch.setattr(bytelevel_words, "DERIVED_FOR", {"tokenizers": "0", "regex": "0"})
    assert not bytelevel_words.word_path_available()
    whole = tokenizer_from_gguf_fields(fields)
    assert isinstance(whole, ByteLevelTokenizer) and whole._word_encoder(True) is None
    assert fast.hash == whole.hash and fast.spec == whole.spec
    text = _corpus()[:50_000]
    for special in (True, False):
        assert fast.encode(text, parse_special=special) == whole.encode(text, parse_special=special)


def test_user_tokens_beside_special_ones_same_ids() -> None:
    """User-defined tokens (matched in both modes) overlapping special ones: HF finds added
    tokens leftmost-longest among all of them and, with special parsing off, leaves a special
    one it found as text -- hiding a user token inside it. Negative control: matching only the
    user tokens in that mode (the obvious shortcut) splits "tar" out of "<|im_start|>"."""
    fields: dict[str, Any] = dict(read_gguf_tokenizer_fields(smollm2_model_path()))
    types = list(fields["tokenizer.ggml.token_type"])
    tokens = list(fields["tokenizer.ggml.tokens"])
    for user in ("tar", "text", "im"):
        types[tokens.index(user)] = 4  # user-defined
    fields["tokenizer.ggml.token_type"] = types
    tok = tokenizer_from_gguf_fields(fields)
    assert isinstance(tok, ByteLevelTokenizer)
    parts = [
        "<|im_start|>",
        "start",
        "im_start",
        "<|im_end|>",
        "text",
        " text",
        "imim",
        "<|",
        "tar",
        "startar",
        "user\n",
        "x",
        " ",
        "1",
    ]
    rng = random.Random(4)
    texts = ["<|im_start|>user"] + [
        "".join(rng.choice(parts) for _ in range(rng.randint(0, 12))) for _ in range(3_000)
    ]
    for text in texts:
        for special in (True, False):
            assert _words(tok, special).encode(text) == _whole(tok, text, special), repr(text)
    added = tok._backend.get_added_tokens_decoder()
    only_user = WordEncoder(
        _words(tok, False)._words,
        "smollm",
        [(t.content, i, t.special) for i, t in added.items() if not t.special],
        parse_special=False,
        cut=cut_for_parallel,
    )
    text = "<|im_start|>user"
    assert only_user.encode(text) != _whole(tok, text, False)
