"""Llama family (Llama 2/3.x, Mistral, SmolLM …) and the base of every llama-like family.

Per layer (x: [T, dim]):
    x = x + o_proj(attn(rope(q(norm(x))), rope(k(norm(x))), v(norm(x))))
    x = x + down(silu(gate(norm(x))) * up(norm(x)))

Variants that are "llama + one twist" subclass :class:`Llama` and override one hook
(:meth:`Llama.project_qkv`, :meth:`Llama.qk_norms`, :meth:`Llama.mlp`,
:meth:`Llama.load_layer`): Qwen2 adds q/k/v biases (qwen2.py), Qwen3 a per-head RMSNorm on q
and k (qwen3.py), Phi-3 fuses q/k/v and gate/up into one matrix each (phi3.py). Two twists
are plain configuration, read here:

* Mistral is this class with ``cfg.sliding_window`` set: every layer attends to the last W
  positions (llama.cpp writes Mistral as ``general.architecture = "llama"``).
* Llama 3.1/3.2 rope scaling: GGUF files carry llama.cpp's ``rope_freqs.weight`` (one divisor
  per frequency), HF checkpoints ``cfg.rope_scaling``; both become the same divisors.

Rotary layout: llama.cpp's converter permutes the q/k rows of ``llama`` models so that GGUF
rotates adjacent pairs (``cfg.rope_interleaved``); HF keeps the half (NeoX) layout, as do the
GGUF files of Qwen2/Qwen3/Phi-3 (their converters do not permute). Untied models carry
``output.weight``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verinfer.engine.config import ModelConfig
from verinfer.engine.models.common import (
    Batch,
    RopeTable,
    rope_divisors,
)
from verinfer.engine.ops import Matrix, MatrixGroup, Ops
from verinfer.engine.weights import Weights
from verinfer.errors import ModelLoadError

ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency rope divisors (Llama 3.1 scaling)


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
    qkv_group: MatrixGroup  # q, k, v in one call where the panels allow (Ops.group)
    gate_up_group: MatrixGroup


def has_weight(weights: Weights, name: str) -> bool:
    try:
        weights.matrix(name)
    except ModelLoadError:
        return False
    return True


class Llama:
    def __init__(self, cfg: ModelConfig, weights: Weights, ops: Ops) -> None:
        self.cfg, self.ops = cfg, ops
        self.embed = self.mat(weights, "token_embd.weight")  # [V, dim]
        has_head = has_weight(weights, "output.weight")
        self.head = self.mat(weights, "output.weight") if has_head else self.embed  # [V, dim]
        self.out_norm = weights["output_norm.weight"]
        self.layers: list[Any] = [self.load_layer(weights, i) for i in range(cfg.n_layers)]
        self.rope = RopeTable(cfg.head_dim, cfg.rope_theta, self._rope_divisors(weights))
        # the norm after layer i's residual: the next layer's input norm, or the output norm
        self.next_norm = [L.attn_norm for L in self.layers[1:]] + [self.out_norm]
        # Mistral, Phi-3: one window for every layer; 0 = full causal attention
        self.window = cfg.sliding_window or 0

    def mat(self, weights: Weights, name: str) -> Matrix:
        """Packed once here, in the layout ops.linear wants."""
        return self.ops.prepare(weights.matrix(name))

    def _rope_divisors(self, weights: Weights) -> torch.Tensor | None:
        cfg = self.cfg
        try:  # the GGUF form: the divisors themselves
            return weights[ROPE_FREQS].reshape(-1)
        except ModelLoadError:
            pass
        if cfg.rope_scaling is not None:  # the HF form: the rule that yields them
            return rope_divisors(cfg.rope_scaling, cfg.head_dim, cfg.rope_theta)
        return None

    def load_layer(self, weights: Weights, i: int) -> Any:
        q, k, v = (self.mat(weights, f"blk.{i}.attn_{n}.weight") for n in "qkv")
        gate = self.mat(weights, f"blk.{i}.ffn_gate.weight")
        up = self.mat(weights, f"blk.{i}.ffn_up.weight")
        return LlamaLayer(
            attn_norm=weights[f"blk.{i}.attn_norm.weight"],
            q=q,
            k=k,
            v=v,
            o=self.mat(weights, f"blk.{i}.attn_output.weight"),
            ffn_norm=weights[f"blk.{i}.ffn_norm.weight"],
            gate=gate,
            up=up,
            down=self.mat(weights, f"blk.{i}.ffn_down.weight"),
            qkv_group=self.ops.group([q, k, v]),
            gate_up_group=self.ops.group([gate, up]),
        )

    def project_qkv(self, h: torch.Tensor, L: Any) -> list[torch.Tensor]:
        """q|k|v before rotary as column blocks [T, cols] (Ops.qk_rope_attention's ``qkv``):
        one block [T, (H + 2 KV) D] or three, q [T, H D], k and v [T, KV D]."""
        return self.ops.linear_group_blocks(h, L.qkv_group)

    def qk_norms(self, L: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Per-head RMSNorm weights of q and k applied before the rotary (None: no norm)."""
        return None, None

    def mlp(self, h: torch.Tensor, L: Any) -> torch.Tensor:
        ops = self.ops
        return ops.linear(ops.linear_glu(h, L.gate_up_group, "silu"), L.down)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Runs the batch, fills its caches, returns logits [R, V] for batch.logit_rows.

        x is updated in place and each residual step ends with the next norm
        (Ops.add_rmsnorm_); rotary, cache write and attention are one call
        (Ops.qk_rope_attention): the module docstring's operations, in fewer calls."""
        cfg, ops, eps = self.cfg, self.ops, self.cfg.norm_eps
        seq, pos, all_rows = batch.seq, batch.pos, batch.all_rows_wanted
        kc, vc = batch.k_caches, batch.v_caches
        cos, sin = self.rope.get(pos)
        x = self.embed.rows(batch.tokens)  # [T, dim], a fresh tensor: updated in place
        h = ops.rmsnorm(x, self.layers[0].attn_norm, eps)
        for i, L in enumerate(self.layers):
            q_norm, k_norm = self.qk_norms(L)
            a = ops.qk_rope_attention(self.project_qkv(h, L), cfg.n_heads, cfg.n_kv_heads,
                                      cfg.head_dim, q_norm, k_norm, eps, cos, sin,
                                      cfg.rope_interleaved, kc, vc, i, seq, pos, self.window,
                                      cfg.attn_scale)
            h = ops.add_rmsnorm_(x, ops.linear(a, L.o), None, L.ffn_norm, eps)
            h = ops.add_rmsnorm_(x, self.mlp(h, L), None, self.next_norm[i], eps)
        if not all_rows:  # the norm is per row: normed rows picked = picked rows normed
            h = h.index_select(0, batch.logit_rows.to(h.device))  # h on the Ops' device
        return ops.linear(h, self.head)  # [R, V]
