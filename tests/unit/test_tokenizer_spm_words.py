"""The SentencePiece word path (engine/tokenizer/spm_words.py) on the tiny vocabulary (Gemma
variant): the ids of the backend's whole-text call and of the pure-Python reference, in both
special-token modes, on random, whitespace-heavy and added-token-heavy text; each pattern cuts
exactly where its rule says; and negative controls: a cut the merges forbid and a missing
added-token guard change the ids, a merge across a fine cut turns the fine pattern off."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from support.random_text import random_texts
from support.spm_words import added_heavy, backend_and_words, whitespace_heavy, whole_ids
from verinfer.engine.tokenizer import spm_words as sw
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import SPACE
from verinfer.engine.tokenizer.spm import SpmTokenizer, tiny_spm_vocab

# ">▁</" joins ">" to a following space (the glued case); "\x1b[" and ")\x1b[" join controls
# and punctuation, as in Gemma; no piece crosses a fine cut
FINE_EXTRA = ("> </", "  x", "\x1b[", ")\x1b[", "\u00e9\u00e9", "東京", "👍")
# "a b" and "xx " join a letter to a following space: the fine cuts are unsafe, the coarse
# ones hold
COARSE_EXTRA = ("a b", "xx ", *FINE_EXTRA)


def _fast(extra: tuple[str, ...], **overrides: object) -> FastSpmTokenizer:
    fields = tiny_spm_vocab(extra)
    fields.update({"tokenizer.ggml." + k: v for k, v in overrides.items()})
    tok = tokenizer_from_gguf_fields(fields, variant="gemma")
    assert isinstance(tok, FastSpmTokenizer)
    return tok


@pytest.fixture(scope="module", params=["fine", "coarse"])
def tok(request: pytest.FixtureRequest) -> FastSpmTokenizer:
    t = _fast(FINE_EXTRA if request.param == "fine" else COARSE_EXTRA)
    for special in (True, False):
        assert backend_and_words(t, special)[1].fine is (request.param == "fine")
    return t


def _specials(tok: Tokenizer) -> list[str]:
    return [t for i, t in enumerate(tok.spec.tokens) if tok.is_special(i)] + ["\n"]


def _check(tok: FastSpmTokenizer, texts: list[str]) -> int:
    """Asserts word ids == whole-text ids == reference ids for every text and both modes;
    returns how many (text, mode) took the word path (the rest: a special token as text)."""
    ref = SpmTokenizer(tok.spec)
    used = 0
    for special in (True, False):
        backend, words = backend_and_words(tok, special)
        for text in texts:
            want = whole_ids(backend, text)
            got = words.encode(text)
            if got is None:  # only a special token left as text may refuse
                assert not special and any(s in text for s in _specials(tok)[:-1]), repr(text)
                continue
            used += 1
            assert got == want, (repr(text), special)
            assert got == ref.encode(text, add_bos=False, parse_special=special), repr(text)
    return used


def test_random_text_same_ids(tok: FastSpmTokenizer) -> None:
    texts = list(random_texts(5000, seed=23, specials=_specials(tok)))
    assert _check(tok, texts) > 1.6 * len(texts)


def test_whitespace_heavy_text_same_ids(tok: FastSpmTokenizer) -> None:
    texts = list(whitespace_heavy(3000, seed=3))
    assert _check(tok, texts) == 2 * len(texts)


def test_added_token_heavy_text_same_ids(tok: FastSpmTokenizer) -> None:
    texts = list(added_heavy(3000, seed=4, added=_specials(tok)))
    assert _check(tok, texts) > len(texts)


def test_long_text_goes_word_by_word_and_stays_equal(tok: FastSpmTokenizer) -> None:
    """Through encode (the default path): a text over the threshold, cut into chunks."""
    parts = list(random_texts(3000, seed=31, max_chunks=12))
    text = "".join(p + "\n" * (i % 4) for i, p in enumerate(parts))
    assert len(text) > 4 * sw.CHUNK_CHARS
    _, words = backend_and_words(tok, True)
    assert len(words._cut(text)) > 3  # type: ignore[misc]
    ref = SpmTokenizer(tok.spec)
    got = tok.encode(text)
    tok.word_path = False
    try:
        assert tok.encode(text) == got  # the old path, selectable
    finally:
        tok.word_path = True
    assert got == ref.encode(text)
    assert tok.hash == ref.hash


def test_special_text_with_parsing_off_is_text() -> None:
    """With special parsing off a control token's text is text: no user token can overlap one
    here, so the word patterns take it like any other (same ids as HF, which finds it and
    leaves it as text)."""
    tok = _fast(FINE_EXTRA)
    backend, words = backend_and_words(tok, False)
    text = "x(<start_of_turn>y <eos>\n" * 400
    assert words.encode(text) == whole_ids(backend, text)
    assert tok.token_to_id("<start_of_turn>") not in whole_ids(backend, text)


def test_user_token_a_special_one_can_hide_falls_back() -> None:
    """HF's matcher finds special tokens even with parsing off, and a user token overlapping
    one ("of_t" inside "<start_of_turn>") is then not split out: such a text goes whole."""
    fields = tiny_spm_vocab(("of_t", *FINE_EXTRA))
    tokens = list(fields["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    types = list(fields["tokenizer.ggml.token_type"])  # type: ignore[call-overload]
    types[tokens.index("of_t")] = 4  # user-defined
    fields["tokenizer.ggml.token_type"] = types
    tok = tokenizer_from_gguf_fields(fields, variant="gemma")
    assert isinstance(tok, FastSpmTokenizer)
    backend, words = backend_and_words(tok, False)
    text = "x(<start_of_turn>y of_t\n" * 400
    assert words.encode(text) is None
    assert tok.encode(text, parse_special=False) == SpmTokenizer(tok.spec).encode(
        text, parse_special=False)
    plain = "x(of_t)y of_t\n" * 400  # no special text: the word path
    assert words.encode(plain) == whole_ids(backend, plain)
    assert sw._hides(["<start_of_turn>"], ["of_t"]) and sw._hides(["<ab>"], [">c"])
    assert sw._hides(["b<a>"], ["xb"]) and not sw._hides(["<eos>"], ["\n", "<table>"])


# -- negative controls -------------------------------------------------------------------------

def _added(backend: object) -> list[str]:
    return [t.content for t in backend.get_added_tokens_decoder().values()]  # type: ignore[attr-defined]


def _with_fine(words: sw.SpmWordEncoder, pattern: str, text: str) -> list[int] | None:
    """``words.encode(text)`` with its fine pattern replaced by ``pattern`` (then restored: the
    encoder is shared by every tokenizer of this vocabulary)."""
    saved = words._fine, words.fine
    words._fine, words.fine = re.compile(pattern), True  # type: ignore[misc]
    try:
        return words.encode(text)
    finally:
        words._fine, words.fine = saved  # type: ignore[misc]


def test_a_cut_the_merges_forbid_changes_ids() -> None:
    """Cutting before every space, ">" included (the glue left out), splits ">▁</"."""
    tok = _fast(FINE_EXTRA)
    backend, words = backend_and_words(tok, True)
    added = _added(backend)
    trie, first = sw.trie_pattern(added), frozenset(t[0] for t in added)
    text = "<a> </b> </c>"
    assert tok.token_to_id(">" + SPACE + "</") in whole_ids(backend, text)
    assert words.encode(text) == whole_ids(backend, text)
    assert _with_fine(words, sw.fine_pattern(trie, first, frozenset(">")), text) == whole_ids(
        backend, text)
    assert _with_fine(words, sw.fine_pattern(trie, first, frozenset()), text) != whole_ids(
        backend, text)


def test_a_missing_added_token_guard_changes_ids() -> None:
    """Without the (?!ADDED) guards a word runs into an added token ("(<start_of_turn>")."""
    tok = _fast(FINE_EXTRA)
    backend, words = backend_and_words(tok, True)
    added = _added(backend)
    trie, first = sw.trie_pattern(added), frozenset(t[0] for t in added)
    text = "x(<start_of_turn>y\n"
    assert words.encode(text) == whole_ids(backend, text)
    assert _with_fine(words, sw.fine_pattern(trie, first, frozenset(">")), text) == whole_ids(
        backend, text)
    assert _with_fine(words, sw.fine_pattern(trie, frozenset(), frozenset(">")), text) != (
        whole_ids(backend, text))


@pytest.mark.parametrize("piece", ["t.", "a1", "1a", ".a", "1.", "e\x07", "a ", "3 "])
def test_a_merge_across_a_fine_cut_turns_it_off(piece: str) -> None:
    tok = _fast((piece, *FINE_EXTRA))
    assert tok.token_to_id(piece.replace(" ", SPACE)) is not None
    backend, words = backend_and_words(tok, True)
    assert not words.fine
    joins = sw.joinable_pairs(tok._merge_list())
    assert sw.fine_refusal(joins) is not None
    text = f"{piece} {piece}{piece}x"
    assert words.encode(text) == whole_ids(backend, text)
    # the fine pattern on it would cut the piece apart: different ids
    added = _added(backend)
    fine = sw.fine_pattern(sw.trie_pattern(added), frozenset(t[0] for t in added),
                           sw.glued_before_space(joins))
    assert _with_fine(words, fine, text) != whole_ids(backend, text)


# -- the patterns and helpers --------------------------------------------------------------------

def _cuts(words: list[str]) -> set[int]:
    return set(itertools.accumulate(len(w) for w in words[:-1]))


def test_fine_pattern_cuts_exactly_where_its_rule_says() -> None:
    """Every string of up to 4 characters over a representative ASCII alphabet: the pattern's
    word boundaries are the positions where ``_fine_cut`` holds, and the words cover the text."""
    glued = frozenset(">")
    pattern = re.compile(sw.fine_pattern("", frozenset(), glued))
    alphabet = "aZ05 (>.\x1b\x7f"
    for n in range(1, 5):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            words = pattern.findall(s)
            assert "".join(words) == s
            want = {i for i in range(1, n) if sw._fine_cut(s[i - 1], s[i], glued)}
            # a space run is never cut after; trailing spaces are a word of their own
            assert _cuts(words) == want, (s, words)


def test_coarse_pattern_cuts_only_before_spaces() -> None:
    glued = frozenset(">")
    pattern = re.compile(sw.coarse_pattern("", frozenset(), glued))
    alphabet = ["a", " ", SPACE, ">", "é", "\n", "."]
    for n in range(1, 5):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            words = pattern.findall(s)
            assert "".join(words) == s
            want = {i for i in range(1, n) if s[i] in (" ", SPACE)
                    and s[i - 1] not in (" ", SPACE) and s[i - 1] not in glued}
            assert _cuts(words) == want, (s, words)


def test_trie_pattern_is_leftmost_longest() -> None:
    rng = random.Random(8)
    for _ in range(300):
        tokens = sorted({"".join(rng.choice("ab<>") for _ in range(rng.randint(1, 4)))
                         for _ in range(rng.randint(1, 6))})
        text = "".join(rng.choice("ab<>x") for _ in range(30))
        got = [(m.start(), m.group()) for m in re.finditer(sw.trie_pattern(tokens), text)]
        want, pos = [], 0
        while pos < len(text):  # brute force: leftmost start, longest there
            hits = [(s, -len(t), t) for s in range(pos, len(text)) for t in tokens
                    if text.startswith(t, s)]
            if not hits:
                break
            s, _, t = min(hits)
            want.append((s, t))
            pos = s + len(t)
        assert got == want, (tokens, text)


def test_newline_cuts_concatenate_and_cut_before_a_run() -> None:
    rng = random.Random(2)
    text = "".join(rng.choice(["ab", " ", "\n", "\n\n\n", "x" * 50]) for _ in range(4000))
    chunks = sw.newline_cuts(text, 100)
    assert "".join(chunks) == text and len(chunks) > 10
    assert all(c.startswith("\n") and c[:1] != c.lstrip("\n")[:1] for c in chunks[1:])


def test_refusals() -> None:
    assert sw.words_refusal([("<x>", 5, True)], add_space_prefix=True)
    assert sw.words_refusal([("a b", 5, False)], add_space_prefix=False)
    assert sw.words_refusal([(SPACE + "x", 5, False)], add_space_prefix=False)
    assert sw.words_refusal([("<x>", 5, True)], add_space_prefix=False) is None
    prefixed = _fast(FINE_EXTRA, add_space_prefix=True)
    prefixed._rust(True)
    assert prefixed._mine_words[True] is None  # whole-text path, still the reference's ids
    text = "hello world\n" * 500
    assert prefixed.encode(text) == SpmTokenizer(prefixed.spec).encode(text)


def test_added_tokens_too_deep_for_re_keep_the_whole_text_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trie of nested added tokens ("x", "xx", ... 1,199 of them) is too deep for ``re``:
    such a vocabulary keeps the whole-text path instead of failing to build."""
    with pytest.raises(RecursionError):
        re.compile(sw.trie_pattern(["x" * k for k in range(1, 1200)]))
    from verinfer.engine.tokenizer import fast_spm

    def too_deep(*args: object, **kwargs: object) -> sw.SpmWordEncoder:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(fast_spm, "SpmWordEncoder", too_deep)
    tok = _fast(("deep", *FINE_EXTRA))
    assert tok._rust(True) is not None and tok._mine_words[True] is None
    text = "deep text\n" * 600
    assert tok.encode(text) == SpmTokenizer(tok.spec).encode(text)
