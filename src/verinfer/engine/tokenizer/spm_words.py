r"""SentencePiece BPE (the fast path's Rust backend) encoded word by distinct word: the ids the
backend gives a whole text, at a fraction of its cost.

Where the time goes (Gemma 3, 4 MB of prose and code, one whole-text call of the backend):
a third in malloc/free (a ``NormalizedString`` with an alignment vector per pre-token, a
``String`` per token), a fifth in BPE merging of ~430k words of which only ~85k are distinct
(the BPE cache holds 10,000), the rest in the added-token matcher, the normalizer and the
pre-tokenizer's regex. Here the text is cut into words by one Python regex per ~8k-character
chunk, each distinct word is BPE'd once by HF, and the ids are looked up. Long texts are cut a
group of chunks at a time, HF BPE-ing each group's new words in a worker thread while the next
group is cut (``word_batches.Pipeline``); the ids are looked up only after every batch is back.

Why the ids are the backend's. A cut between two adjacent characters ``x`` and ``y`` of the
raw text (nothing else is cut) keeps the ids when both hold:

* no added-token occurrence spans it. Then HF's leftmost-longest scan for added tokens finds
  the same matches in the pieces as in the whole (an occurrence starting before the cut ends
  at or before it), so the text between matches -- normalized (``" "`` -> ``"▁"``: one
  character to one, so cut positions survive) and BPE'd -- is cut at the same places;
* no merge ``(l, r)`` has ``l`` ending in ``x`` and ``r`` starting in ``y`` (normalized): the
  pair ``(x, y)`` is not in :func:`joinable_pairs`. Then no symbol ever spans the cut (the first
  one to would be such a merge), and BPE of the whole makes, on each side, the merges it would
  make on that side alone, in the same order: the lowest-ranked pair of the whole lies on one
  side and is the lowest there, and ties go to the leftmost pair on either. The backend's own
  pre-tokenizer only cuts where this holds too (fast_spm), so its ids are BPE of the whole
  normalized text between added tokens.

The word patterns guarantee the first by construction: an added-token match is tried first at
every word start, and inside a word every character that can begin an added token is admitted
only where none begins (``(?!ADDED)``); the only cuts between words are then the class
transitions listed in :func:`fine_refusal` (:func:`fine_pattern`, all-ASCII chunks: between a
letter run, a digit run, a run of punctuation and controls, and the spaces that lead each word) or
"before a space" (:func:`coarse_pattern`, any chunk: spaces lead a word; a character that may
join a following ``"▁"`` keeps the spaces after it). Both conditions are checked against the
vocabulary's merges when the encoder is built; where the fine cuts fail it is not used, and the
coarse one is exact for any vocabulary. Chunks are cut just before a newline that follows
another character, where ``"\n"`` is an added token and no added token holding a newline holds
anything else (fast_spm's ``_newline_cuts``); otherwise the text is one chunk.

Each distinct word that is an added-token match becomes that token's id. With special parsing
off, HF still finds special tokens (so a user token overlapping one is not split out) and
leaves their text as text: where no user token can overlap a special one (:func:`_hides`;
Gemma), the special tokens are left out of the added-token pattern and their text is cut like
any other; otherwise a text holding one is encoded whole by the caller (``encode`` returns
None). Every other word is normalized
and BPE'd by a backend sharing the model with nothing else configured (no added tokens, no
normalizer, no pre-tokenizer). Not used (the caller's whole-text path instead): a space prefix
(HF prepends ``"▁"`` to every piece between added tokens, a cut would add one), an added token
holding a space or ``"▁"``, an empty one.

tests/unit/test_tokenizer_spm_words.py checks it against the backend's whole-text call on the
tiny vocabulary and on Gemma's (corpus, random, whitespace-heavy and added-token-heavy text),
with negative controls: a cut the merges forbid, and vocabularies whose merges cross a fine cut.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Any

from verinfer.engine.tokenizer import word_batches
from verinfer.engine.tokenizer.spec import SPACE
from verinfer.errors import TokenizerError

__all__ = [
    "CHUNK_CHARS",
    "WORDS_MIN_CHARS",
    "SpmWordEncoder",
    "coarse_pattern",
    "fine_pattern",
    "fine_refusal",
    "joinable_pairs",
    "newline_cuts",
    "trie_pattern",
    "words_refusal",
]

# below this the per-call costs (a batch call for the distinct words, the lookups) exceed what
# the distinct words save: shorter texts go to the backend whole
WORDS_MIN_CHARS = 4096
# chunks of about this many characters: most chunks of prose and code are then all ASCII (the
# fine pattern), and a chunk's word list stays small
CHUNK_CHARS = 1 << 13

# the character classes of the fine pattern (all-ASCII text; the space is the normalizer's "▁")
LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
DIGITS = frozenset("0123456789")
# punctuation and control characters: one class (Gemma has pieces like ")\x1b[")
SYMBOLS = frozenset(map(chr, range(0x80))) - LETTERS - DIGITS - {" "}


def joinable_pairs(merges: Iterable[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """``(last character of l, first character of r)`` of every merge ``(l, r)``: the adjacent
    characters BPE may join; a cut between any other two never changes the ids."""
    return frozenset((left[-1], right[0]) for left, right in merges)


def glued_before_space(joins: frozenset[tuple[str, str]]) -> frozenset[str]:
    """The characters a merge may join to a following ``"▁"`` (Gemma: ``">"``, for ``">▁</"``)."""
    return frozenset(x for x, y in joins if y == SPACE and x != SPACE)


def _fine_cut(x: str, y: str, glued: frozenset[str]) -> bool:
    """Whether :func:`fine_pattern` may put a word boundary between ASCII characters ``x`` and
    ``y`` (``" "`` for the space) that no added token separates."""
    if x in LETTERS:
        return y not in LETTERS
    if x in DIGITS:
        return y not in DIGITS
    if x in SYMBOLS:
        return y in LETTERS or y in DIGITS or (y == " " and x not in glued)
    return False  # the space leads the next word


def fine_refusal(joins: frozenset[tuple[str, str]]) -> str | None:
    """Why the fine pattern's cuts are unsafe for this vocabulary (None: they are safe): a merge
    joining two ASCII characters (or one and ``"▁"``) across a class transition it cuts."""
    glued = glued_before_space(joins)
    for x, y in sorted(joins):
        x, y = (" " if c == SPACE else c for c in (x, y))
        if x.isascii() and y.isascii() and _fine_cut(x, y, glued):
            return f"a merge joins {x!r} to {y!r}, which the fine word pattern separates"
    return None


def trie_pattern(texts: Iterable[str]) -> str:
    """A regex (``re``) matching, at a position, the longest of ``texts`` that starts there:
    a trie, each node an alternation of distinct next characters, optional where a text ends
    (greedy, so the longest wins). Searching with it is HF's leftmost-longest matcher."""
    trie: dict[str, Any] = {}
    for text in texts:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        kids = sorted((ch, sub) for ch, sub in node.items() if ch)
        if not kids:
            return ""
        body = "|".join(re.escape(ch) + emit(sub) for ch, sub in kids)
        if len(kids) > 1 or "" in node:
            body = f"(?:{body})"
        return body + "?" if "" in node else body

    return emit(trie)


def _cls(chars: Iterable[str]) -> str:
    return "".join(re.escape(c) for c in sorted(chars))


def _unit(chars: frozenset[str], first: frozenset[str], added: str) -> str:
    """A run of ``chars``, those that may begin an added token only where none begins."""
    free, guarded = chars - first, chars & first
    alts = []
    if free:
        alts.append(f"[{_cls(free)}]+")
    if guarded:
        alts.append(f"(?!{added})[{_cls(guarded)}]")
    return f"(?:{'|'.join(alts)})+" if guarded else alts[0]


def fine_pattern(added: str, first: frozenset[str], glued: frozenset[str]) -> str:
    """The word pattern for all-ASCII text: an added token; or spaces, then a letter run, a
    digit run or a run of symbols (punctuation and controls) -- and after a symbol run ending in a
    ``glued`` character, spaces and another such core, repeatedly; or spaces alone."""
    core = "|".join([
        _unit(LETTERS, first, added),
        _unit(DIGITS, first, added),
        _unit(SYMBOLS, first, added),
    ])
    glue = f"(?:(?<=[{_cls(glued & SYMBOLS)}]) +(?:{core})?)*" if glued & SYMBOLS else ""
    lead = f"(?:{added})|" if added else ""
    return f"{lead} *(?:{core}){glue}| +"


def coarse_pattern(added: str, first: frozenset[str], glued: frozenset[str]) -> str:
    """The word pattern for any text: an added token; or spaces (``" "`` or ``"▁"``) then
    characters up to the next space, a ``glued`` character keeping the spaces after it; or
    spaces alone."""
    space = f"[{_cls({' ', SPACE})}]"
    plain = f"[^{_cls({' ', SPACE} | first | glued)}]+"
    alts = [plain]
    for chars, tail in ((glued - first, f"{space}*"), (first - glued, ""),
                        (glued & first, f"{space}*")):
        if chars:
            guard = f"(?!{added})" if chars & first else ""
            alts.append(f"{guard}[{_cls(chars)}]{tail}")
    lead = f"(?:{added})|" if added else ""
    return f"{lead}{space}*(?:{'|'.join(alts)})+|{space}+"


def words_refusal(added: Sequence[tuple[str, int, bool]], add_space_prefix: bool) -> str | None:
    """Why this tokenizer cannot encode word by word (None: it can)."""
    if add_space_prefix:
        return "a space prefix is prepended to every piece between added tokens"
    for text, _, _ in added:
        if not text:
            return "an added token is empty"
        if " " in text or SPACE in text:
            return f"added token {text!r} holds a space"
    return None


def _hides(found: Iterable[str], split: Iterable[str]) -> bool:
    """Whether a match of a ``found`` text (matched, then left as text) can overlap one of a
    ``split`` text: one inside the other, or a proper suffix of one a proper prefix of the
    other. If none can, a leftmost-longest scan for both finds the same ``split`` matches as
    a scan for ``split`` alone."""
    found, split = list(found), list(split)
    if not found or not split:
        return False
    for a, b in ((found, split), (split, found)):
        heads = {t[:k] for t in b for k in range(1, len(t))}
        if any(t[k:] in heads for t in a for k in range(1, len(t))):
            return True
    inside = re.compile("|".join(map(re.escape, sorted(split, key=len, reverse=True))))
    return any(inside.search(t) for t in found) or any(
        f in t for f in found for t in split if len(f) <= len(t))


def newline_cuts(text: str, step: int) -> list[str]:
    """``text`` cut into pieces of about ``step`` characters, each cut just before a newline
    that follows another character (never inside a run of newlines)."""
    chunks: list[str] = []
    start = 0
    while len(text) - start > step:
        cut = text.find("\n", start + step)
        while cut > 0 and text[cut - 1] == "\n":  # inside a run begun earlier: skip it
            end = cut
            while end < len(text) and text[end] == "\n":
                end += 1
            cut = text.find("\n", end)
        if cut < 0:
            break
        chunks.append(text[start:cut])
        start = cut
    chunks.append(text[start:])
    return chunks



def _spell(word: str) -> str:
    """A word as the backend's model spells it (spaces as SentencePiece's SPACE)."""
    return word.replace(" ", SPACE)

class SpmWordEncoder:
    """Encodes text for one special-token mode of fast_spm's backend as that backend would,
    word by distinct word (module docstring).

    ``words``: a ``tokenizers.Tokenizer`` over the backend's BPE model with nothing else set.
    ``added``: the backend's added tokens as (text, id, special); with ``parse_special=False``
    the special ones are found but left as text. ``joins``: :func:`joinable_pairs` of the merge
    list. ``cut``: a function cutting a text into chunks at safe places (or None: one chunk).
    Nothing is mutated after construction: safe to share across threads."""

    def __init__(self, words: Any, added: Sequence[tuple[str, int, bool]], *,
                 parse_special: bool, joins: frozenset[tuple[str, str]],
                 cut: Callable[[str], list[str]] | None, fine: bool = True) -> None:
        reason = words_refusal(added, add_space_prefix=False)
        if reason is not None:
            raise TokenizerError(f"no word path: {reason}")
        texts = [t for t, _, _ in added]
        # the added tokens this mode splits out: text -> (id,); the rest are left as text
        self._split = {t: (i,) for t, i, special in added if parse_special or not special}
        self._as_text = frozenset(texts) - self._split.keys()
        if self._as_text and not _hides(self._as_text, self._split):
            # HF's matcher still finds the special ones (and may thereby hide a user token);
            # where none can overlap a user token, finding them or not splits out the same
            # user tokens, and their text is text to the word patterns like any other
            texts, self._as_text = list(self._split), frozenset()
        trie = trie_pattern(texts)
        first = frozenset(t[0] for t in texts)
        glued = glued_before_space(joins)
        self._coarse = re.compile(coarse_pattern(trie, first, glued))
        self.fine = fine and fine_refusal(joins) is None
        self._fine = re.compile(fine_pattern(trie, first, glued)) if self.fine else self._coarse
        self._words = words
        self._cut = cut

    def split(self, chunks: Sequence[str]) -> tuple[list[list[str]], set[str]]:
        """The words of each chunk (added-token matches and the text between them), and the
        distinct words the coarse pattern found (chunks holding a non-ASCII character)."""
        found, coarse = [], []
        for c in chunks:
            if c.isascii():
                found.append(self._fine.findall(c))
            else:
                found.append(self._coarse.findall(c))
                coarse.append(found[-1])
        return found, set().union(*coarse)

    def encode(self, text: str) -> list[int] | None:
        """The ids of ``text``; None where a special token found is left as text and a user
        token could overlap it (the caller encodes the text whole)."""
        # The cyclic collector is paused while the word lists exist: they hold ~1M strings, and
        # each full collection set off by the small lists and tuples made here walks them and
        # every vocabulary list (0.1-0.25 s of ~0.9 s CPU on 4 MB, measured). Nothing made here
        # is cyclic. A collector already paused (by a caller, or by a concurrent encode) is left
        # to whoever paused it.
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._encode(self._cut(text) if self._cut is not None else [text])
        finally:
            if paused:
                gc.enable()

    def _encode(self, chunks: list[str]) -> list[int] | None:
        """Cut each group of chunks into words, hand the words not seen before to HF (which BPEs
        them beside the cutting of the next group: ``word_batches.Pipeline``), then compose and
        look the ids up."""
        found: list[list[str]] = []
        seen: set[str] = set(self._split)  # words with an entry to come
        refine: dict[str, list[str]] = {}
        parts = word_batches.groups(chunks, word_batches.GROUP_CHARS)
        with word_batches.Pipeline(self._words, _spell, self._split,
                                   threaded=len(parts) > 1) as bpe:
            for group in parts:
                words, coarse = self.split(group)
                found.extend(words)
                new = set().union(*words).difference(seen)
                if not self._as_text.isdisjoint(new):
                    return None
                seen.update(new)
                # an all-ASCII coarse word is cut further by the fine pattern (its cuts are as
                # safe inside a coarse word as anywhere): fewer, shorter words to BPE
                more = {w: self._fine.findall(w) for w in coarse.intersection(new)
                        if w.isascii()} if self.fine else {}
                refine.update(more)
                bpe.add(new.difference(more).union(*more.values()))
            table = bpe.table()
        table.update(self._split)
        for word, pieces in refine.items():
            if word not in self._split:
                table[word] = tuple(chain.from_iterable(map(table.__getitem__, pieces)))
        return list(chain.from_iterable(map(table.__getitem__, chain.from_iterable(found))))
