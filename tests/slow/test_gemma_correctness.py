"""Our Gemma 3 code on the real 270M GGUF vs HF transformers' Gemma 3 forward (fp32).

Requirement: max |Δlogit| <= 1e-3 over every position of a few prompts, with the invariant
kernels the service runs (and the plain PyTorch ones for reference).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from hf_reference import hf_logits, load_hf_model
from verinfer.engine.loader import LoadedModel, embedded_model_path, load_model
from verinfer.engine.models.common import Batch, KVCache, Segment
from verinfer.engine.models.gemma3 import Gemma3
from verinfer.engine.ops import make_ops

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
    # > 512 tokens so the sliding-window layers actually drop keys
    "Once upon a time, in a land far away, there lived a curious fox. " * 45,
]


@pytest.fixture(scope="module")
def gemma() -> LoadedModel:
    return load_model(embedded_model_path())


@pytest.fixture(scope="module")
def hf() -> Any:
    model, _ = load_hf_model(embedded_model_path())
    return model


def _ours(lm: LoadedModel, mode: str, ids: list[int]) -> torch.Tensor:
    c = lm.config
    model = Gemma3(c, lm.weights, make_ops(mode))  # type: ignore[arg-type]
    cache = KVCache(c.n_layers, c.n_kv_heads, c.head_dim, len(ids))
    batch = Batch(torch.tensor(ids), [Segment(0, 0, len(ids))], [cache], torch.arange(len(ids)))
    return model.forward(batch)


@pytest.mark.parametrize("mode", ["invariant", "fast"])
def test_logits_match_hf_transformers(gemma: LoadedModel, hf: Any, mode: str) -> None:
    worst = 0.0
    for text in PROMPTS:
        ids = gemma.tokenizer.encode(text)
        ours, ref = _ours(gemma, mode, ids), hf_logits(hf, ids)
        assert ours.shape == ref.shape
        diff = float((ours - ref).abs().max())
        worst = max(worst, diff)
        assert diff <= 1e-3, f"{len(ids)}-token prompt: max |Δlogit| = {diff}"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    print(f"[{mode}] worst max|Δlogit| = {worst:.3e}")


def test_long_prompt_exceeds_the_sliding_window(gemma: LoadedModel) -> None:
    assert len(gemma.tokenizer.encode(PROMPTS[-1])) > 512
