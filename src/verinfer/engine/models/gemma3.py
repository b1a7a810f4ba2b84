"""Gemma 3 (text) in one file.

Weights use GGUF names and conventions: RMSNorm weights already hold (1 + w), q/k are not
permuted (rotary in the NeoX/HF half layout), the embedding is tied to the LM head.

Per layer (x: [T, dim]):
    h = norm(x); q,k,v = proj(h); q,k = qk_norm(q,k); rope(q,k); attn over the cache
    x = x + post_attn_norm(o_proj(attn))
    x = x + post_ffw_norm(down(gelu_tanh(gate(norm(x))) * up(norm(x))))
Sliding-window layers (5 of every 6) attend to the last `sliding_window` positions and use the
local rope base; the others attend to the full prefix with the global base (and its scaling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verinfer.engine.config import ModelConfig
from verinfer.engine.loader import Weights
from verinfer.engine.models.common import (
    Batch,
    RopeTable,
    embed_scale,
    rope_divisors,
    rope_half,
)
from verinfer.engine.ops import Matrix, Ops


@dataclass
class Gemma3Layer:
    attn_norm: torch.Tensor  # [dim]
    q: Matrix  # [H*D, dim]
    k: Matrix  # [KV*D, dim]
    v: Matrix  # [KV*D, dim]
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    o: Matrix  # [dim, H*D]
    post_attn_norm: torch.Tensor  # [dim]
    ffn_norm: torch.Tensor  # [dim]
    gate: Matrix  # [F, dim]
    up: Matrix  # [F, dim]
    down: Matrix  # [dim, F]
    post_ffw_norm: torch.Tensor  # [dim]


class Gemma3:
    def __init__(self, cfg: ModelConfig, weights: Weights, ops: Ops) -> None:
        self.cfg, self.ops = cfg, ops

        def mat(name: str) -> Matrix:  # packed once here, in the layout ops.linear wants
            return ops.prepare(weights.matrix(name))

        self.embed = mat("token_embd.weight")  # [V, dim], also the LM head
        self.out_norm = weights["output_norm.weight"]
        self.layers = [
            Gemma3Layer(
                attn_norm=weights[f"blk.{i}.attn_norm.weight"],
                q=mat(f"blk.{i}.attn_q.weight"),
                k=mat(f"blk.{i}.attn_k.weight"),
                v=mat(f"blk.{i}.attn_v.weight"),
                q_norm=weights[f"blk.{i}.attn_q_norm.weight"],
                k_norm=weights[f"blk.{i}.attn_k_norm.weight"],
                o=mat(f"blk.{i}.attn_output.weight"),
                post_attn_norm=weights[f"blk.{i}.post_attention_norm.weight"],
                ffn_norm=weights[f"blk.{i}.ffn_norm.weight"],
                gate=mat(f"blk.{i}.ffn_gate.weight"),
                up=mat(f"blk.{i}.ffn_up.weight"),
                down=mat(f"blk.{i}.ffn_down.weight"),
                post_ffw_norm=weights[f"blk.{i}.post_ffw_norm.weight"],
            )
            for i in range(cfg.n_layers)
        ]
        # rope scaling (Gemma 3 4B+: linear, factor 8) stretches the global layers only
        scaling = cfg.rope_scaling
        self.rope_global = RopeTable(cfg.head_dim, cfg.rope_theta, None if scaling is None else
                                     rope_divisors(scaling, cfg.head_dim, cfg.rope_theta))
        self.rope_local = RopeTable(cfg.head_dim, cfg.rope_local_theta)
        self.scale = embed_scale(cfg.dim)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Runs the batch, fills its caches, returns logits [R, V] for batch.logit_rows."""
        cfg, ops = self.cfg, self.ops
        T, H, KV, D = batch.tokens.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        seq, pos = batch.seq, batch.pos
        cos_g, sin_g = self.rope_global.get(pos)
        cos_l, sin_l = self.rope_local.get(pos)
        x = self.embed.rows(batch.tokens) * self.scale  # [T, dim]
        for i, L in enumerate(self.layers):
            sliding = cfg.is_sliding(i)
            cos, sin = (cos_l, sin_l) if sliding else (cos_g, sin_g)
            h = ops.rmsnorm(x, L.attn_norm, cfg.norm_eps)
            q = ops.linear(h, L.q).view(T * H, D)
            k = ops.linear(h, L.k).view(T * KV, D)
            v = ops.linear(h, L.v).view(T, KV, D)
            q = rope_half(ops.rmsnorm(q, L.q_norm, cfg.norm_eps).view(T, H, D), cos, sin)
            k = rope_half(ops.rmsnorm(k, L.k_norm, cfg.norm_eps).view(T, KV, D), cos, sin)
            batch.write_kv(i, k, v)
            window = (cfg.sliding_window or 0) if sliding else 0
            a = ops.attention(q.contiguous(), *batch.kv(i), seq, pos, window, cfg.attn_scale)
            o = ops.linear(a.view(T, H * D), L.o)
            x = x + ops.rmsnorm(o, L.post_attn_norm, cfg.norm_eps)
            h = ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps)
            m = ops.gelu_tanh_mul(ops.linear(h, L.gate), ops.linear(h, L.up))
            x = x + ops.rmsnorm(ops.linear(m, L.down), L.post_ffw_norm, cfg.norm_eps)
        x = ops.rmsnorm(x.index_select(0, batch.logit_rows), self.out_norm, cfg.norm_eps)
        return ops.linear(x, self.embed)  # [R, V]
