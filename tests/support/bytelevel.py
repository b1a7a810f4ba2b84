"""The byte-level (SmolLM2) tokenizer and its reference ids for the tokenizer tests: one home for
"the ids of one whole-text call of the HF backend", which every faster path must equal."""

from __future__ import annotations

from verinfer.engine.loader import smollm2_model_path
from verinfer.engine.tokenizer.bytelevel import ByteLevelTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import read_gguf_tokenizer_fields


def smollm2_tokenizer() -> ByteLevelTokenizer:
    t = tokenizer_from_gguf_fields(read_gguf_tokenizer_fields(smollm2_model_path()))
    assert isinstance(t, ByteLevelTokenizer)
    return t


def whole_text_ids(tok: ByteLevelTokenizer, text: str, parse_special: bool) -> list[int]:
    """The HF backend's ids for ``text`` in one call: no cuts, no word path."""
    backend = tok._backend if parse_special else tok._plain
    return list(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)
