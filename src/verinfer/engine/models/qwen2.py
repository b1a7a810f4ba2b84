"""Qwen2 / Qwen2.5: Llama with a bias on the q, k and v projections (not on o).

GGUF (llama.cpp's converter): ``blk.{i}.attn_{q,k,v}.bias``; q/k are not permuted, so the
rotary is the half (NeoX) layout, as in HF. Small models tie the LM head to the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verinfer.engine.models.llama import Llama, LlamaLayer
from verinfer.engine.weights import Weights


@dataclass
class Qwen2Layer(LlamaLayer):
    q_bias: torch.Tensor  # [H*D]
    k_bias: torch.Tensor  # [KV*D]
    v_bias: torch.Tensor  # [KV*D]


class Qwen2(Llama):
    def load_layer(self, weights: Weights, i: int) -> Any:
        base = super().load_layer(weights, i)
        return Qwen2Layer(**vars(base),
                          q_bias=weights[f"blk.{i}.attn_q.bias"],
                          k_bias=weights[f"blk.{i}.attn_k.bias"],
                          v_bias=weights[f"blk.{i}.attn_v.bias"])

    def project_qkv(self, h: torch.Tensor, L: Any) -> list[torch.Tensor]:
        # The bias is one IEEE add per element after the fixed-order matmul: exact whatever
        # the batch, so invariance and replay hold as for Llama.
        ops = self.ops
        return [ops.linear(h, L.q) + L.q_bias, ops.linear(h, L.k) + L.k_bias,
                ops.linear(h, L.v) + L.v_bias]
