"""The tokenizer's definition: :class:`TokenizerSpec`, read from GGUF metadata (``tokenizer.*``),
and its canonical, versioned serialization -- the bytes the tokenizer hash commits to.

Everything that can change a token id, or the prompt a chat renders to, is a spec field; the
implementations (:mod:`.spm`, :mod:`.bytelevel`) are pure functions of it.
"""

from __future__ import annotations

import array
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verinfer.errors import TokenizerError

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
# Pre-tokenizers (``tokenizer.ggml.pre``) the byte-level family implements, see
# verinfer.engine.tokenizer.bytelevel.PRE_TOKENIZERS. Any other name is refused: a guessed
# pre-tokenizer tokenizes differently from the one the model was trained with.
BYTE_LEVEL_PRE = frozenset({"gpt2", "smollm"})


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

    * ``"bytelevel"`` (``model == "gpt2"``: byte-level BPE, the family of GPT-2, Llama 3, Qwen,
      SmolLM): ``merges`` in rank order, ``pre`` names the pre-tokenizer (``tokenizer.ggml.pre``).

    ``source_sha256`` is only set for tokenizers delegated to the ``tokenizers`` package
    (:func:`verinfer.engine.tokenizer.load.tokenizer_from_tokenizer_json`); it is the sha256 of
    the tokenizer.json bytes.

    ``chat_template`` is the model's Jinja chat template (GGUF ``tokenizer.chat_template``, or
    ``chat_template`` of a ``tokenizer_config.json``): chat prompts are rendered from it. ``None``
    when the file has none; chats then use the built-in Gemma turn format of
    :mod:`verinfer.engine.chat`.
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
    pre: str | None = field(default=None)
    chat_template: str | None = field(default=None)

    def canonical_json(self) -> bytes:
        """The versioned canonical serialization that :attr:`Tokenizer.hash` hashes.

        A JSON object with sorted keys, no whitespace, ASCII only (``ensure_ascii``): ``format``
        (``SPEC_FORMAT``) plus every field of the spec; tuples become arrays, ``None`` ``null``,
        and each score is written as ``float.hex`` of its float32 value (exact, ``-0.0`` kept).
        ``pre`` and ``chat_template`` are written only when set, so a spec without them (every
        SentencePiece tokenizer) serializes -- and hashes -- exactly as before they existed.
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
        if self.pre is not None:
            obj["pre"] = self.pre
        if self.chat_template is not None:
            obj["chat_template"] = self.chat_template
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

    pre: str | None = None
    chat_template: str | None = None
    if model == "llama":
        if scores is None:
            raise TokenizerError(
                "SentencePiece ('llama') tokenizer without 'tokenizer.ggml.scores'"
            )
        if variant is None:
            arch = fields.get("general.architecture")
            variant = "gemma" if isinstance(arch, str) and arch in _GEMMA_ARCHS else "spm"
        if variant not in ("spm", "gemma"):
            raise TokenizerError(f"unknown tokenizer variant {variant!r}")
    elif model == "gpt2":
        if variant not in (None, "bytelevel"):
            raise TokenizerError(f"variant {variant!r} does not apply to a byte-level tokenizer")
        variant = "bytelevel"
        if merges is None:
            raise TokenizerError("byte-level ('gpt2') tokenizer without 'tokenizer.ggml.merges'")
        for m in merges:
            if m.count(" ") != 1 or m.startswith(" ") or m.endswith(" "):
                raise TokenizerError(f"malformed merge {m!r} in 'tokenizer.ggml.merges'")
        raw_pre = fields.get(_KEY + "pre")
        pre = "gpt2" if raw_pre is None else _as_str(raw_pre, _KEY + "pre")
        if pre not in BYTE_LEVEL_PRE:
            raise TokenizerError(
                f"byte-level pre-tokenizer {pre!r} is not supported (supported: "
                f"{sorted(BYTE_LEVEL_PRE)})")
    else:
        raise TokenizerError(f"unsupported GGUF tokenizer model {model!r}")
    if fields.get("tokenizer.chat_template") is not None:
        chat_template = _as_str(fields["tokenizer.chat_template"], "tokenizer.chat_template")

    bos = _opt_id(fields, "bos_token_id", n)
    eos = _opt_id(fields, "eos_token_id", n)
    unk = _opt_id(fields, "unknown_token_id", n)
    pad = _opt_id(fields, "padding_token_id", n)
    spm = model == "llama"
    # defaults: llama.cpp's for SPM; for byte-level BPE, HF's GPT2Tokenizer (no BOS, no prefix)
    add_bos = _opt_bool(fields, "add_bos_token", spm)
    add_eos = _opt_bool(fields, "add_eos_token", False)
    add_space_prefix = _opt_bool(fields, "add_space_prefix", spm)
    if not spm and add_space_prefix:
        raise TokenizerError("add_space_prefix is not supported for byte-level tokenizers")
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
        pre=pre,
        chat_template=chat_template,
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


