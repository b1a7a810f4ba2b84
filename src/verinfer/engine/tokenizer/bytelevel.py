"""Tokenizers delegated to the maintained HF ``tokenizers`` library (Rust): byte-level BPE from
GGUF metadata (``tokenizer.ggml.model == "gpt2"``: GPT-2, Llama 3, Qwen, SmolLM ...) and any
HF ``tokenizer.json`` (safetensors models).

Byte-level BPE from GGUF is assembled exactly as transformers' GGUF converter does
(``transformers.integrations.gguf.gguf_tokenizer_mapping.byte_level_tokenizer``): the vocabulary
with tokens outside the byte alphabet respelled through their UTF-8 bytes, the file's merges in
rank order, control tokens (type 3) added as special tokens and user-defined ones (type 4) as
plain added tokens, both matched whole before pre-tokenization. The pre-tokenizer is the one
``tokenizer.ggml.pre`` names (:data:`PRE_TOKENIZERS`), as llama.cpp reads that key. Where
transformers' converter has no entry for a name it falls back to GPT-2's; for ``smollm`` that
drops the model's ``Digits(individual_digits=True)`` step (SmolLM2's published tokenizer.json and
llama.cpp's ``smollm`` regex both split every numeric character). The two agree on ASCII text (the
vocabulary has no merge joining ASCII digits) and differ only on non-ASCII numerals such as
``" ²"``; we follow the model's own tokenizer.

Encoding with ``parse_special=False`` uses a second backend whose special tokens are encoded as
text (``encode_special_tokens``), so a user typing ``<|im_start|>`` gets the characters, never
the control id. The two backends are never reconfigured after construction: a shared tokenizer
is safe to use from several threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from functools import cache
from typing import Any

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.bytelevel_words import (
    WORDS_MIN_CHARS,
    WordEncoder,
    word_path_available,
    words_backend,
)
from verinfer.engine.tokenizer.spec import (
    _EOT_NAMES,
    SPACE,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_USER_DEFINED,
    TokenizerSpec,
    _byte_value,
)
from verinfer.errors import TokenizerError

__all__ = ["PRE_TOKENIZERS", "ByteLevelTokenizer", "JsonTokenizer", "bytes_to_unicode"]


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@cache
def _byte_decoder() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _pre_tokenizer(name: str) -> Any:
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "gpt2":
        return byte_level
    if name == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise TokenizerError(f"byte-level pre-tokenizer {name!r} is not supported")


# texts this long are cut (cut_for_parallel) and encoded in parallel: HF's batch call runs
# its inputs on every core
PARALLEL_MIN_CHARS = 1 << 16
PARALLEL_CHUNKS = 8


def cut_for_parallel(text: str, *, step: int | None = None) -> list[str]:
    r"""``text`` in about :data:`PARALLEL_CHUNKS` pieces (or pieces of at least ``step``
    characters) whose byte-level ids concatenate to the ids of the whole. Each cut lies right
    after a newline that follows a letter or digit and precedes a letter (``"...x\ny..."`` ->
    ``"...x\n"`` | ``"y..."``).

    Why the ids cannot change under the GPT-2 pre-tokenizer regex
    (``'s|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``): no alternative crosses
    from the alphanumeric into the newline, so the newline starts a pre-token; whole, it is
    ``\s+`` = the newline alone (the letter after it is no space); cut, ``\s+(?!\S)`` = the
    newline alone at the end of the piece; the letter starts the next pre-token either way.
    BPE merges never cross pre-tokens, and digit splitting (``smollm``) only splits at digits.
    Python's isalnum/isalpha are subsets of what that regex treats as non-space, so a
    Unicode-version difference can only forgo a cut, never make a wrong one."""
    if step is None:
        step = max(len(text) // PARALLEL_CHUNKS, PARALLEL_MIN_CHARS // PARALLEL_CHUNKS)
    chunks: list[str] = []
    start = 0
    while len(text) - start > step:
        i = text.find("\n", start + step)
        while i > 0 and not (text[i - 1].isalnum() and i + 1 < len(text) and text[i + 1].isalpha()):
            i = text.find("\n", i + 1)
        if i < 0:
            break
        chunks.append(text[start : i + 1])
        start = i + 1
    chunks.append(text[start:])
    return chunks


# tokenizer.ggml.pre -> what it means (the names whose behaviour is implemented and tested)
PRE_TOKENIZERS = {
    "gpt2": "GPT-2 regex + byte-level",
    "smollm": "individual digits, then GPT-2 regex + byte-level (SmolLM / StarCoder)",
}


class _Delegate(Tokenizer):
    """Encoding through a ``tokenizers.Tokenizer``; decoding from the spec (see ``token_bytes``)."""

    def __init__(self, spec: TokenizerSpec, backend: Any, *, byte_level: bool) -> None:
        super().__init__(spec)
        import tokenizers

        backend.no_padding()
        backend.no_truncation()
        self._backend = backend
        self._plain = tokenizers.Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True
        self._byte_level = byte_level

    # True where cut_for_parallel's cuts provably keep the ids (ByteLevelTokenizer sets it)
    _parallel_cuts = False

    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        backend = self._backend if parse_special else self._plain
        chunks = (
            cut_for_parallel(text)
            if self._parallel_cuts and len(text) >= PARALLEL_MIN_CHARS
            else [text]
        )
        try:  # the batch call skips offsets (faster than encode(), same ids); chunks in parallel
            for enc in backend.encode_batch_fast(chunks, add_special_tokens=False):
                out.extend(enc.ids)
        except Exception as e:  # the Rust side raises a bare Exception
            raise TokenizerError(f"tokenizer failed on the input: {e}") from e

    def _raw_token_bytes(self, token_id: int) -> bytes:
        t = self.spec.tokens[token_id]
        ty = self._types[token_id]
        if ty == TOKEN_BYTE:
            v = _byte_value(t)
            if v is not None:
                return bytes((v,))
        if self._byte_level and ty not in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            dec = _byte_decoder()
            if all(ch in dec for ch in t):
                return bytes(dec[ch] for ch in t)
            # respelled at construction (see the module docstring): the text is what it means
            return t.encode("utf-8", "surrogateescape")
        if self._byte_level:
            return t.encode("utf-8", "surrogateescape")  # added tokens decode as their text
        return t.replace(SPACE, " ").encode("utf-8", "surrogateescape")


class ByteLevelTokenizer(_Delegate):
    """Byte-level BPE from GGUF metadata (spec variant ``"bytelevel"``)."""

    def __init__(self, spec: TokenizerSpec) -> None:
        if spec.variant != "bytelevel" or spec.merges is None or spec.pre is None:
            raise TokenizerError("ByteLevelTokenizer needs a byte-level spec with merges")
        import tokenizers
        from tokenizers import AddedToken, decoders, models

        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab: dict[str, int] = {}
        for i, t in enumerate(spec.tokens):
            key = t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
            vocab[key] = i  # a later duplicate wins, as in transformers' converter
        merges: list[tuple[str, str]] = []
        for m in spec.merges:  # one space each: checked by spec_from_gguf_fields
            left, right = m.split(" ")
            merges.append((left, right))
        try:
            model = models.BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                byte_fallback=False,
            )
        except Exception as e:
            raise TokenizerError(f"byte-level BPE cannot be built from this vocabulary: {e}") from e
        backend = tokenizers.Tokenizer(model)
        backend.pre_tokenizer = _pre_tokenizer(spec.pre)
        backend.decoder = decoders.ByteLevel()
        types = spec.token_types or (TOKEN_NORMAL,) * len(spec.tokens)
        control = [
            AddedToken(t, normalized=False, special=True)
            for t, ty in zip(spec.tokens, types, strict=True)
            if ty == TOKEN_CONTROL and set(t) <= alphabet
        ]
        user = [
            AddedToken(t, normalized=False, special=False)
            for t, ty in zip(spec.tokens, types, strict=True)
            if ty == TOKEN_USER_DEFINED and t in vocab
        ]
        if control:
            backend.add_special_tokens(control)
        if user:
            backend.add_tokens(user)
        super().__init__(spec, backend, byte_level=True)
        # cut_for_parallel's argument holds for the GPT-2 regex (with or without digit
        # splitting) when no added token holds a newline (no match can span a cut)
        self._parallel_cuts = spec.pre in PRE_TOKENIZERS and not any(
            "\n" in t.content for t in (*control, *user)
        )
        # the distinct-word path (bytelevel_words) for each special mode, built on first use
        self._word_encoders: dict[bool, WordEncoder | None] = {}
        self._word_lock = threading.Lock()
        self._words: Any = None  # the BPE-only backend both modes share

    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        words = self._word_encoder(parse_special) if len(text) >= WORDS_MIN_CHARS else None
        ids = words.encode(text) if words is not None else None
        if ids is None:  # no word path, or a code point whose class HF sees differently
            super()._encode_into(text, parse_special, out)
        else:
            out.extend(ids)

    def _word_encoder(self, parse_special: bool) -> WordEncoder | None:
        if parse_special in self._word_encoders:
            return self._word_encoders[parse_special]
        with self._word_lock:
            if parse_special not in self._word_encoders:
                self._word_encoders[parse_special] = self._build_word_encoder(parse_special)
            return self._word_encoders[parse_special]

    def _build_word_encoder(self, parse_special: bool) -> WordEncoder | None:
        """None where the word path's argument does not hold: other library versions, another
        pre-tokenizer, or added tokens with matching options HF applies (lstrip, ...)."""
        if not (self._parallel_cuts and word_path_available()):
            return None
        added = self._backend.get_added_tokens_decoder()
        if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values()):
            return None
        if self._words is None:
            self._words = words_backend(self._backend.model)
        return WordEncoder(
            self._words,
            self.spec.pre or "",
            [(t.content, i, t.special) for i, t in added.items()],
            parse_special=parse_special,
            cut=cut_for_parallel,
        )


class JsonTokenizer(_Delegate):
    """Any HF ``tokenizer.json`` (spec variant ``"hf"``)."""

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike[str]) -> JsonTokenizer:
        """From an HF ``tokenizer.json`` (safetensors models), delegating encoding to the
        ``tokenizers`` package. BOS/EOS come from a ``tokenizer_config.json`` next to it when
        present. The spec records the vocabulary and the sha256 of the file."""
        try:
            import tokenizers
        except ImportError as e:  # pragma: no cover
            raise TokenizerError("the 'tokenizers' package is needed for tokenizer.json") from e
        try:
            raw = open(path, "rb").read()  # noqa: SIM115
            data = json.loads(raw)  # a local model file the operator chose, not request bytes
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
            chat_template=_config_chat_template(cfg, cfg_path),
        )
        dec = data.get("decoder") or {}
        kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders") or []}
        return cls(spec, backend, byte_level="ByteLevel" in kinds)


def _config_chat_template(cfg: dict[str, Any], where: str) -> str | None:
    """``chat_template`` of a tokenizer_config.json: a string, or (newer files) a list of
    ``{"name", "template"}`` of which transformers uses the one named "default"."""
    value = cfg.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default":
                template = item.get("template")
                if isinstance(template, str):
                    return template
        return None  # only named (tool-use, RAG) templates: no default chat format
    raise TokenizerError(f"{where}: chat_template must be a string or a list of named templates")
