"""Phi-3 (mini/medium, 4k context): Llama with q/k/v fused into one matrix and gate/up into
another, as both HF (``qkv_proj``, ``gate_up_proj``) and llama.cpp (``attn_qkv``, a ``ffn_up``
of 2F rows: gate first, then up) store them.

The fused matrix is multiplied as one: every output row is its own fixed-order dot product,
so splitting the product's columns afterwards gives the very bits of three separate matmuls.
Some Phi-3 GGUFs carry separate ``attn_q``/``attn_k``/``attn_v``; those take Llama's path.
Rotary in the half (NeoX) layout (not permuted); a sliding window applies to every layer.
Long-context variants (su/longrope scaling, ``rope_factors_long``) are refused in the registry:
their frequencies switch with the sequence length, which no fixed rotary table reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verinfer.engine.models.llama import Llama, has_weight
from verinfer.engine.ops import Matrix
from verinfer.engine.weights import Weights
from verinfer.errors import ModelLoadError


@dataclass
class Phi3Layer:
    attn_norm: torch.Tensor  # [dim]
    qkv: Matrix  # [(H + 2*KV)*D, dim]
    o: Matrix  # [dim, H*D]
    ffn_norm: torch.Tensor  # [dim]
    gate_up: Matrix  # [2F, dim]: rows 0..F-1 gate, F..2F-1 up
    down: Matrix  # [dim, F]


class Phi3(Llama):
    def _rope_divisors(self, weights: Weights) -> torch.Tensor | None:
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            if has_weight(weights, name):
                raise ModelLoadError(f"phi3: su/longrope rope scaling ({name}) is not "
                                     "supported: its frequencies switch with the sequence length")
        return super()._rope_divisors(weights)

    def load_layer(self, weights: Weights, i: int) -> Any:
        if not has_weight(weights, f"blk.{i}.attn_qkv.weight"):
            return super().load_layer(weights, i)
        cfg = self.cfg
        layer = Phi3Layer(
            attn_norm=weights[f"blk.{i}.attn_norm.weight"],
            qkv=self.mat(weights, f"blk.{i}.attn_qkv.weight"),
            o=self.mat(weights, f"blk.{i}.attn_output.weight"),
            ffn_norm=weights[f"blk.{i}.ffn_norm.weight"],
            gate_up=self.mat(weights, f"blk.{i}.ffn_up.weight"),
            down=self.mat(weights, f"blk.{i}.ffn_down.weight"),
        )
        want_qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        if layer.qkv.shape != (want_qkv, cfg.dim):
            raise ModelLoadError(f"blk.{i}.attn_qkv.weight: expected shape {(want_qkv, cfg.dim)}"
                                 f", found {layer.qkv.shape}")
        if layer.gate_up.shape != (2 * cfg.ffn_dim, cfg.dim):
            raise ModelLoadError(f"blk.{i}.ffn_up.weight: expected the fused gate/up shape "
                                 f"{(2 * cfg.ffn_dim, cfg.dim)}, found {layer.gate_up.shape}")
        return layer

    def project_qkv(self, h: torch.Tensor, L: Any) -> list[torch.Tensor]:
        if not isinstance(L, Phi3Layer):
            return super().project_qkv(h, L)
        return [self.ops.linear(h, L.qkv)]  # one q|k|v block [T, (H + 2 KV) D]

    def mlp(self, h: torch.Tensor, L: Any) -> torch.Tensor:
        if not isinstance(L, Phi3Layer):
            return super().mlp(h, L)
        ops = self.ops
        return ops.linear(ops.glu(ops.linear(h, L.gate_up), "silu"), L.down)  # gate|up [T, 2F]
