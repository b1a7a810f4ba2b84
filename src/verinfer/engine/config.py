"""Model configuration shared by the loader and the model families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Arch = Literal["gemma3", "llama"]


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
    # gemma3 only ------------------------------------------------------------------------
    rope_local_theta: float = 10_000.0  # sliding-window layers use their own rope base
    sliding_window: int | None = None  # None: every layer is global
    sliding_window_pattern: int = 6  # layer i is global iff (i + 1) % pattern == 0
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5
    # llama only -------------------------------------------------------------------------
    rope_interleaved: bool = False  # GGUF llama layout: rotate adjacent pairs (GPT-J style)
    tie_embeddings: bool = True
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return float(base) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        if self.sliding_window is None:
            return False
        return (layer + 1) % self.sliding_window_pattern != 0
