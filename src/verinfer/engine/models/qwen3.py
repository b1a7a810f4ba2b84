"""Qwen3 (dense): Llama without q/k/v biases but with an RMSNorm over each head of q and k,
applied before the rotary (HF ``q_norm``/``k_norm``; GGUF ``attn_q_norm``/``attn_k_norm``).

The head size is its own hyper-parameter (``{arch}.attention.key_length``, HF ``head_dim``):
Qwen3 heads are wider than dim / n_heads. Rotary in the half (NeoX) layout; q/k not permuted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verinfer.engine.models.llama import Llama, LlamaLayer
from verinfer.engine.weights import Weights


@dataclass
class Qwen3Layer(LlamaLayer):
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]


class Qwen3(Llama):
    def load_layer(self, weights: Weights, i: int) -> Any:
        base = super().load_layer(weights, i)
        return Qwen3Layer(**vars(base),
                          q_norm=weights[f"blk.{i}.attn_q_norm.weight"],
                          k_norm=weights[f"blk.{i}.attn_k_norm.weight"])

    def qk_norms(self, L: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return L.q_norm, L.k_norm  # one row per (token, head), inside Ops.qk_rope_attention
