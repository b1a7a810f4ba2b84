"""Building a tokenizer: the factories that pick the implementation a spec or file names.

They live here, above the base class and its implementations (``spm``, ``fast_spm``,
``bytelevel``), so that the base class imports none of its subclasses (issue 33: the tokenizer
base and its implementations imported each other).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.bytelevel import ByteLevelTokenizer, JsonTokenizer
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer, fast_spm_refusal
from verinfer.engine.tokenizer.spec import (
    TokenizerSpec,
    _fields_from_reader,
    read_gguf_tokenizer_fields,
    spec_from_gguf_fields,
)
from verinfer.engine.tokenizer.spm import SpmTokenizer
from verinfer.errors import TokenizerError


def tokenizer_from_spec(spec: TokenizerSpec) -> Tokenizer:
    """The implementation ``spec.variant`` names."""
    if spec.variant in ("spm", "gemma"):
        # the Rust fast path where it is proven equal to the reference, else the reference
        if fast_spm_refusal(spec) is None:
            return FastSpmTokenizer(spec)
        return SpmTokenizer(spec)
    if spec.variant == "bytelevel":
        return ByteLevelTokenizer(spec)
    raise TokenizerError(f"no tokenizer implementation for variant {spec.variant!r}")


def tokenizer_from_gguf_fields(fields: Mapping[str, object], *,
                               variant: str | None = None) -> Tokenizer:
    """From GGUF key/values (python values). ``variant`` overrides the one implied by
    ``general.architecture`` ("gemma" for gemma/gemma2/gemma3, else "spm") for SentencePiece
    vocabularies; ``tokenizer.ggml.model == "gpt2"`` is always "bytelevel"."""
    return tokenizer_from_spec(spec_from_gguf_fields(fields, variant=variant))


def tokenizer_from_gguf(path: str | os.PathLike[str] | Any, *,
                        variant: str | None = None) -> Tokenizer:
    """From a GGUF file path (fast metadata parser) or an open ``gguf.GGUFReader``."""
    if isinstance(path, (str, os.PathLike)):
        fields = read_gguf_tokenizer_fields(path)
    elif hasattr(path, "fields"):
        fields = _fields_from_reader(path)
    else:
        raise TokenizerError(f"from_gguf expects a path or a GGUFReader, got {type(path)}")
    return tokenizer_from_gguf_fields(fields, variant=variant)


def tokenizer_from_tokenizer_json(path: str | os.PathLike[str]) -> Tokenizer:
    """From an HF ``tokenizer.json`` (safetensors models), delegating to ``tokenizers``."""
    return JsonTokenizer.from_tokenizer_json(path)
