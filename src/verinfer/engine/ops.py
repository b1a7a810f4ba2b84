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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from verinfer.errors import KernelError

GluAct = Literal["gelu_tanh", "silu"]
KernelMode = Literal["invariant", "fast"]


@dataclass
class Matrix:
    """A weight matrix [N, K] for y = x @ W.T: exact fp32 values, or the file's GGUF blocks.

    ``qtype``/``blocks``: the GGUF block type (a key of ``kernels.QUANT_BLOCKS``: Q8_0, Q5_0,
    Q4_1, Q4_K, Q6_K) and the raw rows, uint8 [N, row bytes]. Quantized matrices stay quantized
    in memory: the invariant kernels decode every block to exactly ``gguf.quants.dequantize``'s
    fp32 values inside the matmul, and ``dense``/``rows`` produce those same values on demand.
    ``q8_0``/``q4_1`` are the older spelling of ``blocks`` for those two types (accepted and
    kept in sync). ``packed`` is the kernel-ready copy that :meth:`Ops.prepare` builds once at
    model load (32-row panels, same values, another layout).
    """

    f32: torch.Tensor | None
    q8_0: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    q4_1: torch.Tensor | None = None
    qtype: str | None = None
    blocks: torch.Tensor | None = None
    _shape: tuple[int, int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for qtype, legacy in (("Q8_0", self.q8_0), ("Q4_1", self.q4_1)):
            if legacy is not None and self.blocks is None:
                self.qtype, self.blocks = qtype, legacy
        if self.qtype == "Q8_0":
            self.q8_0 = self.blocks
        elif self.qtype == "Q4_1":
            self.q4_1 = self.blocks
        if self.f32 is None and self.blocks is None:
            raise KernelError("a Matrix needs fp32 values or GGUF blocks")

    @property
    def shape(self) -> tuple[int, int]:
        if self._shape is None:  # asked on every matmul: computed once
            self._shape = self._compute_shape()
        return self._shape

    def _compute_shape(self) -> tuple[int, int]:
        if self.f32 is not None:
            return (int(self.f32.shape[0]), int(self.f32.shape[1]))
        assert self.blocks is not None and self.qtype is not None
        weights, nbytes = _quant_block(self.qtype)
        return (int(self.blocks.shape[0]), int(self.blocks.shape[1]) // nbytes * weights)

    def dense(self) -> torch.Tensor:
        """The fp32 matrix (dequantized once, on first use, when only blocks are held: the
        ``fast`` mode and tests; the invariant kernels never need it)."""
        if self.f32 is None:
            assert self.blocks is not None
            self.f32 = self._dequantize(self.blocks)
        return self.f32

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` as fp32 (embedding lookup), exact either way."""
        if self.f32 is not None:  # ids follow the weights to their device (a GPU engine's)
            return self.f32.index_select(0, ids.to(self.f32.device))
        assert self.blocks is not None
        return self._dequantize(self.blocks.index_select(0, ids.to(self.blocks.device)))

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        if self.qtype == "Q8_0":  # the hot path (embedding lookups), in torch
            return dequantize_q8_0_rows(blocks)
        import gguf

        assert self.qtype is not None
        arr = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[self.qtype])
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


def _quant_block(qtype: str) -> tuple[int, int]:
    from verinfer.engine.kernels import QUANT_BLOCKS

    if qtype not in QUANT_BLOCKS:
        raise KernelError(f"unsupported GGUF block type {qtype!r}")
    return QUANT_BLOCKS[qtype]


def dequantize_q8_0_rows(blocks: torch.Tensor) -> torch.Tensor:
    """[R, K/32*34] uint8 Q8_0 → [R, K] fp32; value = fp16 scale * int8, one exact multiply."""
    r = blocks.shape[0]
    b = blocks.reshape(r, -1, 34)
    d = b[:, :, :2].contiguous().view(torch.float16).to(torch.float32)  # [R, nb, 1]
    q = b[:, :, 2:].contiguous().view(torch.int8).to(torch.float32)  # [R, nb, 32]
    return (q * d).reshape(r, -1)


@dataclass
class MatrixGroup:
    """Matrices that multiply the same input (q/k/v, gate/up), for :meth:`Ops.linear_group`.

    ``packed``: one kernel-ready matrix holding every part's panels back to back (the parts'
    ``packed`` become views into it, so nothing is stored twice), when the mode and the parts
    allow it; else None and the parts run one by one. ``qtype``/``n``/``k``: what the kernel is
    called with; ``splits``: each part's output columns.
    """

    parts: list[Matrix]
    packed: torch.Tensor | None = None
    qtype: str | None = None
    n: int = 0
    k: int = 0
    mixed: bool = False  # quantized parts of one K in several panel layouts: one decode call

    @property
    def splits(self) -> list[int]:
        return [p.shape[0] for p in self.parts]


class Ops(Protocol):
    mode: KernelMode
    linear_order: str  # names the summation order of every matmul; part of the fingerprint

    def prepare(self, w: Matrix) -> Matrix:
        """The matrix in the layout this mode's ``linear`` wants (called once per weight)."""
        ...

    def linear(self, x: torch.Tensor, w: Matrix) -> torch.Tensor: ...

    def group(self, parts: Sequence[Matrix]) -> MatrixGroup:
        """Prepared matrices of one input as a group (called once per group, at model load)."""
        ...

    def linear_group(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        """``[linear(x, p) for p in g.parts]``, the same bits; possibly in one kernel call (the
        outputs are then column slices of one tensor: contiguous only for one row)."""
        ...

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor: ...

    def rmsnorm_rope_half(self, x: torch.Tensor, w: torch.Tensor, eps: float,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``rope_half(rmsnorm(x per head), cos, sin)``: x [T, H, D], cos/sin [T, D/2] (Gemma's
        q/k path; models/common.py has both steps)."""
        ...

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...

    def glu(self, y: torch.Tensor, act: GluAct) -> torch.Tensor:
        """``act(y[:, :F]) * y[:, F:]`` for y [T, 2F]: gelu_tanh_mul or silu_mul of the halves."""
        ...

    def linear_glu(self, x: torch.Tensor, g: MatrixGroup, act: GluAct) -> torch.Tensor:
        """``glu`` of a (gate, up) group's outputs: ``act(linear(x, gate)) * linear(x, up)``."""
        ...

    def add_rmsnorm_(self, x: torch.Tensor, o: torch.Tensor, post: torch.Tensor | None,
                     nxt: torch.Tensor, eps: float) -> torch.Tensor:
        """The residual step and the norm after it: ``x += rmsnorm(o, post)`` (``x += o``
        when post is None) in place; returns ``rmsnorm(x, nxt)``."""
        ...

    def linear_group_blocks(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        """Column blocks whose concatenation is ``[linear(x, p) for p in g.parts]``: the one
        output of a grouped call (no split), else one block per part."""
        ...

    def qk_rope_attention(self, qkv: list[torch.Tensor], n_heads: int, n_kv_heads: int,
                          head_dim: int, q_norm: torch.Tensor | None,
                          k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                          sin: torch.Tensor, interleaved: bool, k_caches: list[torch.Tensor],
                          v_caches: list[torch.Tensor], layer: int, seq: torch.Tensor,
                          pos: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        """After the projections (``qkv``: column blocks, one q|k|v or three): rope(rmsnorm?(q)),
        rope(rmsnorm?(k)) per head (half or interleaved layout), k and v into
        ``caches[seq[t]][layer, :, pos[t]]`` (whole KVCache tensors [n_layers, KV, cap, D]),
        attention; [T, H*D]."""
        ...

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
        from verinfer.engine import fused, kernels

        if not kernels.available():
            raise KernelError("the invariant kernels are not built: run "
                              "`pip install --no-build-isolation -e .` (see README)")
        kernels.isa()  # applies VERINFER_KERNEL_ISA now: a path this CPU lacks fails the load
        self.k, self.f = kernels, fused

    def prepare(self, w: Matrix) -> Matrix:
        if w.packed is None:
            if w.blocks is not None:
                assert w.qtype is not None
                w.packed = self.k.pack_quant(w.blocks, w.qtype, w.shape[1])
            else:
                w.packed = self.k.pack_f32(w.dense())
        return w

    def linear(self, x: torch.Tensor, w: Matrix) -> torch.Tensor:
        if w.packed is None:
            raise KernelError("weight matrix used before Ops.prepare packed it")
        n, k = w.shape
        if w.qtype is not None:
            return self.k.linear_quant_packed(x, w.packed, w.qtype, n, k)
        return self.k.linear_packed(x, w.packed, n)

    def group(self, parts: Sequence[Matrix]) -> MatrixGroup:
        """One panel matrix for parts of one panel layout and K whose row counts are whole
        panels: each output is still its own fmaf chain over k (rows never interact), so the
        one call gives the bits of the separate ones while reading x, starting threads and
        crossing into C++ once (Gemma 3 270M: q/k/v are Q5_0/Q8_0, both int8 panels)."""
        g = MatrixGroup(list(parts))
        if len(parts) < 2 or any(p.packed is None for p in parts):
            return g
        layouts = {self.k.panel_layout(p.qtype) for p in parts}
        ks = {p.shape[1] for p in parts}
        # e.g. Gemma 3's Q5_0 q/k with a Q8_0 v: decode runs them as one multi-layout call
        g.mixed = len(layouts) > 1 and len(ks) == 1 and all(p.qtype for p in parts)
        if len(layouts) != 1 or len(ks) != 1 or any(p.shape[0] % self.k.PANEL for p in parts):
            return g
        packed = torch.cat([p.packed for p in parts if p.packed is not None])
        start = 0
        for p in parts:
            assert p.packed is not None
            p.packed = packed[start:start + p.packed.shape[0]]  # a view: stored once
            start += p.packed.shape[0]
        g.packed, g.qtype, g.n, g.k = packed, parts[0].qtype, sum(g.splits), ks.pop()
        return g

    def linear_group(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        if not self._one_call(x, g):
            return [self.linear(x, p) for p in g.parts]
        return list(self._group_out(x, g).split(g.splits, dim=1))

    @staticmethod
    def _one_call(x: torch.Tensor, g: MatrixGroup) -> bool:
        """Whether the group runs as one call: one packed matrix, or a mixed group at decode
        size (M <= 4: linear_quant_packed_multi, each part's own GEMV)."""
        return g.packed is not None or (g.mixed and x.shape[0] <= 4)

    def _group_out(self, x: torch.Tensor, g: MatrixGroup) -> torch.Tensor:
        """The grouped call's one output [T, sum of the parts' n] (``_one_call`` holds)."""
        if g.packed is None:  # mixed: the separate calls' bits
            packed = [p.packed for p in g.parts if p.packed is not None]
            qtypes = [p.qtype for p in g.parts if p.qtype is not None]
            return self.k.linear_quant_packed_multi(x, packed, qtypes, g.splits,
                                                    g.parts[0].shape[1])
        if g.qtype is not None:
            return self.k.linear_quant_packed(x, g.packed, g.qtype, g.n, g.k)
        return self.k.linear_packed(x, g.packed, g.n)

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.k.rmsnorm(x, w, eps)

    def rmsnorm_rope_half(self, x: torch.Tensor, w: torch.Tensor, eps: float,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.k.rmsnorm_rope_half(x, w, eps, cos, sin)  # one pass, the same bits

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.k.gelu_tanh_mul(gate, up)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.k.silu_mul(gate, up)

    # The fused calls (engine/fused.py): the same bits as the unfused sequences, fewer calls.
    def glu(self, y: torch.Tensor, act: GluAct) -> torch.Tensor:
        return self.f.glu(y, act)

    def linear_glu(self, x: torch.Tensor, g: MatrixGroup, act: GluAct) -> torch.Tensor:
        if self._one_call(x, g) and len(g.parts) == 2 and g.splits[0] == g.splits[1]:
            return self.f.glu(self._group_out(x, g), act)
        gate, up = (self.linear(x, p) for p in g.parts)
        return (self.k.silu_mul if act == "silu" else self.k.gelu_tanh_mul)(gate, up)

    def add_rmsnorm_(self, x: torch.Tensor, o: torch.Tensor, post: torch.Tensor | None,
                     nxt: torch.Tensor, eps: float) -> torch.Tensor:
        return self.f.add_rmsnorm_(x, o, post, nxt, eps)

    def linear_group_blocks(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        if not self._one_call(x, g):
            return [self.linear(x, p) for p in g.parts]
        return [self._group_out(x, g)]

    def qk_rope_attention(self, qkv: list[torch.Tensor], n_heads: int, n_kv_heads: int,
                          head_dim: int, q_norm: torch.Tensor | None,
                          k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                          sin: torch.Tensor, interleaved: bool, k_caches: list[torch.Tensor],
                          v_caches: list[torch.Tensor], layer: int, seq: torch.Tensor,
                          pos: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        return self.f.qk_rope_attention(qkv, n_heads, n_kv_heads, head_dim, q_norm, k_norm,
                                        eps, cos, sin, interleaved, k_caches, v_caches, layer,
                                        seq, pos, window, scale)

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

    def group(self, parts: Sequence[Matrix]) -> MatrixGroup:
        return MatrixGroup(list(parts))

    def linear_group(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        return [self.linear(x, p) for p in g.parts]

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rmsnorm_rope_half(self, x: torch.Tensor, w: torch.Tensor, eps: float,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rope(self.rmsnorm(x, w, eps), cos, sin, interleaved=False)

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") * up

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    # The fused calls, unfused: the sequences the invariant mode runs as one kernel each.
    def glu(self, y: torch.Tensor, act: GluAct) -> torch.Tensor:
        gate, up = y.chunk(2, dim=1)
        return self.silu_mul(gate, up) if act == "silu" else self.gelu_tanh_mul(gate, up)

    def linear_glu(self, x: torch.Tensor, g: MatrixGroup, act: GluAct) -> torch.Tensor:
        gate, up = self.linear_group(x, g)
        return self.silu_mul(gate, up) if act == "silu" else self.gelu_tanh_mul(gate, up)

    def add_rmsnorm_(self, x: torch.Tensor, o: torch.Tensor, post: torch.Tensor | None,
                     nxt: torch.Tensor, eps: float) -> torch.Tensor:
        x.add_(o if post is None else self.rmsnorm(o, post, eps))
        return self.rmsnorm(x, nxt, eps)

    def linear_group_blocks(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        return self.linear_group(x, g)

    def qk_rope_attention(self, qkv: list[torch.Tensor], n_heads: int, n_kv_heads: int,
                          head_dim: int, q_norm: torch.Tensor | None,
                          k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                          sin: torch.Tensor, interleaved: bool, k_caches: list[torch.Tensor],
                          v_caches: list[torch.Tensor], layer: int, seq: torch.Tensor,
                          pos: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        H, KV, D = n_heads, n_kv_heads, head_dim
        y = torch.cat(qkv, dim=1) if len(qkv) > 1 else qkv[0]
        T = y.shape[0]
        q, k, v = (t.reshape(T, -1, D) for t in y.split([H * D, KV * D, KV * D], dim=1))
        q = rope(q if q_norm is None else self.rmsnorm(q, q_norm, eps), cos, sin, interleaved)
        k = rope(k if k_norm is None else self.rmsnorm(k, k_norm, eps), cos, sin, interleaved)
        for s in torch.unique(seq).tolist():
            rows = (seq == s).nonzero().flatten()
            p = pos.index_select(0, rows)
            k_caches[s][layer][:, p] = k.index_select(0, rows).transpose(0, 1)
            v_caches[s][layer][:, p] = v.index_select(0, rows).transpose(0, 1)
        a = self.attention(q.contiguous(), [c[layer] for c in k_caches],
                           [c[layer] for c in v_caches], seq, pos, window, scale)
        return a.reshape(T, H * D)

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


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary on x [T, H, D] with cos/sin [T, D/2]: adjacent pairs (x[2i], x[2i+1]) (GGUF llama
    layout) when ``interleaved``, else (x[i], x[i + D/2]) (NeoX/HF); per pair
    (a c - b s, b c + a s), every product and sum a separately rounded PyTorch op. The
    invariant kernels (rmsnorm_rope_half, qk_rope_attention) reproduce exactly these bits."""
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def make_ops(mode: KernelMode) -> Ops:
    """The CPU Ops of ``mode`` (on a GPU: engine/triton_ops.py's ``device_ops``)."""
    if mode == "invariant":
        return InvariantOps()
    if mode == "fast":
        return TorchOps()
    raise ValueError(f"unknown kernel mode {mode!r}")
