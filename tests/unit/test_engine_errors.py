from __future__ import annotations

from pathlib import Path

import pytest

from verinfer.engine.engine import Engine
from verinfer.engine.loader import load_model
from verinfer.errors import ContextLengthExceededError, InvalidRequestError, ModelLoadError
from verinfer.protocol.sampling_params import SamplingParams


def test_unknown_model_path_is_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope.gguf")


def test_corrupt_gguf_is_a_model_load_error(tmp_path: Path, tiny_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError):
        load_model(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_path.read_bytes()[: tiny_path.stat().st_size // 2])
    with pytest.raises(ModelLoadError):
        load_model(cut)


def test_unsupported_extension(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="unsupported weight format"):
        load_model(f)


def test_model_id_is_the_file_hash(tiny_path: Path, tmp_path: Path) -> None:
    import hashlib

    from verinfer.engine.tiny import write_tiny_llama

    m = load_model(tiny_path)
    assert m.model_id == hashlib.sha256(tiny_path.read_bytes()).digest()
    other = load_model(write_tiny_llama(tmp_path / "other.gguf", seed=1))
    assert other.model_id != m.model_id
    assert other.tokenizer.hash == m.tokenizer.hash


def test_prompt_longer_than_context(tiny_engine: Engine) -> None:
    n = tiny_engine.max_context
    with pytest.raises(ContextLengthExceededError, match="maximum context length"):
        tiny_engine.submit([5] * n, SamplingParams(max_tokens=1))
    with pytest.raises(ContextLengthExceededError):
        tiny_engine.submit([5] * 10, SamplingParams(max_tokens=n))


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_non_positive_max_tokens(tiny_engine: Engine, max_tokens: int) -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        tiny_engine.submit([5, 6], SamplingParams(max_tokens=max_tokens))


def test_empty_prompt_and_bad_token_ids(tiny_engine: Engine) -> None:
    with pytest.raises(InvalidRequestError, match="empty"):
        tiny_engine.submit([], SamplingParams())
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        tiny_engine.submit([10**9], SamplingParams())
