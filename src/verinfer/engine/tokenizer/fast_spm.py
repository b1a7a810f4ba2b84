"""The fast path for SentencePiece BPE: the same tokenization as :class:`SpmTokenizer` (the
pure-Python reference), computed by HF ``tokenizers``' Rust BPE.

Why the two are equal (variant ``"gemma"``, the one Gemma files use):

* The reference merges, repeatedly, the adjacent pair ``(l, r)`` whose concatenation is a
  mergeable piece with the lowest priority ``id(l + r) * 2**20 - len(l)``, ties to the leftmost
  pair. HF's BPE merges the adjacent pair with the lowest *rank* in its merge list, ties to the
  leftmost pair. So the merge list here is every ``(l, r)`` with ``l``, ``r`` and ``l + r`` all
  mergeable pieces, ranked by ``(id(l + r), -len(l))``: the same order, pair by pair. Both
  discard a queued pair once either side has changed.
* Speed (HF caches the merges of short words, not of long ones): the normalized text is cut
  into words before each ``"▁"`` that follows another character, unless a piece could span the
  cut (Gemma has one such piece, ``">▁</"``; :func:`_word_pattern` keeps every context in which
  a piece spans ``"c▁"`` together). A pair across a cut never merges (its concatenation would be
  a piece spanning the cut), so the words merge independently and their ids concatenate to the
  reference's.
* Long texts (:data:`spm_words.WORDS_MIN_CHARS` characters and more) are cut into words in
  Python, each distinct word is BPE'd once and the ids looked up (``spm_words``, which proves
  the ids equal the backend's whole-text call); a text that rules out (a special token left as
  text), or a vocabulary whose added tokens do, is encoded by the backend whole.
* A character that is not a piece falls back to its UTF-8 byte tokens in both, and never merges:
  no merge here has a byte token on either side (checked while the merge list is built; a
  vocabulary where one would, has its tokenizer encode with the reference instead).
* Control/unknown tokens (when special parsing is on) and user-defined tokens (always) are cut
  out of the raw text first, leftmost-longest, by HF's added-token matcher as by the reference's
  trie; the text between them is normalized (``add_space_prefix``, ``" "`` -> ``"▁"``) and merged.
  With special parsing off, a second backend treats control tokens as plain text
  (``encode_special_tokens``), and no merge produces a control token, so none can come out.

Not covered, and encoded by the reference instead: variant ``"spm"`` (llama.cpp's score order:
two pairs of equal score go to the leftmost, which no fixed merge rank reproduces), vocabularies
where the conditions above do not hold (:func:`fast_spm_refusal` says why), and any text holding
a lone surrogate (Rust strings cannot carry one; the reference encodes it as its
``surrogatepass`` bytes). tests/unit/test_tokenizer_fast.py and
tests/slow/test_tokenizer_fast_gemma.py prove the equality on the corpus and on random text.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from collections.abc import Iterable
from typing import Any

from verinfer.engine.tokenizer.spec import (
    SPACE,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    TokenizerSpec,
)
from verinfer.engine.tokenizer.spm import SpmTokenizer
from verinfer.engine.tokenizer.spm_words import (
    CHUNK_CHARS,
    WORDS_MIN_CHARS,
    SpmWordEncoder,
    joinable_pairs,
    newline_cuts,
    words_refusal,
)
from verinfer.errors import TokenizerError

__all__ = ["FastSpmTokenizer", "fast_spm_refusal"]

# Rust backends by (encoding-relevant spec, parse_special), and merge lists until both modes
# of a spec are built; one lock for building (a first use from several threads builds once).
# Built backends are never reconfigured, so using them needs no lock.
_BACKENDS: dict[tuple[TokenizerSpec, bool], Any] = {}
_MERGES: dict[TokenizerSpec, Any] = {}
# the word encoder of each backend (None: this vocabulary encodes whole), built with it
_WORDS: dict[tuple[TokenizerSpec, bool], SpmWordEncoder | None] = {}
_BUILD_LOCK = threading.Lock()
# texts this long are cut at newlines and encoded in parallel (HF's batch runs on every core)
PARALLEL_MIN_CHARS = 1 << 16
PARALLEL_CHUNKS = 8


class _NotExact(Exception):
    """The merge list would let HF merge what the reference never merges."""


_REFERENCE: Any = object()  # in _BACKENDS / _MERGES: this spec is encoded by the reference


def fast_spm_refusal(spec: TokenizerSpec) -> str | None:
    """Why ``spec`` cannot take the fast path (None: it can). Cheap: no merge list is built."""
    if spec.variant != "gemma":
        return (f"variant {spec.variant!r}: score-ordered merges break ties by position, "
                "which a merge rank cannot express")
    present = set(spec.tokens)
    if any(f"<0x{b:02X}>" not in present for b in range(256)):
        return "the vocabulary lacks some of the 256 byte-fallback tokens"
    types = spec.token_types or ()
    for t, ty in zip(spec.tokens, types, strict=False):
        if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN) and len(t) == 1:
            return f"single-character control token {t!r} (BPE would look it up as a character)"
    if len(present) != len(spec.tokens):
        return "the vocabulary spells two tokens the same"
    return None


class FastSpmTokenizer(SpmTokenizer):
    """:class:`SpmTokenizer` whose encoding runs in HF ``tokenizers`` (see the module docstring).

    Identity, decoding and the hash are the reference's (the spec is the same object); only
    ``_encode_into`` differs. Each special-token mode's Rust backend is built on its first use
    (1-2 s for Gemma's 262k tokens), under a lock, and never reconfigured: safe to share across
    threads.
    """

    def __init__(self, spec: TokenizerSpec) -> None:
        reason = fast_spm_refusal(spec)
        if reason is not None:
            raise TokenizerError(f"no fast SentencePiece path for this vocabulary: {reason}")
        super().__init__(spec)
        # the encoding-relevant spec: tokenizers that differ only in their chat template share
        # one pair of backends (a process that loads a model twice builds them once)
        self._key = dataclasses.replace(spec, chat_template=None)
        self._mine: dict[bool, Any] = {}  # parse_special -> backend (hashing the spec is slow)
        self._mine_words: dict[bool, SpmWordEncoder | None] = {}
        # False: long texts go to the backend whole, as before the word path (benchmarks)
        self.word_path = True
        nl = self._token_to_id.get("\n")
        self._newline_cuts = nl is not None and self._types[nl] == TOKEN_USER_DEFINED and all(
            set(t) == {"\n"} for t, ty in zip(spec.tokens, self._types, strict=True)
            if "\n" in t and ty in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED))

    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        if not text:
            return
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: Rust strings cannot hold it
                super()._encode_into(text, parse_special, out)
                return
        backend = self._rust(parse_special)
        if backend is None:
            super()._encode_into(text, parse_special, out)
            return
        if self.word_path and len(text) >= WORDS_MIN_CHARS:
            words = self._mine_words.get(parse_special)
            ids = words.encode(text) if words is not None else None
            if ids is not None:
                out.extend(ids)
                return
        chunks = self._chunks(text) if len(text) >= PARALLEL_MIN_CHARS else [text]
        try:  # the batch call: no offsets (a third faster), chunks encoded in parallel
            for enc in backend.encode_batch_fast(chunks, add_special_tokens=False):
                out.extend(enc.ids)
        except Exception as e:  # the Rust side raises a bare Exception
            raise TokenizerError(f"tokenizer failed on the input: {e}") from e

    def _chunks(self, text: str) -> list[str]:
        """``text`` cut into about :data:`PARALLEL_CHUNKS` pieces whose ids concatenate to the
        ids of the whole: each cut lies just before a newline that follows another character.
        That holds when ``"\n"`` is a user-defined token (split out in both special modes, so no
        merge crosses it) and every added token holding a newline is a run of newlines (so no
        match spans the cut); otherwise the text stays whole."""
        if not self._newline_cuts:
            return [text]
        return newline_cuts(
            text, max(len(text) // PARALLEL_CHUNKS, PARALLEL_MIN_CHARS // PARALLEL_CHUNKS))

    def _rust(self, parse_special: bool) -> Any | None:
        """The backend for one special-token mode, built on first use (prompts, with special
        parsing off, never pay for the other one); None: the reference encodes this vocabulary."""
        backend = self._mine.get(parse_special)
        if backend is None:
            slot = (self._key, parse_special)
            with _BUILD_LOCK:
                backend = _BACKENDS.get(slot)
                if backend is None:
                    merges = _MERGES.get(self._key)
                    if merges is None:
                        try:
                            merges = _MERGES[self._key] = self._merge_list()
                        except _NotExact:
                            merges = _MERGES[self._key] = _REFERENCE
                    backend = _REFERENCE if merges is _REFERENCE else self._build(
                        merges, encode_special=not parse_special)
                    _WORDS[slot] = None if merges is _REFERENCE else self._build_words(
                        backend, merges, parse_special)
                    _BACKENDS[slot] = backend
                    if all((self._key, mode) in _BACKENDS for mode in (True, False)):
                        del _MERGES[self._key]  # both built: the list is not needed again
                    while len(_BACKENDS) > 4:  # two specs' worth; oldest first
                        _WORDS.pop(next(iter(_BACKENDS)), None)
                        _BACKENDS.pop(next(iter(_BACKENDS)))
                self._mine_words[parse_special] = _WORDS.get(slot)
            self._mine[parse_special] = backend
        return None if backend is _REFERENCE else backend

    def _build_words(self, backend: Any, merges: list[tuple[str, str]],
                     parse_special: bool) -> SpmWordEncoder | None:
        """The word path of one backend (None where :func:`spm_words.words_refusal` rules it
        out): a tokenizer sharing its BPE model with nothing else set, and its added tokens."""
        import tokenizers

        added = [(t.content, i, t.special)
                 for i, t in backend.get_added_tokens_decoder().items()]
        if words_refusal(added, self.spec.add_space_prefix) is not None:
            return None
        try:
            return SpmWordEncoder(
                tokenizers.Tokenizer(backend.model), added, parse_special=parse_special,
                joins=joinable_pairs(merges),
                # chunks of CHUNK_CHARS, cut where _chunks cuts (and under the same condition)
                cut=functools.partial(newline_cuts, step=CHUNK_CHARS) if self._newline_cuts
                else None)
        except (re.error, RecursionError, OverflowError):
            # an added-token trie too deep or large for ``re``: long texts go whole, as before
            return None

    def _merge_list(self) -> list[tuple[str, str]]:
        pieces = self._piece_id
        byte_tokens = {t for t, ty in zip(self.spec.tokens, self._types, strict=True)
                       if ty == TOKEN_BYTE}
        ranked: list[tuple[int, int, str, str]] = []
        for p, pid in pieces.items():
            for k in range(1, len(p)):
                left, right = p[:k], p[k:]
                if left in pieces and right in pieces:
                    if left in byte_tokens or right in byte_tokens:
                        # the reference never merges a fallback byte; a rank here would
                        raise _NotExact(f"merge {left!r} + {right!r} involves a byte token")
                    ranked.append((pid, -k, left, right))
        ranked.sort()
        return [(left, right) for _, _, left, right in ranked]

    def _build(self, merges: list[tuple[str, str]], *, encode_special: bool) -> Any:
        import tokenizers
        from tokenizers import AddedToken, models, normalizers, pre_tokenizers

        spec, types = self.spec, self._types
        vocab = dict(self._piece_id)
        control: list[Any] = []
        user: list[Any] = []
        for i, t in enumerate(spec.tokens):
            if not t:
                continue
            if types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                if vocab.setdefault(t, i) != i:  # for the added-token id; no merge makes it
                    raise TokenizerError(f"control token {t!r} is also spelled as a piece")
                control.append(AddedToken(t, normalized=False, special=True))
            elif types[i] == TOKEN_USER_DEFINED and vocab.get(t) == i:
                # (a Gemma all-space token is respelled "▁▁..." and merges instead: not here)
                user.append(AddedToken(t, normalized=False, special=False))
        model = models.BPE(vocab=vocab, merges=merges, dropout=None, byte_fallback=True,
                           fuse_unk=False, continuing_subword_prefix="", end_of_word_suffix="")
        backend = tokenizers.Tokenizer(model)
        steps: list[Any] = [normalizers.Replace(" ", SPACE)]
        if spec.add_space_prefix:
            steps.insert(0, normalizers.Prepend(SPACE))
        backend.normalizer = normalizers.Sequence(steps)
        backend.pre_tokenizer = pre_tokenizers.Split(
            tokenizers.Regex(_word_pattern(self._piece_id)), behavior="isolated")
        backend.add_special_tokens(control)
        backend.add_tokens(user)
        if backend.get_vocab_size(with_added_tokens=True) != len(vocab):
            raise TokenizerError("fast SentencePiece backend assigned ids outside the vocabulary")
        backend.encode_special_tokens = encode_special
        return backend


def _word_pattern(pieces: Iterable[str]) -> str:
    """The regex (Oniguruma) of one word: ``"▁"*`` then anything up to the next ``"▁"`` that
    follows another character -- except where a piece spans that spot: for each piece ``A▁B``
    (``A`` not ending in ``"▁"``), a ``"▁"`` run preceded by ``A`` and followed by ``▁B`` stays
    inside the word."""

    def lit(s: str) -> str:
        return "".join(f"\\x{{{ord(c):X}}}" for c in s)

    keep: set[tuple[str, str]] = set()
    for p in pieces:
        for i in range(1, len(p)):
            if p[i] == SPACE and p[i - 1] != SPACE:
                keep.add((p[:i], p[i:]))
    sp = lit(SPACE)
    inner = [f"[^{sp}]"] + [f"(?<={lit(a)})(?={lit(b)}){sp}+" for a, b in sorted(keep)]
    return f"{sp}*(?:{'|'.join(inner)})+|{sp}+"
