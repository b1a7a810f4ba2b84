"""Pure-Python SentencePiece BPE tokenizer built from GGUF metadata (``tokenizer.ggml.*``).

Supported: ``tokenizer.ggml.model == "llama"``, i.e. SentencePiece BPE with scores and byte
fallback, with the semantics of llama.cpp's ``llm_tokenizer_spm`` and of the tokenizer HF
transformers builds from the same GGUF file:

* When ``parse_special``, the text is first split on control tokens (type 3, plus type 2
  "unknown"); user-defined tokens (type 4) are *always* split out, like llama.cpp and HF do.
  Matching is leftmost-longest.
* Each remaining fragment gets ``" "`` prepended if ``add_space_prefix`` (llama.cpp: at the start
  and after every special token), then ``" "`` is replaced by ``"▁"``.
* The fragment starts as one symbol per Unicode character; a character that is not a token falls
  back to its UTF-8 byte tokens ``<0xNN>`` (or ``unk`` when those are missing) and never merges.
* The adjacent pair whose concatenation is a token with the best priority is merged, repeatedly
  (a heap: O(n log n)); ties go to the leftmost pair. Priority is the token's score (``variant
  "spm"``), or, for Gemma files (``variant "gemma"``), the token's position in the vocabulary --
  see :class:`TokenizerSpec`. Control tokens are never produced by merging, so text encoded
  with ``parse_special=False`` can never yield a control id.

Decoding maps byte tokens back to bytes and ``"▁"`` to ``" "``, drops control tokens when
``skip_special``, and decodes the bytes as UTF-8 with ``errors="replace"`` once, at the end.
:class:`StreamDecoder` does the same incrementally and never emits half a character.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.spec import (
    SPACE,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    TokenizerSpec,
    _byte_value,
)
from verinfer.errors import TokenizerError


class _TrieNode:
    __slots__ = ("children", "token_id")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.token_id: int | None = None


def _build_trie(items: Iterable[tuple[str, int]]) -> _TrieNode:
    root = _TrieNode()
    for text, tid in items:
        node = root
        for ch in text:
            nxt = node.children.get(ch)
            if nxt is None:
                nxt = node.children[ch] = _TrieNode()
            node = nxt
        node.token_id = tid
    return root


class SpmTokenizer(Tokenizer):
    """SentencePiece BPE (variants \"spm\" and \"gemma\"; see the module docstring)."""

    def __init__(self, spec: TokenizerSpec) -> None:
        super().__init__(spec)
        types = self._types
        gemma = spec.variant == "gemma"
        # the text each token is looked up as, inside the merge loop
        pieces = list(spec.tokens)
        respelled: set[int] = set()
        if gemma:
            for i, t in enumerate(pieces):
                if " " in t and not t.strip():
                    pieces[i] = SPACE * len(t)
                    respelled.add(i)
        # merge targets: every token except control/unknown ones
        self._piece_id: dict[str, int] = {}
        self._prio: dict[str, float] = {}
        scores = spec.scores
        for i, p in enumerate(pieces):
            if not p or types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                continue
            self._piece_id[p] = i
            if gemma:
                self._prio[p] = float(i << 20)
            else:
                self._prio[p] = -(scores[i] if scores is not None else 0.0)
        self._byte_ids: list[int] | None = []
        for b in range(256):
            bid = self._token_to_id.get(f"<0x{b:02X}>")
            if bid is None:
                self._byte_ids = None
                break
            self._byte_ids.append(bid)
        specials = [
            (t, i)
            for i, t in enumerate(spec.tokens)
            if t and i not in respelled and types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN)
        ]
        users = [
            (t, i)
            for i, t in enumerate(spec.tokens)
            if t and i not in respelled and types[i] == TOKEN_USER_DEFINED
        ]
        self._trie_all = _build_trie(specials + users)
        self._trie_user = _build_trie(users)

    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        prev_special = True
        add_space_prefix = self.spec.add_space_prefix
        for frag, tid in self._partition(text, parse_special):
            if tid is not None:
                out.append(tid)
                prev_special = True
                continue
            if add_space_prefix and prev_special:
                frag = " " + frag
            prev_special = False
            self._bpe(frag.replace(" ", SPACE), out)

    def _partition(self, text: str, parse_special: bool) -> list[tuple[str, int | None]]:
        """Split ``text`` into raw fragments and special tokens (leftmost-longest)."""
        root = self._trie_all if parse_special else self._trie_user
        first = root.children
        parts: list[tuple[str, int | None]] = []
        if not first:
            return [(text, None)] if text else []
        n = len(text)
        start = i = 0
        while i < n:
            node = first.get(text[i])
            if node is None:
                i += 1
                continue
            best_end, best_id = -1, -1
            j = i + 1
            while True:
                if node.token_id is not None:
                    best_end, best_id = j, node.token_id
                if j >= n:
                    break
                nxt = node.children.get(text[j])
                if nxt is None:
                    break
                node = nxt
                j += 1
            if best_end < 0:
                i += 1
                continue
            if start < i:
                parts.append((text[start:i], None))
            parts.append((text[i:best_end], best_id))
            start = i = best_end
        if start < n:
            parts.append((text[start:], None))
        return parts

    def _fallback(self, ch: str) -> list[int]:
        if self._byte_ids is not None:
            return [self._byte_ids[b] for b in ch.encode("utf-8", "surrogatepass")]
        if self.spec.unk_id is None:
            raise TokenizerError(f"character {ch!r} is not in the vocabulary and there is no unk")
        return [self.spec.unk_id]

    def _bpe(self, text: str, out: list[int]) -> None:
        """SentencePiece BPE of one normalized fragment, appended to ``out``.

        Heap entries are ``(priority, left, right, merged_len)``: the lowest priority pops first,
        ties go to the leftmost pair; an entry is stale (skipped) once either side has changed.
        """
        if not text:
            return
        piece_id = self._piece_id
        prio = self._prio
        # gemma: priority = id * 2**20 - len(left piece); spm: priority = -score
        wl = 1 if self.spec.variant == "gemma" else 0
        n = len(text)
        syms: list[str] = list(text)
        frozen: list[bool] = [ch not in piece_id for ch in syms]
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        get = prio.get
        for i in range(n - 1):
            a = syms[i]
            p = get(a + syms[i + 1])
            if p is not None and not frozen[i] and not frozen[i + 1]:
                heap.append((p - wl * len(a), i, i + 1, len(a) + 1))
        heapq.heapify(heap)
        pop = heapq.heappop
        push = heapq.heappush
        while heap:
            _p, left, right, size = pop(heap)
            sl = syms[left]
            if not sl or nxt[left] != right:
                continue
            sr = syms[right]
            if len(sl) + len(sr) != size:
                continue
            merged = sl + sr
            syms[left] = merged
            syms[right] = ""
            r2 = nxt[right]
            nxt[left] = r2
            pl = prv[left]
            if r2 >= 0:
                prv[r2] = left
                if not frozen[r2]:
                    b = syms[r2]
                    p = get(merged + b)
                    if p is not None:
                        push(heap, (p - wl * size, left, r2, size + len(b)))
            if pl >= 0 and not frozen[pl]:
                a = syms[pl]
                p = get(a + merged)
                if p is not None:
                    push(heap, (p - wl * len(a), pl, left, len(a) + size))
        i = 0
        while i >= 0:
            if frozen[i]:
                out.extend(self._fallback(syms[i]))
            else:
                out.append(piece_id[syms[i]])
            i = nxt[i]

    def _raw_token_bytes(self, token_id: int) -> bytes:
        t = self.spec.tokens[token_id]
        if self._types[token_id] == TOKEN_BYTE:
            v = _byte_value(t)
            if v is not None:
                return bytes((v,))
        return t.replace(SPACE, " ").encode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------------------------------
# a tiny SentencePiece vocabulary for tests / tiny test models
# ---------------------------------------------------------------------------------------------
_TINY_PIECES = (
    "▁t ▁a he in th er ▁the on re an ▁s ▁w ▁o at en ▁c it is or ed es ▁f ▁b nd ▁m ▁p ing ▁in "
    "ou ar al ▁to ▁d ▁h le as ic ▁of ▁and ion ▁th om ▁re ▁l st ve ent ▁n ▁e ro ly ▁be ▁g ▁T "
    "ct ▁is ▁I ▁S ▁A ow ut id et ▁y im ▁on ▁u ay ot ▁for se ill ▁C ver ch ra ad ow ▁st am "
    "ig ▁you ter ▁wh ith ▁it ▁that ke ur ation ▁M ▁with ▁P ▁B ▁W ce ir ld ▁an ▁he ri ▁al "
    "ers ▁was ▁are ▁as ▁this ▁not ▁at ▁have ▁or ▁by ▁from ▁we ▁can ▁will ▁his ▁they ▁but "
    "▁all ▁one ▁there ▁their ▁what ▁so ▁up ▁out ▁if ▁about ▁who ▁get ▁which ▁go ▁me ▁when "
    "▁make ▁like ▁time ▁no ▁just ▁him ▁know ▁take ▁people ▁into ▁year ▁your ▁good ▁some "
    "▁could ▁them ▁see ▁other ▁than ▁then ▁now ▁look ▁only ▁come ▁its ▁over ▁think ▁also "
    "▁back ▁after ▁use ▁two ▁how ▁our ▁work ▁first ▁well ▁way ▁even ▁new ▁want ▁because "
    "▁any ▁these ▁give ▁day ▁most ▁us ▁hello ▁world ▁user ▁model ▁Hello ▁The ▁quick ▁brown "
    "▁fox ▁jumps ▁lazy ▁dog user model ▁▁ ▁▁▁▁ ▁1 ▁2 00 ▁0 ."
)


def tiny_spm_vocab(extra_pieces: Sequence[str] = ()) -> dict[str, object]:
    """GGUF-style ``tokenizer.ggml.*`` fields of a small SentencePiece vocabulary (687 tokens).

    Layout: ``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3 (control), ``<start_of_turn>``=4,
    ``<end_of_turn>``=5 (control), ``"\\n"``=6 (user-defined), 256 byte tokens ``<0x00>``..
    ``<0xFF>`` (ids 7..262), then "▁" and the printable ASCII characters, then a few hundred
    common English merges, then ``extra_pieces``. Every multi-character piece is reachable by
    merging (its prefixes are added as needed) and normal tokens' scores strictly decrease with
    the id, so the "spm" and "gemma" variants tokenize identically. bos 2, eos 1, unk 3, pad 0,
    add_bos True, add_space_prefix False.
    """
    tokens: list[str] = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types: list[int] = [TOKEN_CONTROL] * len(tokens)
    tokens.append("\n")
    types.append(TOKEN_USER_DEFINED)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(TOKEN_BYTE)
    seen: set[str] = set(tokens)
    normal: list[str] = []

    def add(piece: str) -> None:
        if not piece or piece in seen:
            return
        if len(piece) > 1:
            add(piece[:-1])  # make it reachable: prefix + last char
            add(piece[-1])
        seen.add(piece)
        normal.append(piece)

    add(SPACE)
    for c in range(0x21, 0x7F):
        add(chr(c))
    for piece in _TINY_PIECES.split(" "):
        add(piece)
    for piece in extra_pieces:
        if not isinstance(piece, str) or not piece:
            raise TokenizerError(f"bad extra piece {piece!r}")
        add(piece.replace(" ", SPACE))
    scores: list[float] = [0.0] * len(tokens)
    n_fixed = len(tokens)
    tokens.extend(normal)
    types.extend([TOKEN_NORMAL] * len(normal))
    # normal tokens score -(rank): strictly decreasing with the id (control/user -1000, bytes 0)
    scores.extend(-float(k) for k in range(len(normal)))
    scores[:n_fixed] = [-1000.0] * 6 + [-1000.0] + [0.0] * 256
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": False,
    }
