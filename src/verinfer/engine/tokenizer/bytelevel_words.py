r"""Byte-level BPE encoded word by distinct word: the ids HF ``tokenizers`` gives a whole text,
at a fraction of its cost.

Where HF's time goes (SmolLM2, 4 MB of prose and code): not BPE but pre-tokenization. Each of
the ~1M pre-tokens becomes a ``NormalizedString`` carrying a byte-alignment vector, so the
encoder spends most of its time in malloc, free and page faults. Yet a text of 1M pre-tokens
holds only ~30k distinct ones. So here the text is cut into pre-tokens in Python (ASCII chunks
by the standard library's ``re``, ~24 MB/s, the rest by the ``regex`` package, ~10 MB/s), each
distinct pre-token is encoded once by HF, and the ids are looked up.

Why the ids are HF's, step by step (HF: added tokens, then pre-tokenizer, then BPE per piece):

* Added tokens: HF finds them leftmost-longest, non-overlapping, among all added tokens, and
  with ``encode_special_tokens`` skips the special ones it found (leaving their text as text).
  :class:`WordEncoder` does the same with an alternation of all added tokens, longest first.
* Pre-tokens: the GPT-2 regex (HF's ``ByteLevel`` pattern) run by the ``regex`` package, a
  backtracking engine like HF's Oniguruma, so equal classes give equal matches. For
  ``pre == "smollm"`` HF first isolates every numeric character (``Digits``) and runs the regex
  on the pieces between; :func:`pattern` fuses that into one regex (a numeric character is a
  piece alone, nothing else crosses one, and the whitespace lookahead treats one as the end of
  the text) -- see the comments there. On an all-ASCII chunk the classes are spelled out for
  ``re`` (:data:`ASCII_SMOLLM_PATTERN`).
* Classes: ``\p{L}``, ``\p{N}``, ``\s`` (and Rust's ``char::is_numeric`` behind ``Digits``)
  come from Unicode tables of different versions in the two libraries. The code points where
  they disagree are :data:`CLASS_DISAGREEMENTS` (derived by :func:`class_disagreements` from
  the installed versions, :data:`DERIVED_FOR`; a test re-derives them). A text holding one of
  them is encoded by HF whole (``encode`` returns None); a different ``tokenizers`` or ``regex``
  version turns this path off.
* BPE: each distinct pre-token goes through HF once more, alone, on a backend with the same
  model and no added tokens, whose pre-tokenizer only maps bytes to the byte alphabet (what
  ``ByteLevel`` does after its regex). BPE never looks across pre-tokens, so each piece's ids
  are its ids in context.

tests/unit/test_tokenizer_bytelevel_words.py checks all of it against HF's whole-text call:
a corpus, 10,000+ random strings in both special modes, every code point's class, user tokens
inside special ones, and negative controls for each rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

from verinfer.engine.tokenizer.word_batches import encode_distinct
from verinfer.errors import TokenizerError

__all__ = [
    "CLASS_DISAGREEMENTS",
    "DERIVED_FOR",
    "WordEncoder",
    "class_disagreements",
    "pattern",
    "word_path_available",
    "words_backend",
]

# HF tokenizers' ByteLevel pre-tokenizer pattern (tokenizers/src/pre_tokenizers/byte_level.rs)
HF_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The same language, matched ~20% faster: the letters' alternative (most pieces) goes first,
# and the contractions share their apostrophe. Both changes keep every match: alternatives
# that cannot start with the same character never compete for a position (" ?\p{L}+" starts
# with a space or a letter, a contraction with "'"), and the contractions differ in their
# second character.
GPT2_PATTERN = r""" ?\p{L}+|'(?:[stmd]|re|ve|ll)| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Digits(individual_digits=True), then the GPT-2 pattern on the pieces between the numerals:
# - a numeral is a piece alone (its own Digits piece; any one character is one regex piece);
#   " ?\p{N}+" of the original becomes "\p{N}": no space or second numeral joins it;
# - letters and other symbols stop at a numeral already (their classes exclude \p{N});
# - a whitespace run right before a numeral ends its Digits piece, where "(?!\S)" holds: the
#   lookahead becomes "not a non-space non-numeral".
SMOLLM_PATTERN = (
    r""" ?\p{L}+|'(?:[stmd]|re|ve|ll)|\p{N}| ?[^\s\p{L}\p{N}]+"""
    r"""|\s+(?![^\s\p{N}])|\s+"""
)

# On ASCII text the classes are fixed by Unicode since 1.1 and spelled out here: letters
# [A-Za-z], numerals [0-9], spaces [\t\n\v\f\r ] (White_Space; not the separators \x1c-\x1f,
# which Python's own \s would take). With them the standard library's re, ~2.3x faster than
# the regex package on this pattern, matches as the patterns above do: an ASCII chunk (most
# chunks of prose and code) is searched by it. tests: every ASCII string of up to 3 characters
# from a representative alphabet and every one of up to 2 of all 128, plus random ones.
_ASCII_SPACE = r"[\t\n\x0b\x0c\r ]"
ASCII_GPT2_PATTERN = (
    rf""" ?[A-Za-z]+|'(?:[stmd]|re|ve|ll)| ?[0-9]+| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+"""
    rf"""|{_ASCII_SPACE}+(?![^\t\n\x0b\x0c\r ])|{_ASCII_SPACE}+"""
)
ASCII_SMOLLM_PATTERN = (
    rf""" ?[A-Za-z]+|'(?:[stmd]|re|ve|ll)|[0-9]| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+"""
    rf"""|{_ASCII_SPACE}+(?![^\t\n\x0b\x0c\r 0-9])|{_ASCII_SPACE}+"""
)

# the versions CLASS_DISAGREEMENTS was derived for; any other pair keeps HF's whole-text path
DERIVED_FOR = {"tokenizers": "0.23.3", "regex": "2026.11.15"}

# code points (inclusive ranges) in whose \p{L} / \p{N} / \s membership or Rust is_numeric
# the regex package and HF tokenizers disagree: recent Unicode additions (class_disagreements)
CLASS_DISAGREEMENTS: tuple[tuple[int, int], ...] = (
    (0x558, 0x558),
    (0x58B, 0x58C),
    (0x88F, 0x88F),
    (0xC5C, 0xC5C),
    (0xCDC, 0xCDC),
    (0x208F, 0x208F),
    (0x209D, 0x209F),
    (0xA7CE, 0xA7CF),
    (0xA7D2, 0xA7D2),
    (0xA7D4, 0xA7D4),
    (0xA7DD, 0xA7DD),
    (0xA7E2, 0xA7E2),
    (0xA7F1, 0xA7F1),
    (0xAB6C, 0xAB6D),
    (0x107BB, 0x107BF),
    (0x10940, 0x10959),
    (0x10EC5, 0x10EC7),
    (0x10ED9, 0x10EEE),
    (0x11B0A, 0x11B0A),
    (0x11DB0, 0x11DDB),
    (0x11DE0, 0x11DE9),
    (0x11DF1, 0x11DF1),
    (0x1246F, 0x1246F),
    (0x12475, 0x1247F),
    (0x12550, 0x12686),
    (0x16EA0, 0x16EB8),
    (0x16EBB, 0x16ED3),
    (0x16FF2, 0x16FF6),
    (0x187F8, 0x187FF),
    (0x18CD6, 0x18CDA),
    (0x18D09, 0x18D20),
    (0x18D80, 0x18DF2),
    (0x18E00, 0x19191),
    (0x191A0, 0x191D2),
    (0x1B123, 0x1B128),
    (0x1B168, 0x1B168),
    (0x1D6A6, 0x1D6A6),
    (0x1DF1F, 0x1DF24),
    (0x1DF2B, 0x1DF81),
    (0x1DF90, 0x1DF96),
    (0x1DFCD, 0x1DFFF),
    (0x1E6C0, 0x1E6DE),
    (0x1E6E0, 0x1E6E2),
    (0x1E6E4, 0x1E6E5),
    (0x1E6E7, 0x1E6ED),
    (0x1E6F0, 0x1E6F4),
    (0x1E6FE, 0x1E6FF),
    (0x2B73A, 0x2B73F),
    (0x2B81E, 0x2B81E),
    (0x2CEA2, 0x2CEAD),
    (0x323B0, 0x33479),
    (0x3D000, 0x3FC3F),
)

# shorter texts go to HF whole: below a few thousand characters the per-call costs here (a
# batch call for the distinct words, the lookups) exceed what the distinct words save
WORDS_MIN_CHARS = 4096
# pieces longer than this are cut (bytelevel.cut_for_parallel) into chunks about this long:
# small enough that most chunks of prose and code are all ASCII, for re
CHUNK_CHARS = 1 << 13


def pattern(pre: str, *, ascii_only: bool = False) -> str:
    """The pre-token regex for ``tokenizer.ggml.pre`` (see the module docstring); with
    ``ascii_only`` the one for ASCII text in the standard library's ``re``."""
    if pre == "gpt2":
        return ASCII_GPT2_PATTERN if ascii_only else GPT2_PATTERN
    if pre == "smollm":
        return ASCII_SMOLLM_PATTERN if ascii_only else SMOLLM_PATTERN
    raise TokenizerError(f"no word path for byte-level pre-tokenizer {pre!r}")


def word_path_available() -> bool:
    """True when the installed ``tokenizers`` and ``regex`` are the ones
    :data:`CLASS_DISAGREEMENTS` was derived for."""
    try:
        import regex
        import tokenizers
    except ImportError:
        return False
    return (
        tokenizers.__version__ == DERIVED_FOR["tokenizers"]
        and regex.__version__ == DERIVED_FOR["regex"]
    )


def _ranges(code_points: Iterable[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for c in sorted(set(code_points)):
        if out and out[-1][1] == c - 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return tuple(out)


def class_disagreements() -> tuple[tuple[int, int], ...]:
    """Every code point whose class the regex package and HF tokenizers see differently, as
    ranges: membership of ``\\p{L}``, ``\\p{N}``, ``\\s`` (Oniguruma inside HF; the regex
    package here) and ``Digits``' ``char::is_numeric`` (Rust) against the regex package's
    ``\\p{N}``. Slow (seconds): for tests and for re-deriving :data:`CLASS_DISAGREEMENTS`."""
    import regex
    from tokenizers import Regex, pre_tokenizers

    every = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))

    def hf_class(cls: str) -> set[str]:
        split = pre_tokenizers.Split(Regex(f"[^{cls}]+"), behavior="removed")
        return set("".join(piece for piece, _ in split.pre_tokenize_str(every)))

    def our_class(cls: str) -> set[str]:
        return set(regex.findall(f"[{cls}]", every))

    # Digits without individual_digits: runs of numerals and of the rest, alternating; the
    # first character (U+0000) is no numeral
    runs = pre_tokenizers.Digits(individual_digits=False).pre_tokenize_str(every)
    numeric = set("".join(piece for k, (piece, _) in enumerate(runs) if k % 2 == 1))
    ours_n = our_class(r"\p{N}")
    differ = (
        (hf_class(r"\p{L}") ^ our_class(r"\p{L}"))
        | (hf_class(r"\p{N}") ^ ours_n)
        | (hf_class(r"\s") ^ our_class(r"\s"))
        | (numeric ^ ours_n)
    )
    return _ranges(map(ord, differ))


def words_backend(model: Any) -> Any:
    """A ``tokenizers.Tokenizer`` over ``model`` (shared, not copied) that BPE-encodes each
    pre-token it is given: ``ByteLevel`` without its regex maps the bytes, nothing else runs."""
    import tokenizers
    from tokenizers import pre_tokenizers

    words = tokenizers.Tokenizer(model)
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return words


class WordEncoder:
    """Encodes text for one special-token mode of a byte-level ``tokenizers.Tokenizer`` as that
    tokenizer would, pre-token by distinct pre-token (module docstring).

    ``words``: a tokenizer with the same BPE model, no added tokens, no normalizer and the
    pre-tokenizer :func:`words_backend` sets (bytes to the byte alphabet only). ``added``: the
    tokenizer's added tokens as (text, id, special); with ``parse_special=False`` the special
    ones are found but left as text (HF's ``encode_special_tokens``). ``cut``: a function
    cutting a long text into pieces at pre-token boundaries (cut_for_parallel). Safe to share
    across threads: nothing is mutated after construction."""

    def __init__(
        self,
        words: Any,
        pre: str,
        added: Sequence[tuple[str, int, bool]],
        *,
        parse_special: bool,
        cut: Any,
    ) -> None:
        import regex

        if any(not text for text, _, _ in added):
            raise TokenizerError("an added token is empty")
        self._pieces = regex.compile(pattern(pre))
        self._ascii_pieces = re.compile(pattern(pre, ascii_only=True))
        ranges = "".join(f"\\U{a:08X}-\\U{b:08X}" for a, b in CLASS_DISAGREEMENTS)
        self._disagreeing = regex.compile(f"[{ranges}]")
        longest_first = sorted(added, key=lambda t: -len(t[0]))
        self._added = (
            regex.compile("|".join(regex.escape(t) for t, _, _ in longest_first)) if added else None
        )
        # the added tokens this mode splits out: text -> id; the rest are left as text
        self._split = {t: i for t, i, special in added if parse_special or not special}
        self._words = words
        self._cut = cut

    def encode(self, text: str) -> list[int] | None:
        """The ids of ``text``; None where it holds a code point of
        :data:`CLASS_DISAGREEMENTS` (the caller encodes it whole)."""
        # the text as a sequence of added-token ids (int) and chunks to pre-tokenize (str)
        layout: list[str | int] = []
        for part in self._split_added(text):
            if isinstance(part, str) and len(part) >= 2 * CHUNK_CHARS:
                layout.extend(self._cut(part, step=CHUNK_CHARS))
            else:
                layout.append(part)
        # one thread: the regex package's concurrent mode gained nothing here (measured), and
        # re holds the GIL
        found = [
            (self._ascii_pieces if part.isascii() else self._pieces).findall(part)
            for part in layout
            if isinstance(part, str)
        ]
        distinct: set[str] = set().union(*found)
        # (str.isascii is O(1): ASCII pieces are skipped without a scan)
        if self._disagreeing.search("".join(w for w in distinct if not w.isascii())):
            return None
        table = self._encode_distinct(distinct)
        for token_id in self._split.values():
            table[token_id] = (token_id,)
        words = iter(found)
        pieces = [next(words) if isinstance(part, str) else (part,) for part in layout]
        return list(chain.from_iterable(map(table.__getitem__, chain.from_iterable(pieces))))

    def _split_added(self, text: str) -> list[str | int]:
        if self._added is None:
            return [text] if text else []
        parts: list[str | int] = []
        start = 0
        for m in self._added.finditer(text):
            token_id = self._split.get(m.group())
            if token_id is None:  # a special token while special parsing is off: text
                continue
            if m.start() > start:
                parts.append(text[start : m.start()])
            parts.append(token_id)
            start = m.end()
        if start < len(text):
            parts.append(text[start:])
        return parts

    def _encode_distinct(self, distinct: set[str]) -> dict[Any, Sequence[int]]:
        """Each distinct pre-token's ids, from HF, on every core (``word_batches``)."""
        return encode_distinct(self._words, distinct)
