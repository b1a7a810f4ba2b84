"""Tokenizers: one interface (:class:`Tokenizer`), several implementations.

* :mod:`.spec` -- :class:`TokenizerSpec` from GGUF metadata and its canonical, hashed form;
* :mod:`.base` -- the :class:`Tokenizer` interface with the shared identity/decoding code;
* :mod:`.spm` -- pure-Python SentencePiece BPE (Gemma, Llama 2) and the tiny test vocabulary;
* :mod:`.bytelevel` -- byte-level BPE (``gpt2``: SmolLM, Llama 3, Qwen ...) and HF
  ``tokenizer.json`` models, delegated to the maintained ``tokenizers`` library;
* :mod:`.stream` -- the incremental detokenizer.
"""

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.spec import (
    SPACE,
    SPEC_FORMAT,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    TokenizerSpec,
    read_gguf_tokenizer_fields,
    spec_from_gguf_fields,
)
from verinfer.engine.tokenizer.spm import SpmTokenizer, tiny_spm_vocab
from verinfer.engine.tokenizer.stream import StreamDecoder

__all__ = [
    "SPACE",
    "SPEC_FORMAT",
    "TOKEN_BYTE",
    "TOKEN_CONTROL",
    "TOKEN_NORMAL",
    "TOKEN_UNKNOWN",
    "TOKEN_UNUSED",
    "TOKEN_USER_DEFINED",
    "SpmTokenizer",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerSpec",
    "read_gguf_tokenizer_fields",
    "spec_from_gguf_fields",
    "tiny_spm_vocab",
]
