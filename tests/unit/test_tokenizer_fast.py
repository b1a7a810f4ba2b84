"""The fast SentencePiece path (HF ``tokenizers``) against the pure-Python reference on the tiny
vocabulary in its Gemma variant: same ids on random text in both special-token modes, with and
without the space prefix, across a piece that spans a word cut, and the same hash."""

from __future__ import annotations

import threading

import pytest

from support.random_text import random_texts
from verinfer.engine.tokenizer import fast_spm
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer, fast_spm_refusal
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import SPACE
from verinfer.engine.tokenizer.spm import SpmTokenizer, tiny_spm_vocab
from verinfer.errors import TokenizerError

# ">▁</" and "a▁b" span a cut the word splitter would make without its exceptions; "▁▁x" and
# "xx▁" exercise runs around a cut
EXTRA = ("> </", "a b", "  x", "xx ", "\u00e9\u00e9", "東京", "👍")


def _pair(**overrides: object) -> tuple[Tokenizer, SpmTokenizer]:
    fields = tiny_spm_vocab(EXTRA)
    fields.update({"tokenizer.ggml." + k: v for k, v in overrides.items()})
    fast = tokenizer_from_gguf_fields(fields, variant="gemma")
    return fast, SpmTokenizer(fast.spec)


@pytest.fixture(scope="module")
def pair() -> tuple[Tokenizer, SpmTokenizer]:
    return _pair()


def _specials(tok: Tokenizer) -> list[str]:
    return [t for i, t in enumerate(tok.spec.tokens) if tok.is_special(i)] + ["\n"]


def test_gemma_variant_takes_the_fast_path(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    assert isinstance(fast, FastSpmTokenizer)
    assert fast.hash == ref.hash  # the hash is the spec's, whichever implementation runs
    assert fast.spec.canonical_json() == ref.spec.canonical_json()


@pytest.mark.parametrize("prefix", [False, True], ids=["no_prefix", "space_prefix"])
def test_random_text_same_ids_as_reference(prefix: bool) -> None:
    fast, ref = _pair(add_space_prefix=prefix)
    for text in random_texts(2500, seed=19 + prefix, specials=_specials(fast)):
        for special in (True, False):
            got = fast.encode(text, parse_special=special)
            assert got == ref.encode(text, parse_special=special), (repr(text), special)


def test_pieces_across_word_cuts(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    spans = fast.token_to_id(">" + SPACE + "</")
    assert spans is not None
    for text in ["<a> </b>", "x> </y> </z", ">  </", "a b", "a  b", "a bc a b", "  x", "xx  x",
                 " " * 9 + "x", "xx " * 5, "> </" * 3]:
        assert fast.encode(text) == ref.encode(text), repr(text)
    assert spans in fast.encode("<a> </b>")


def test_byte_fallback_and_specials(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    for text in ["\ue000\U0010fffd", "ok<start_of_turn>user\nhi<end_of_turn>\n\n", "<0x41>",
                 "<start_of_turn", "\x00\x1f\x7f", "e\u0301\u0302", ""]:
        for special in (True, False):
            assert fast.encode(text, parse_special=special) == ref.encode(
                text, parse_special=special), (repr(text), special)
    sot = fast.token_to_id("<start_of_turn>")
    assert sot in fast.encode("<start_of_turn>")
    assert sot not in fast.encode("<start_of_turn>", parse_special=False)


def test_lone_surrogates_fall_back_to_the_reference(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    text = "a\ud800b<end_of_turn>\udfff"
    assert fast.encode(text) == ref.encode(text)
    assert fast.decode(fast.encode(text)) == ref.decode(ref.encode(text))


def test_lazy_backend_is_built_once_under_concurrency() -> None:
    fast, ref = _pair()
    texts = list(random_texts(40, seed=7))
    results: list[list[list[int]]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append([fast.encode(t) for t in texts])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    want = [ref.encode(t) for t in texts]
    assert all(r == want for r in results)


def test_spm_variant_and_odd_vocabularies_keep_the_reference() -> None:
    spm = tokenizer_from_gguf_fields(tiny_spm_vocab())  # llama.cpp score order
    assert type(spm) is SpmTokenizer
    assert "tie" in (fast_spm_refusal(spm.spec) or "")
    fields = tiny_spm_vocab()
    tokens = list(fields["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    tokens[tokens.index("<0x41>")] = "<0x41>x"  # one byte-fallback token missing
    fields["tokenizer.ggml.tokens"] = tokens
    odd = tokenizer_from_gguf_fields(fields, variant="gemma")
    assert type(odd) is SpmTokenizer
    with pytest.raises(TokenizerError, match="byte-fallback"):
        FastSpmTokenizer(odd.spec)


def test_merge_ranks_follow_the_reference_priority(pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    """Rank order = the reference's heap order: merged token's id, then the longer left piece
    (priority ``id * 2**20 - len(left)``), for every merge of the vocabulary."""
    fast, ref = pair
    assert isinstance(fast, FastSpmTokenizer)
    merges = fast._merge_list()
    prio = [ref._prio[a + b] - len(a) for a, b in merges]
    assert prio == sorted(prio) and len(set(prio)) == len(prio)
    pieces = ref._piece_id
    expected = {(p[:k], p[k:]) for p in pieces for k in range(1, len(p))
                if p[:k] in pieces and p[k:] in pieces}
    assert set(merges) == expected


def test_merge_with_a_byte_token_keeps_the_reference() -> None:
    """A piece "<0xA9>z" would let HF merge a fallback byte (from "é") with "z"; the reference
    never merges fallback bytes, so such a vocabulary is encoded by the reference."""
    fields = tiny_spm_vocab(["<0xA9>z"])
    fast = tokenizer_from_gguf_fields(fields, variant="gemma")
    assert isinstance(fast, FastSpmTokenizer)
    ref = SpmTokenizer(fast.spec)
    assert fast.encode("éz") == ref.encode("éz")
    assert fast.token_to_id("<0xA9>z") not in fast.encode("éz")
    assert fast._rust(False) is None and fast._rust(True) is None


def test_long_text_is_cut_at_newlines_and_stays_equal(
        pair: tuple[Tokenizer, SpmTokenizer]) -> None:
    fast, ref = pair
    assert isinstance(fast, FastSpmTokenizer)
    parts = list(random_texts(8000, seed=11, specials=_specials(fast), max_chunks=12))
    # newline runs of every length, CRLF and cuts landing inside runs
    text = "".join(p + "\n" * (i % 5) + ("\r" if i % 7 == 0 else "") for i, p in enumerate(parts))
    assert len(text) >= 2 * fast_spm.PARALLEL_MIN_CHARS
    chunks = fast._chunks(text)
    assert len(chunks) > 2 and "".join(chunks) == text
    assert all(c.startswith("\n") and c[:1] != c.lstrip("\n")[:1] for c in chunks[1:])
    for special in (True, False):
        assert fast.encode(text, parse_special=special) == ref.encode(text, parse_special=special)
    one_line = text.replace("\n", " ")
    assert fast._chunks(one_line) == [one_line]
    assert fast.encode(one_line) == ref.encode(one_line)
