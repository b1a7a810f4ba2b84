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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verinfer.engine.config import ModelConfig
from verinfer.engine.models.common import (
    Batch,
    RopeTable,
    embed_scale,
    rope_divisors,
)
from verinfer.engine.ops import Matrix, MatrixGroup, Ops
from verinfer.engine.weights import Weights


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
    qkv: MatrixGroup  # q, k, v in one call where the panels allow
    gate_up: MatrixGroup


class Gemma3:
    def __init__(self, cfg: ModelConfig, weights: Weights, ops: Ops) -> None:
        self.cfg, self.ops = cfg, ops

        def mat(name: str) -> Matrix:  # packed once here, in the layout ops.linear wants
            return ops.prepare(weights.matrix(name))

        self.embed = mat("token_embd.weight")  # [V, dim], also the LM head
        self.out_norm = weights["output_norm.weight"]
        self.layers = [self._layer(weights, mat, i) for i in range(cfg.n_layers)]
        # rope scaling (Gemma 3 4B+: linear, factor 8) stretches the global layers only
        scaling = cfg.rope_scaling
        self.rope_global = RopeTable(cfg.head_dim, cfg.rope_theta, None if scaling is None else
                                     rope_divisors(scaling, cfg.head_dim, cfg.rope_theta))
        self.rope_local = RopeTable(cfg.head_dim, cfg.rope_local_theta)
        self.scale = embed_scale(cfg.dim)
        # the norm after layer i's residual: the next layer's input norm, or the output norm
        self.next_norm = [L.attn_norm for L in self.layers[1:]] + [self.out_norm]

    def _layer(self, weights: Weights, mat: Callable[[str], Matrix], i: int) -> Gemma3Layer:
        q, k, v = (mat(f"blk.{i}.attn_{n}.weight") for n in "qkv")
        gate, up = mat(f"blk.{i}.ffn_gate.weight"), mat(f"blk.{i}.ffn_up.weight")
        return Gemma3Layer(
            attn_norm=weights[f"blk.{i}.attn_norm.weight"],
            q=q,
            k=k,
            v=v,
            q_norm=weights[f"blk.{i}.attn_q_norm.weight"],
            k_norm=weights[f"blk.{i}.attn_k_norm.weight"],
            o=mat(f"blk.{i}.attn_output.weight"),
            post_attn_norm=weights[f"blk.{i}.post_attention_norm.weight"],
            ffn_norm=weights[f"blk.{i}.ffn_norm.weight"],
            gate=gate,
            up=up,
            down=mat(f"blk.{i}.ffn_down.weight"),
            post_ffw_norm=weights[f"blk.{i}.post_ffw_norm.weight"],
            qkv=self.ops.group([q, k, v]),
            gate_up=self.ops.group([gate, up]),
        )

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Runs the batch, fills its caches, returns logits [R, V] for batch.logit_rows.

        The residual stream x is updated in place and every layer ends with the next norm
        (Ops.add_rmsnorm_), the attention block after the projections is one call
        (Ops.qk_rope_attention): the same float operations as the step-by-step sequence in the
        module docstring, in fewer calls (issue 19; docs/engine.md)."""
        cfg, ops, eps = self.cfg, self.ops, self.cfg.norm_eps
        H, KV, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        seq, pos, all_rows = batch.seq, batch.pos, batch.all_rows_wanted
        kc, vc = batch.k_caches, batch.v_caches
        cos_g, sin_g = self.rope_global.get(pos)
        cos_l, sin_l = self.rope_local.get(pos)
        x = self.embed.rows(batch.tokens) * self.scale  # [T, dim], updated in place below
        h = ops.rmsnorm(x, self.layers[0].attn_norm, eps)
        for i, L in enumerate(self.layers):
            sliding = cfg.is_sliding(i)
            cos, sin = (cos_l, sin_l) if sliding else (cos_g, sin_g)
            window = (cfg.sliding_window or 0) if sliding else 0
            a = ops.qk_rope_attention(ops.linear_group_blocks(h, L.qkv), H, KV, D, L.q_norm,
                                      L.k_norm, eps, cos, sin, False, kc, vc, i, seq, pos,
                                      window, cfg.attn_scale)
            h = ops.add_rmsnorm_(x, ops.linear(a, L.o), L.post_attn_norm, L.ffn_norm, eps)
            m = ops.linear_glu(h, L.gate_up, "gelu_tanh")
            h = ops.add_rmsnorm_(x, ops.linear(m, L.down), L.post_ffw_norm, self.next_norm[i],
                                 eps)
        if not all_rows:  # the norm is per row: normed rows picked = picked rows normed
            h = h.index_select(0, batch.logit_rows.to(h.device))  # h on the Ops' device
        return ops.linear(h, self.embed)  # [R, V]
