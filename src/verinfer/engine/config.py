"""Model configuration shared by the loader and the model families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Arch = Literal["gemma3", "llama", "qwen2", "qwen3", "phi3"]


@dataclass(frozen=True)
class RopeScaling:
    """How a model stretches its rotary frequencies past the context it was trained on.

    ``linear``: every frequency divided by ``factor`` (HF "linear", llama.cpp ``linear``).
    ``llama3``: Llama 3.1's per-frequency rule — wavelengths above
    ``original_context_length / low_freq_factor`` divided by ``factor``, below
    ``original_context_length / high_freq_factor`` kept, smoothly blended in between. llama.cpp's
    converter does not write these numbers as metadata but bakes them into a ``rope_freqs.weight``
    tensor (one divisor per frequency); a GGUF model reads that tensor, an HF ``config.json`` this.
    """

    kind: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    arch: Arch
    vocab_size: int
    dim: int  # hidden size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float
    context_length: int
    rope_theta: float
    # sliding-window attention --------------------------------------------------------------
    sliding_window: int | None = None  # None: every layer attends to its whole prefix
    # gemma3: layer i is global iff (i + 1) % pattern == 0; 0: every layer slides (Mistral,
    # Phi-3: one window for all layers)
    sliding_window_pattern: int = 6
    # gemma3 only ------------------------------------------------------------------------
    rope_local_theta: float = 10_000.0  # sliding-window layers use their own rope base
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5
    # llama-like families ----------------------------------------------------------------
    rope_interleaved: bool = False  # GGUF llama layout: rotate adjacent pairs (GPT-J style)
    rope_scaling: RopeScaling | None = None
    tie_embeddings: bool = True
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return float(base) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        if self.sliding_window is None:
            return False
        if self.sliding_window_pattern == 0:
            return True
        return (layer + 1) % self.sliding_window_pattern != 0
