"""Fused decode-step kernels (csrc/verinfer_fused.cpp): whole sequences of the forward pass in
one call each, with exactly the bits of the unfused sequence.

They exist for speed only (issue 19: at one token per step the Python/PyTorch glue between
~200 small kernel calls was ~1.6 ms of a ~18 ms Gemma 3 270M step) and add no arithmetic: the
norms, rotary and attention are the kernels of :mod:`verinfer.engine.kernels`, the rest is
IEEE adds/products rounded as PyTorch rounds them, and copies. Errors come back as
:class:`~verinfer.errors.KernelError` through the same wrapper as every other kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from verinfer.engine.kernels import _tensor  # the one error-translating wrapper

GluAct = Literal["gelu_tanh", "silu"]


def add_rmsnorm_(x: torch.Tensor, o: torch.Tensor, post: torch.Tensor | None,
                 nxt: torch.Tensor, eps: float) -> torch.Tensor:
    """In place ``x += rmsnorm(o, post, eps)`` (``x += o`` when ``post`` is None); returns
    ``rmsnorm(x, nxt, eps)``. x, o: contiguous float32 [T, n]; the norms are
    :func:`kernels.rmsnorm` itself; the add rounds once per element, as ``x + y`` does."""
    return _tensor("add_rmsnorm_", x, o, post, nxt, float(eps))


def qk_rope_attention(qkv: Sequence[torch.Tensor], n_heads: int, n_kv_heads: int, head_dim: int,
                      q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                      cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                      k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor],
                      layer: int, seq: torch.Tensor, pos: torch.Tensor, window: int,
                      scale: float) -> torch.Tensor:
    """The attention block after the q/k/v projections, as one call, [T, H*D]:

    q' = rope(rmsnorm?(q)), k' = rope(rmsnorm?(k)) per (token, head) (norm when the weight is
    given; rope in the half or the interleaved layout of models/common.py); k' and v are
    written into ``k_caches[seq[t]][layer, :, pos[t]]`` / ``v_caches[...]``; then
    :func:`kernels.attention` over the caches' ``layer``. ``qkv``: column blocks [T, cols]
    (strided rows allowed): one q|k|v block [T, (H + 2 KV) D] or three, q [T, H D], k and v
    [T, KV D]. Caches: whole KVCache tensors [n_layers, KV, cap, D]; cos/sin [T, D/2].
    Nothing is written unless every input is valid.
    """
    return _tensor("qk_rope_attention", list(qkv), int(n_heads), int(n_kv_heads), int(head_dim),
                   q_norm, k_norm, float(eps), cos, sin, bool(interleaved), list(k_caches),
                   list(v_caches), int(layer), seq, pos, int(window), float(scale))


def glu(y: torch.Tensor, act: GluAct) -> torch.Tensor:
    """``act(y[:, :F]) * y[:, F:]`` for y [T, 2F] (a grouped gate|up output), with
    :func:`kernels.gelu_tanh_mul` / :func:`kernels.silu_mul`."""
    return _tensor("glu", y, act)
