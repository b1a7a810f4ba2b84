"""The reductions a transformer needs, in two interchangeable kernel modes.

``invariant``: our fixed-order C++ kernels (csrc/verinfer_kernels.cpp). Every output bit depends
only on its own inputs — never on the number of rows, the other sequences in the batch, the
thread count or whether K/V came from a cache. This is what the service runs.

``fast``: plain PyTorch (MKL GEMMs, SDPA). Kept for comparison and as the negative control:
the determinism tests must detect that it is *not* batch invariant.

Elementwise work that is exact in IEEE arithmetic (add, mul) stays in PyTorch in both modes;
anything with a transcendental function or a reduction goes through these ops, because
PyTorch's vectorized and scalar-tail code paths may round differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

from verinfer.errors import KernelError

KernelMode = Literal["invariant", "fast"]


@dataclass
class Matrix:
    """A weight matrix [N, K] for y = x @ W.T: exact fp32 values, plus the GGUF Q8_0 or Q4_1
    blocks if stored so.

    ``packed`` is the kernel-ready copy that :meth:`Ops.prepare` builds once at model load
    (panels of 32 output rows; fp32, Q8_0 or Q4_1 as stored). The values are the same; only the
    memory layout differs, so the matrix still means exactly the stored weights.
    """

    f32: torch.Tensor | None
    q8_0: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    q4_1: torch.Tensor | None = None  # [N, K/32*20] uint8; f32 is then always set as well

    @property
    def shape(self) -> tuple[int, int]:
        if self.f32 is not None:
            return (int(self.f32.shape[0]), int(self.f32.shape[1]))
        assert self.q8_0 is not None
        return (int(self.q8_0.shape[0]), int(self.q8_0.shape[1]) // 34 * 32)

    def dense(self) -> torch.Tensor:
        """The fp32 matrix (dequantized once on first use when only Q8_0 blocks are held)."""
        if self.f32 is None:
            assert self.q8_0 is not None
            self.f32 = dequantize_q8_0_rows(self.q8_0)
        return self.f32

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` as fp32 (embedding lookup), exact either way."""
        if self.f32 is not None:
            return self.f32.index_select(0, ids)
        assert self.q8_0 is not None
        return dequantize_q8_0_rows(self.q8_0.index_select(0, ids))


def dequantize_q8_0_rows(blocks: torch.Tensor) -> torch.Tensor:
    """[R, K/32*34] uint8 Q8_0 → [R, K] fp32; value = fp16 scale * int8, one exact multiply."""
    r = blocks.shape[0]
    b = blocks.reshape(r, -1, 34)
    d = b[:, :, :2].contiguous().view(torch.float16).to(torch.float32)  # [R, nb, 1]
    q = b[:, :, 2:].contiguous().view(torch.int8).to(torch.float32)  # [R, nb, 32]
    return (q * d).reshape(r, -1)


class Ops(Protocol):
    mode: KernelMode
    linear_order: str  # names the summation order of every matmul; part of the fingerprint

    def prepare(self, w: Matrix) -> Matrix:
        """The matrix in the layout this mode's ``linear`` wants (called once per weight)."""
        ...

    def linear(self, x: torch.Tensor, w: Matrix) -> torch.Tensor: ...

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor: ...

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...

    def attention(
        self,
        q: torch.Tensor,  # [T, H, D]
        k_caches: list[torch.Tensor],  # per sequence [KV, cap, D]
        v_caches: list[torch.Tensor],
        seq: torch.Tensor,  # [T] int64 index into the cache lists
        pos: torch.Tensor,  # [T] int64 absolute position
        window: int,  # 0 = full causal
        scale: float,
    ) -> torch.Tensor: ...


class InvariantOps:
    """Every matmul (projections, FFN, LM head) is the packed family: one sequential fmaf
    chain over k per output, lanes over n (see kernels.py). Fast at large M (prefill, replay)
    and memory-bound at M=1 (decode), with the same bits for any row count."""

    mode: KernelMode = "invariant"
    linear_order = "seqfma-k-ascending-v1"

    def __init__(self) -> None:
        from verinfer.engine import kernels

        if not kernels.available():
            raise KernelError("the invariant kernels are not built: run "
                              "`pip install --no-build-isolation -e .` (see README)")
        kernels.isa()  # applies VERINFER_KERNEL_ISA now: a path this CPU lacks fails the load
        self.k = kernels

    def prepare(self, w: Matrix) -> Matrix:
        if w.packed is None:
            k = w.shape[1]
            if w.q8_0 is not None:
                w.packed = self.k.pack_q8_0(w.q8_0, k)
            elif w.q4_1 is not None:
                w.packed = self.k.pack_q4_1(w.q4_1, k)
            else:
                w.packed = self.k.pack_f32(w.dense())
        return w

    def linear(self, x: torch.Tensor, w: Matrix) -> torch.Tensor:
        if w.packed is None:
            raise KernelError("weight matrix used before Ops.prepare packed it")
        n, k = w.shape
        if w.q8_0 is not None:
            return self.k.linear_q8_0_packed(x, w.packed, n, k)
        if w.q4_1 is not None:
            return self.k.linear_q4_1_packed(x, w.packed, n, k)
        return self.k.linear_packed(x, w.packed, n)

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.k.rmsnorm(x, w, eps)

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.k.gelu_tanh_mul(gate, up)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.k.silu_mul(gate, up)

    def attention(self, q: torch.Tensor, k_caches: list[torch.Tensor],
                  v_caches: list[torch.Tensor], seq: torch.Tensor, pos: torch.Tensor,
                  window: int, scale: float) -> torch.Tensor:
        return self.k.attention(q, k_caches, v_caches, seq, pos, window, scale)


class TorchOps:
    mode: KernelMode = "fast"
    linear_order = "torch-default"

    def prepare(self, w: Matrix) -> Matrix:
        return w

    def linear(self, x: torch.Tensor, w: Matrix) -> torch.Tensor:
        return F.linear(x, w.dense())

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") * up

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def attention(self, q: torch.Tensor, k_caches: list[torch.Tensor],
                  v_caches: list[torch.Tensor], seq: torch.Tensor, pos: torch.Tensor,
                  window: int, scale: float) -> torch.Tensor:
        # One SDPA call per sequence over its cache, masked to the causal (sliding) window.
        out = torch.empty_like(q)
        n_heads = q.shape[1]
        for s in torch.unique(seq).tolist():
            rows = (seq == s).nonzero().flatten()
            p = pos.index_select(0, rows)
            n_keys = int(p.max()) + 1
            k = k_caches[s][:, :n_keys]
            v = v_caches[s][:, :n_keys]
            rep = n_heads // k.shape[0]
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            kpos = torch.arange(n_keys)
            mask = kpos[None, :] <= p[:, None]
            if window > 0:
                mask &= kpos[None, :] > p[:, None] - window
            qs = q.index_select(0, rows).transpose(0, 1)  # [H, t, D]
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
            out.index_copy_(0, rows, o.transpose(0, 1))
        return out


def make_ops(mode: KernelMode) -> Ops:
    if mode == "invariant":
        return InvariantOps()
    if mode == "fast":
        return TorchOps()
    raise ValueError(f"unknown kernel mode {mode!r}")
