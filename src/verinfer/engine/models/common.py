"""Pieces every model family shares: the token batch, KV caches and rotary tables."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from verinfer.engine.config import RopeScaling
from verinfer.engine.ops import rope

ROPE_CHUNK = 1024  # rotary tables grow in fixed chunks so every entry is computed the same way


@dataclass
class Segment:
    """A run of consecutive tokens of one sequence inside a flat batch."""

    slot: int  # index into the batch's cache list
    start: int  # absolute position of the first token
    length: int


@dataclass
class Batch:
    """A flat batch of T tokens from several sequences (prefill chunks and decode steps mixed)."""

    tokens: torch.Tensor  # [T] int64
    segments: list[Segment]
    caches: list[KVCache]
    logit_rows: torch.Tensor  # [R] int64: rows of the batch whose logits are wanted

    @property
    def decode_only(self) -> bool:
        """Every segment is one token (a pure decode step): seq/pos need no cat/arange."""
        return all(s.length == 1 for s in self.segments)

    @property
    def seq(self) -> torch.Tensor:  # [T] slot of each token
        if self.decode_only:
            return torch.tensor([s.slot for s in self.segments], dtype=torch.int64)
        return torch.cat([torch.full((s.length,), s.slot, dtype=torch.int64)
                          for s in self.segments])

    @property
    def pos(self) -> torch.Tensor:  # [T] absolute position of each token
        if self.decode_only:
            return torch.tensor([s.start for s in self.segments], dtype=torch.int64)
        return torch.cat([torch.arange(s.start, s.start + s.length, dtype=torch.int64)
                          for s in self.segments])

    @property
    def k_caches(self) -> list[torch.Tensor]:
        """Every cache's whole key tensor [n_layers, KV, cap, D], for Ops.qk_rope_attention."""
        return [c.k for c in self.caches]

    @property
    def v_caches(self) -> list[torch.Tensor]:
        return [c.v for c in self.caches]

    @property
    def all_rows_wanted(self) -> bool:
        """logit_rows is 0..T-1 (every decode step): the final norm can run on x itself."""
        t = self.tokens.shape[0]
        return self.logit_rows.shape[0] == t and self.logit_rows.tolist() == list(range(t))


class KVCache:
    """One sequence's keys and values for every layer: [n_layers, n_kv_heads, capacity, head_dim].

    K/V are always written here first and read back by attention, so the stored values are the
    same whether a position was computed in prefill, in a decode step or in a replay.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int,
                 device: torch.device | str = "cpu") -> None:
        self.capacity = capacity
        self.k = torch.zeros(n_layers, n_kv_heads, capacity, head_dim, device=device)
        self.v = torch.zeros(n_layers, n_kv_heads, capacity, head_dim, device=device)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [n, n_kv_heads, head_dim] for positions start..start+n-1."""
        n = k.shape[0]
        if start + n > self.capacity:
            raise IndexError(f"KV cache holds {self.capacity} positions, write needs {start + n}")
        self.k[layer, :, start:start + n] = k.transpose(0, 1)
        self.v[layer, :, start:start + n] = v.transpose(0, 1)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class RopeTable:
    """cos/sin of position * inv_freq for one base, grown in fixed chunks and cached.

    Computed in float64 from (position, frequency index) alone and rounded once to float32, so
    an entry never depends on which other positions were requested with it.
    """

    def __init__(self, head_dim: int, base: float, divisors: torch.Tensor | None = None) -> None:
        """``divisors``: one per frequency (rope scaling, see :func:`rope_divisors`): the
        frequency base^(-2i/D) is divided by it, as llama.cpp does with ``rope_freqs``."""
        half = head_dim // 2
        idx = torch.arange(half, dtype=torch.float64)
        self.inv_freq = 1.0 / (base ** (2.0 * idx / head_dim))
        if divisors is not None:
            if divisors.shape != (half,):
                raise ValueError(f"rope scaling has {tuple(divisors.shape)} divisors, the "
                                 f"head needs {half}")
            self.inv_freq = self.inv_freq / divisors.to(torch.float64)
        self.cos = torch.empty(0, half)
        self.sin = torch.empty(0, half)

    def _grow(self, n: int) -> None:
        while self.cos.shape[0] < n:
            start = self.cos.shape[0]
            p = torch.arange(start, start + ROPE_CHUNK, dtype=torch.float64)
            ang = p[:, None] * self.inv_freq[None, :]
            # math.cos per element would be slow; torch's float64 cos is correctly rounded to
            # well under float32 precision, and the float32 rounding is what we keep.
            self.cos = torch.cat([self.cos, torch.cos(ang).to(torch.float32)])
            self.sin = torch.cat([self.sin, torch.sin(ang).to(torch.float32)])

    def get(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions → cos, sin of shape [T, head_dim/2]."""
        self._grow(int(pos.max()) + 1 if pos.numel() else 0)
        return self.cos.index_select(0, pos), self.sin.index_select(0, pos)


def rope_divisors(scaling: RopeScaling, head_dim: int, base: float) -> torch.Tensor:
    """Per-frequency divisors [D/2] of a rope scaling rule, as fp32.

    ``llama3`` is computed exactly as llama.cpp's converter computes the ``rope_freqs.weight``
    tensor it writes into a Llama 3.1 GGUF (float32 frequencies, Python-float arithmetic, one
    rounding to fp32 at the end), so an HF checkpoint and its GGUF conversion rotate the same;
    HF's ``_compute_llama3_parameters`` is the same rule written as a blend of frequencies.
    """
    half = head_dim // 2
    if scaling.kind == "linear":
        return torch.full((half,), scaling.factor, dtype=torch.float32)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    old = scaling.original_context_length
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    out: list[float] = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(scaling.factor)
        else:
            smooth = ((old / wavelen - scaling.low_freq_factor)
                      / (scaling.high_freq_factor - scaling.low_freq_factor))
            out.append(1 / ((1 - smooth) / scaling.factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX/HF layout: rotate (x[:D/2], x[D/2:]) pairs. x: [T, H, D]; cos/sin: [T, D/2]."""
    return rope(x, cos, sin, interleaved=False)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GGUF llama layout: rotate adjacent (x[2i], x[2i+1]) pairs. x: [T, H, D]."""
    return rope(x, cos, sin, interleaved=True)


def embed_scale(dim: int) -> float:
    """Gemma multiplies embeddings by sqrt(dim), rounded to float32 first (as HF does)."""
    return float(torch.tensor(math.sqrt(dim), dtype=torch.float32))
