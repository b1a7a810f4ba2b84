"""Pure-Python tokenizer built from GGUF metadata (``tokenizer.ggml.*``).

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

import array
import codecs
import hashlib
import heapq
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from verinfer.errors import TokenizerError

__all__ = [
    "SPEC_FORMAT",
    "TOKEN_BYTE",
    "TOKEN_CONTROL",
    "TOKEN_NORMAL",
    "TOKEN_UNKNOWN",
    "TOKEN_UNUSED",
    "TOKEN_USER_DEFINED",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerSpec",
    "read_gguf_tokenizer_fields",
    "tiny_spm_vocab",
]

# llama.cpp token types (tokenizer.ggml.token_type)
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

SPEC_FORMAT = "verinfer.tokenizer.spec/1"
SPACE = "\u2581"  # "▁"
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})
_EOT_NAMES = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|eom_id|>")
_KEY = "tokenizer.ggml."


def _byte_value(token: str) -> int | None:
    """``"<0x41>"`` -> 0x41, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizerSpec:
    """Everything that defines tokenization, read from the GGUF keys ``tokenizer.ggml.*``.

    ``tokens``/``scores``/``token_types`` are kept exactly as the file stores them (scores rounded
    to float32, as GGUF stores them). ``variant`` says how the vocabulary is interpreted:

    * ``"spm"`` (llama.cpp ``llm_tokenizer_spm``): merge priority is the merged token's score.
    * ``"gemma"`` (set for ``general.architecture`` gemma/gemma2/gemma3; matches HF transformers'
      GGUF Gemma tokenizer): merge priority is the merged token's *position* in the vocabulary
      (lower id first; between two splits of the same token, the longer left piece first), and a
      token made only of spaces (e.g. ``"  "``) is looked up as that many ``"▁"`` and is an
      ordinary mergeable token rather than a user-defined token matched in the raw text.

    ``source_sha256`` is only set for tokenizers delegated to the ``tokenizers`` package
    (:meth:`Tokenizer.from_tokenizer_json`); it is the sha256 of the tokenizer.json bytes.
    """

    model: str
    tokens: tuple[str, ...]
    scores: tuple[float, ...] | None
    token_types: tuple[int, ...] | None
    merges: tuple[str, ...] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eot_ids: tuple[int, ...]
    variant: str = "spm"
    source_sha256: str | None = field(default=None)

    def canonical_json(self) -> bytes:
        """The versioned canonical serialization that :attr:`Tokenizer.hash` hashes.

        A JSON object with sorted keys, no whitespace, ASCII only (``ensure_ascii``): ``format``
        (``SPEC_FORMAT``) plus every field of the spec; tuples become arrays, ``None`` ``null``,
        and each score is written as ``float.hex`` of its float32 value (exact, ``-0.0`` kept).
        """
        obj: dict[str, Any] = {
            "format": SPEC_FORMAT,
            "model": self.model,
            "variant": self.variant,
            "tokens": list(self.tokens),
            "scores": None if self.scores is None else [float(s).hex() for s in self.scores],
            "token_types": None if self.token_types is None else list(self.token_types),
            "merges": None if self.merges is None else list(self.merges),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
            "pad_id": self.pad_id,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            "add_space_prefix": self.add_space_prefix,
            "eot_ids": list(self.eot_ids),
            "source_sha256": self.source_sha256,
        }
        text = json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return text.encode("ascii")


def _as_str(value: object, key: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"GGUF key {key!r} is not valid UTF-8") from e
    if isinstance(value, str):
        return value
    raise TokenizerError(f"GGUF key {key!r} must be a string, got {type(value).__name__}")


def _as_list(value: object, key: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TokenizerError(f"GGUF key {key!r} must be an array, got {type(value).__name__}")
    return list(value)


def _opt_id(fields: Mapping[str, object], name: str, n_vocab: int) -> int | None:
    key = _KEY + name
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError) as e:
            raise TokenizerError(f"GGUF key {key!r} must be an integer") from e
    if value < 0 or value >= n_vocab:
        if value in (-1, 0xFFFFFFFF):  # "no such token" as some converters write it
            return None
        raise TokenizerError(f"GGUF key {key!r} = {value} is outside the vocabulary ({n_vocab})")
    return int(value)


def _opt_bool(fields: Mapping[str, object], name: str, default: bool) -> bool:
    value = fields.get(_KEY + name)
    if value is None:
        return default
    if isinstance(value, (bool, int)):
        return bool(value)
    raise TokenizerError(f"GGUF key {_KEY + name!r} must be a bool")


def _float32(values: Sequence[Any]) -> tuple[float, ...]:
    """Round to float32, as GGUF stores scores (so a spec hashes the same before/after a file)."""
    try:
        return tuple(array.array("f", values).tolist())
    except (TypeError, ValueError, OverflowError) as e:
        raise TokenizerError(f"bad score in 'tokenizer.ggml.scores': {e}") from e


def spec_from_gguf_fields(
    fields: Mapping[str, object], *, variant: str | None = None
) -> TokenizerSpec:
    """Build a :class:`TokenizerSpec` from GGUF key/values (python values)."""
    if _KEY + "model" not in fields:
        raise TokenizerError("GGUF has no tokenizer: missing key 'tokenizer.ggml.model'")
    model = _as_str(fields[_KEY + "model"], _KEY + "model")
    if _KEY + "tokens" not in fields:
        raise TokenizerError("GGUF has no tokenizer: missing key 'tokenizer.ggml.tokens'")
    raw_tokens = _as_list(fields[_KEY + "tokens"], _KEY + "tokens")
    if all(type(t) is str for t in raw_tokens):
        tokens = tuple(raw_tokens)
    else:
        tokens = tuple(_as_str(t, _KEY + "tokens") for t in raw_tokens)
    n = len(tokens)
    if n == 0:
        raise TokenizerError("GGUF key 'tokenizer.ggml.tokens' is empty")
    scores: tuple[float, ...] | None = None
    if fields.get(_KEY + "scores") is not None:
        scores = _float32(_as_list(fields[_KEY + "scores"], _KEY + "scores"))
        if len(scores) != n:
            raise TokenizerError(f"{len(scores)} scores for {n} tokens")
    types: tuple[int, ...] | None = None
    if fields.get(_KEY + "token_type") is not None:
        try:
            types = tuple(int(t) for t in _as_list(fields[_KEY + "token_type"], "token_type"))
        except (TypeError, ValueError) as e:
            raise TokenizerError("GGUF key 'tokenizer.ggml.token_type' must hold integers") from e
        if len(types) != n:
            raise TokenizerError(f"{len(types)} token types for {n} tokens")
    merges: tuple[str, ...] | None = None
    if fields.get(_KEY + "merges") is not None:
        merges = tuple(_as_str(m, _KEY + "merges") for m in _as_list(fields[_KEY + "merges"], "m"))

    if model == "llama":
        if scores is None:
            raise TokenizerError(
                "SentencePiece ('llama') tokenizer without 'tokenizer.ggml.scores'"
            )
    elif model == "gpt2":
        raise TokenizerError("GGUF tokenizer model 'gpt2' (byte-level BPE) is not supported yet")
    else:
        raise TokenizerError(f"unsupported GGUF tokenizer model {model!r}")

    if variant is None:
        arch = fields.get("general.architecture")
        variant = "gemma" if isinstance(arch, str) and arch in _GEMMA_ARCHS else "spm"
    if variant not in ("spm", "gemma"):
        raise TokenizerError(f"unknown tokenizer variant {variant!r}")

    bos = _opt_id(fields, "bos_token_id", n)
    eos = _opt_id(fields, "eos_token_id", n)
    unk = _opt_id(fields, "unknown_token_id", n)
    pad = _opt_id(fields, "padding_token_id", n)
    add_bos = _opt_bool(fields, "add_bos_token", True)  # llama.cpp's default for SPM
    add_eos = _opt_bool(fields, "add_eos_token", False)
    add_space_prefix = _opt_bool(fields, "add_space_prefix", True)
    if add_bos and bos is None:
        raise TokenizerError("add_bos_token is set but there is no bos_token_id")
    if add_eos and eos is None:
        raise TokenizerError("add_eos_token is set but there is no eos_token_id")

    eot: set[int] = set()
    if eos is not None:
        eot.add(eos)
    for name in ("eot_token_id", "eom_token_id"):
        extra = _opt_id(fields, name, n)
        if extra is not None:
            eot.add(extra)
    last = {t: i for i, t in enumerate(tokens)}
    for name in _EOT_NAMES:
        i = last.get(name)
        if i is not None and (types is None or types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)):
            eot.add(i)
    return TokenizerSpec(
        model=model,
        tokens=tokens,
        scores=scores,
        token_types=types,
        merges=merges,
        bos_id=bos,
        eos_id=eos,
        unk_id=unk,
        pad_id=pad,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        eot_ids=tuple(sorted(eot)),
        variant=variant,
    )


def read_gguf_tokenizer_fields(path: str | os.PathLike[str]) -> dict[str, object]:
    """The ``tokenizer.*`` and ``general.architecture`` key/values of a GGUF file."""
    from verinfer.engine.gguf_file import GGUFFormatError, read_gguf

    try:
        fields = read_gguf(path, tensors=False).fields
    except OSError as e:
        raise TokenizerError(f"cannot read GGUF file {os.fspath(path)!r}: {e}") from e
    except GGUFFormatError as e:
        raise TokenizerError(f"corrupt GGUF metadata in {os.fspath(path)!r}: {e}") from e
    return {k: v for k, v in fields.items()
            if k.startswith("tokenizer.") or k == "general.architecture"}


def _fields_from_reader(reader: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer.") or key == "general.architecture":
            out[key] = fld.contents()
    return out


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------
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


class Tokenizer:
    """A tokenizer defined by a :class:`TokenizerSpec` (see the module docstring)."""

    def __init__(self, spec: TokenizerSpec, *, _backend: Any = None) -> None:
        self.spec = spec
        self._backend = _backend  # a `tokenizers.Tokenizer` for from_tokenizer_json
        n = len(spec.tokens)
        types = spec.token_types if spec.token_types is not None else (TOKEN_NORMAL,) * n
        self._types = types
        gemma = spec.variant == "gemma"
        # the text each token is looked up as, inside the merge loop
        pieces = list(spec.tokens)
        respelled: set[int] = set()
        if gemma:
            for i, t in enumerate(pieces):
                if " " in t and not t.strip():
                    pieces[i] = SPACE * len(t)
                    respelled.add(i)
        self._token_to_id: dict[str, int] = {t: i for i, t in enumerate(spec.tokens)}
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
        self._bytes_cache: dict[int, bytes] = {}

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(
        cls, fields: Mapping[str, object], *, variant: str | None = None
    ) -> Tokenizer:
        """From GGUF key/values (python values). ``variant`` overrides the one implied by
        ``general.architecture`` ("gemma" for gemma/gemma2/gemma3, else "spm")."""
        return cls(spec_from_gguf_fields(fields, variant=variant))

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str] | Any, *, variant: str | None = None
    ) -> Tokenizer:
        """From a GGUF file path (fast metadata parser) or an open ``gguf.GGUFReader``."""
        if isinstance(path, (str, os.PathLike)):
            fields = read_gguf_tokenizer_fields(path)
        elif hasattr(path, "fields"):
            fields = _fields_from_reader(path)
        else:
            raise TokenizerError(f"from_gguf expects a path or a GGUFReader, got {type(path)}")
        return cls.from_gguf_fields(fields, variant=variant)

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """From an HF ``tokenizer.json`` (safetensors models), delegating encoding to the
        ``tokenizers`` package. BOS/EOS come from a ``tokenizer_config.json`` next to it when
        present. The spec records the vocabulary and the sha256 of the file."""
        try:
            import tokenizers
        except ImportError as e:  # pragma: no cover
            raise TokenizerError("the 'tokenizers' package is needed for tokenizer.json") from e
        try:
            raw = open(path, "rb").read()  # noqa: SIM115
            data = json.loads(raw)
            backend = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        except (OSError, ValueError, Exception) as e:
            raise TokenizerError(f"cannot load tokenizer.json {os.fspath(path)!r}: {e}") from e
        vocab = backend.get_vocab(with_added_tokens=True)
        n = max(vocab.values()) + 1 if vocab else 0
        tokens = [""] * n
        for t, i in vocab.items():
            tokens[i] = t
        types = [TOKEN_NORMAL] * n
        model = data.get("model") or {}
        if model.get("byte_fallback"):
            for i, t in enumerate(tokens):
                if _byte_value(t) is not None:
                    types[i] = TOKEN_BYTE
        for added in data.get("added_tokens") or []:
            i = added.get("id")
            if isinstance(i, int) and 0 <= i < n:
                types[i] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
        merges_raw = model.get("merges")
        merges = None
        if isinstance(merges_raw, list):
            merges = tuple(m if isinstance(m, str) else " ".join(m) for m in merges_raw)
        cfg: dict[str, Any] = {}
        cfg_path = os.path.join(os.path.dirname(os.fspath(path)), "tokenizer_config.json")
        if os.path.exists(cfg_path):
            try:
                cfg = json.loads(open(cfg_path, "rb").read())  # noqa: SIM115
            except (OSError, ValueError) as e:
                raise TokenizerError(f"cannot read {cfg_path!r}: {e}") from e

        def special(name: str, *guesses: str) -> int | None:
            v = cfg.get(name)
            if isinstance(v, dict):
                v = v.get("content")
            for cand in ((v,) if isinstance(v, str) else ()) + guesses:
                if cand in vocab:
                    return vocab[cand]
            return None

        bos = special("bos_token", "<bos>", "<s>", "<|begin_of_text|>")
        eos = special("eos_token", "<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>")
        eot = {eos} if eos is not None else set()
        for name in _EOT_NAMES:
            if name in vocab and types[vocab[name]] in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
                eot.add(vocab[name])
        spec = TokenizerSpec(
            model="hf-" + str(model.get("type", "unknown")).lower(),
            tokens=tuple(tokens),
            scores=None,
            token_types=tuple(types),
            merges=merges,
            bos_id=bos,
            eos_id=eos,
            unk_id=special("unk_token", "<unk>"),
            pad_id=special("pad_token", "<pad>"),
            add_bos=bool(cfg.get("add_bos_token", bos is not None)) and bos is not None,
            add_eos=bool(cfg.get("add_eos_token", False)) and eos is not None,
            add_space_prefix=False,
            eot_ids=tuple(sorted(eot)),
            variant="hf",
            source_sha256=hashlib.sha256(raw).hexdigest(),
        )
        backend.no_padding()
        backend.no_truncation()
        return cls(spec, _backend=backend)

    # -- properties -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.spec.tokens)

    @cached_property
    def hash(self) -> str:
        """``"0x"`` + sha256 hex of :meth:`TokenizerSpec.canonical_json` (format
        ``verinfer.tokenizer.spec/1``: sorted-key, whitespace-free, ASCII JSON of every spec
        field plus ``"format"``; scores as ``float.hex`` of their float32 value)."""
        return "0x" + hashlib.sha256(self.spec.canonical_json()).hexdigest()

    def token_to_id(self, s: str) -> int | None:
        return self._token_to_id.get(s)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self.spec.tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """Control (or unknown-type) token: dropped by ``decode(skip_special=True)``."""
        self._check_id(token_id)
        return self._types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN)

    # -- encoding -------------------------------------------------------------------------------
    def encode(
        self,
        text: str,
        *,
        add_bos: bool | None = None,
        parse_special: bool = True,
        add_eos: bool | None = None,
    ) -> list[int]:
        """Token ids of ``text``. ``add_bos``/``add_eos``: None -> the spec's default.
        ``parse_special``: match control tokens such as ``<start_of_turn>`` in the text."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        spec = self.spec
        out: list[int] = []
        if add_bos if add_bos is not None else spec.add_bos:
            if spec.bos_id is None:
                raise TokenizerError("this tokenizer has no BOS token")
            out.append(spec.bos_id)
        if self._backend is not None:
            self._backend.encode_special_tokens = not parse_special
            out.extend(self._backend.encode(text, add_special_tokens=False).ids)
        else:
            prev_special = True
            for frag, tid in self._partition(text, parse_special):
                if tid is not None:
                    out.append(tid)
                    prev_special = True
                    continue
                if spec.add_space_prefix and prev_special:
                    frag = " " + frag
                prev_special = False
                self._bpe(frag.replace(" ", SPACE), out)
        if add_eos if add_eos is not None else spec.add_eos:
            if spec.eos_id is None:
                raise TokenizerError("this tokenizer has no EOS token")
            out.append(spec.eos_id)
        return out

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

    # -- decoding -------------------------------------------------------------------------------
    def _check_id(self, token_id: int) -> None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise TokenizerError(f"token id must be an int, got {type(token_id).__name__}")
        if token_id < 0 or token_id >= len(self.spec.tokens):
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary ({self.vocab_size})"
            )

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for in decoded text (control tokens: their text)."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        self._check_id(token_id)
        t = self.spec.tokens[token_id]
        b: bytes | None = None
        if self._types[token_id] == TOKEN_BYTE:
            v = _byte_value(t)
            if v is not None:
                b = bytes((v,))
        if b is None:
            if self._byte_level:
                b = bytes(self._byte_decoder.get(ch, 0x3F) for ch in t)
            else:
                b = t.replace(SPACE, " ").encode("utf-8", "surrogateescape")
        self._bytes_cache[token_id] = b
        return b

    @cached_property
    def _byte_level(self) -> bool:
        if self._backend is None:
            return False
        dec = json.loads(self._backend.to_str()).get("decoder") or {}
        kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders") or []}
        return "ByteLevel" in kinds

    @cached_property
    def _byte_decoder(self) -> dict[str, int]:
        bs = list(range(ord("!"), ord("~") + 1))
        bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        extra = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + extra)
                extra += 1
        return {chr(c): b for b, c in zip(bs, cs, strict=True)}

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = True) -> bytes:
        """Concatenated token bytes (with the space-prefix strip of :meth:`decode`)."""
        buf = bytearray()
        types = self._types
        strip = self.spec.add_space_prefix
        for tid in ids:
            self._check_id(tid)
            if skip_special and types[tid] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                continue
            b = self.token_bytes(tid)
            if strip and b:
                if b[:1] == b" ":
                    b = b[1:]
                strip = False
            buf += b
        return bytes(buf)

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``: byte tokens to bytes, ``"▁"`` to ``" "``, control tokens dropped when
        ``skip_special``; UTF-8 with ``errors="replace"`` applied once at the end. With
        ``add_space_prefix`` the first emitted token loses one leading space."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the newly completed text.

    Never emits part of a multi-byte UTF-8 character (bytes of an incomplete character are held
    back until completed). ``"".join(push(i) for i in ids) + flush()`` equals
    ``tokenizer.decode(ids, skip_special=...)`` exactly, including U+FFFD replacements.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = tokenizer.spec.add_space_prefix
        self.ids: list[int] = []

    def push(self, token_id: int) -> str:
        tok = self._tok
        tok._check_id(token_id)
        self.ids.append(token_id)
        if self._skip and tok._types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            return ""
        b = tok.token_bytes(token_id)
        if self._strip and b:
            if b[:1] == b" ":
                b = b[1:]
            self._strip = False
        return self._dec.decode(b, final=False)

    def flush(self) -> str:
        """Text of any trailing incomplete character (as U+FFFD); call at end of stream."""
        return self._dec.decode(b"", final=True)


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
