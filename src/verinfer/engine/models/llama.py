"""Llama family (Llama 2/3, Mistral-style GQA, no biases) in one file.

GGUF llama weights store q/k permuted for rotating adjacent pairs (``rope_interleaved``);
HF safetensors keep the half layout. Untied models carry ``output.weight``.

Per layer (x: [T, dim]):
    x = x + o_proj(attn(rope(q(norm(x))), rope(k(norm(x))), v(norm(x))))
    x = x + down(silu(gate(norm(x))) * up(norm(x)))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verinfer.engine.config import ModelConfig
from verinfer.engine.loader import Weights
from verinfer.engine.models.common import Batch, RopeTable, rope_half, rope_interleaved
from verinfer.engine.ops import Matrix, Ops


@dataclass
class LlamaLayer:
    attn_norm: torch.Tensor  # [dim]
    q: Matrix  # [H*D, dim]
    k: Matrix  # [KV*D, dim]
    v: Matrix  # [KV*D, dim]
    o: Matrix  # [dim, H*D]
    ffn_norm: torch.Tensor  # [dim]
    gate: Matrix  # [F, dim]
    up: Matrix  # [F, dim]
    down: Matrix  # [dim, F]


class Llama:
    def __init__(self, cfg: ModelConfig, weights: Weights, ops: Ops) -> None:
        self.cfg, self.ops = cfg, ops

        def mat(name: str) -> Matrix:  # packed once here, in the layout ops.linear wants
            return ops.prepare(weights.matrix(name))

        self.embed = mat("token_embd.weight")  # [V, dim]
        has_head = "output.weight" in weights.f32 or "output.weight" in weights.q8_0
        self.head = mat("output.weight") if has_head else self.embed  # [V, dim]
        self.out_norm = weights["output_norm.weight"]
        self.layers = [
            LlamaLayer(
                attn_norm=weights[f"blk.{i}.attn_norm.weight"],
                q=mat(f"blk.{i}.attn_q.weight"),
                k=mat(f"blk.{i}.attn_k.weight"),
                v=mat(f"blk.{i}.attn_v.weight"),
                o=mat(f"blk.{i}.attn_output.weight"),
                ffn_norm=weights[f"blk.{i}.ffn_norm.weight"],
                gate=mat(f"blk.{i}.ffn_gate.weight"),
                up=mat(f"blk.{i}.ffn_up.weight"),
                down=mat(f"blk.{i}.ffn_down.weight"),
            )
            for i in range(cfg.n_layers)
        ]
        self.rope = RopeTable(cfg.head_dim, cfg.rope_theta)
        self.rotate = rope_interleaved if cfg.rope_interleaved else rope_half

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Runs the batch, fills its caches, returns logits [R, V] for batch.logit_rows."""
        cfg, ops = self.cfg, self.ops
        T, H, KV, D = batch.tokens.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        seq, pos = batch.seq, batch.pos
        cos, sin = self.rope.get(pos)
        x = self.embed.rows(batch.tokens)  # [T, dim]
        for i, L in enumerate(self.layers):
            h = ops.rmsnorm(x, L.attn_norm, cfg.norm_eps)
            q = self.rotate(ops.linear(h, L.q).view(T, H, D), cos, sin)
            k = self.rotate(ops.linear(h, L.k).view(T, KV, D), cos, sin)
            v = ops.linear(h, L.v).view(T, KV, D)
            batch.write_kv(i, k, v)
            a = ops.attention(q.contiguous(), *batch.kv(i), seq, pos, 0, cfg.attn_scale)
            x = x + ops.linear(a.view(T, H * D), L.o)
            h = ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps)
            m = ops.silu_mul(ops.linear(h, L.gate), ops.linear(h, L.up))
            x = x + ops.linear(m, L.down)
        x = ops.rmsnorm(x.index_select(0, batch.logit_rows), self.out_norm, cfg.norm_eps)
        return ops.linear(x, self.head)  # [R, V]
