"""Typed wrapper over the batch-invariant C++ kernels (``verinfer._kernels``, csrc/).

Every reduction in these kernels has one fixed arithmetic order that depends only on its length
(see ``dot16`` in csrc/verinfer_kernels.cpp), so a row's result never depends on how many rows
share the call, on the thread count or on the dispatched ISA path (avx512 / avx2 / scalar give
identical bits). Inputs are validated here so misuse raises :class:`KernelError`, not a crash.
All tensors are CPU, contiguous; floats are float32. The C++ side releases the GIL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

from verinfer.errors import KernelError

_ext: ModuleType | None
try:
    from verinfer import _kernels as _ext  # built by `pip install --no-build-isolation -e .`

    _IMPORT_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - exercised only without a build
    _ext = None
    _IMPORT_ERROR = str(exc)

ISAS = ("scalar", "avx2", "avx512")
Q8_0_BLOCK = 32  # weights per Q8_0 block: fp16 scale + 32 int8 = 34 bytes


def _lib() -> ModuleType:
    if _ext is None:
        raise KernelError(
            "verinfer._kernels is not built; run "
            f"`pip install --no-build-isolation --no-deps -e .` ({_IMPORT_ERROR})"
        )
    return _ext


def _call(name: str, *args: Any) -> Any:
    """Run one extension function; its own checks (c10::Error) surface as KernelError."""
    try:
        return getattr(_lib(), name)(*args)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise KernelError(f"{name}: {exc}") from exc


def _f32(t: object, name: str, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise KernelError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise KernelError(f"{name} must be a float32 CPU tensor, got {t.dtype} on {t.device}")
    if not t.is_contiguous():
        raise KernelError(f"{name} must be contiguous")
    if ndim is not None and t.dim() != ndim:
        raise KernelError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    return t


def available() -> bool:
    """Whether the compiled extension can be imported."""
    return _ext is not None


def isa() -> str:
    """The ISA path in use: 'avx512', 'avx2' or 'scalar'."""
    return str(_lib().isa())


def supported_isas() -> list[str]:
    """ISA paths this CPU can run (always includes 'scalar')."""
    return [str(s) for s in _lib().supported_isas()]


def set_isa(name: str) -> None:
    """Force an ISA path ('scalar', 'avx2', 'avx512') or go back to the best one ('auto')."""
    if name != "auto" and name not in ISAS:
        raise KernelError(f"unknown ISA path {name!r}; expected 'auto' or one of {ISAS}")
    _call("set_isa", name)


@contextmanager
def forced_isa(name: str) -> Iterator[None]:
    """Run a block on one ISA path, restoring the previous one afterwards."""
    prev = isa()
    set_isa(name)
    try:
        yield
    finally:
        set_isa(prev)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y[M, N] with y[m, n] = dot16(x[m], w[n], K); x: [M, K], w: [N, K] (nn.Linear layout)."""
    _f32(x, "x", 2), _f32(w, "w", 2)
    if x.shape[1] != w.shape[1]:
        raise KernelError(f"linear: K mismatch, x {tuple(x.shape)} vs w {tuple(w.shape)}")
    return _call("linear", x, w)  # type: ignore[no-any-return]


def q8_0_row_bytes(k: int) -> int:
    """Bytes per Q8_0 row of k weights."""
    return k // Q8_0_BLOCK * 34


def _check_q8_0(wq: torch.Tensor, k: int) -> None:
    if not isinstance(wq, torch.Tensor) or wq.dtype != torch.uint8 or wq.device.type != "cpu":
        raise KernelError("wq must be a uint8 CPU tensor of GGUF Q8_0 blocks")
    if not wq.is_contiguous() or wq.dim() != 2:
        raise KernelError(f"wq must be contiguous and 2-D, got shape {tuple(wq.shape)}")
    if k <= 0 or k % Q8_0_BLOCK:
        raise KernelError(f"Q8_0 needs K to be a positive multiple of 32, got {k}")
    if wq.shape[1] != q8_0_row_bytes(k):
        raise KernelError(f"wq rows must be {q8_0_row_bytes(k)} bytes for K={k}, got {wq.shape[1]}")


def linear_q8_0(x: torch.Tensor, wq: torch.Tensor, k: int) -> torch.Tensor:
    """Exactly ``linear(x, dequantize_q8_0(wq, k))``; wq: uint8 [N, K/32*34] GGUF Q8_0 rows."""
    _f32(x, "x", 2)
    _check_q8_0(wq, k)
    if x.shape[1] != k:
        raise KernelError(f"linear_q8_0: x has K={x.shape[1]} but K={k}")
    return _call("linear_q8_0", x, wq, k)  # type: ignore[no-any-return]


def dequantize_q8_0(wq: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 [N, K] with W[n, k] = float(d) * float(q) (== gguf.quants.dequantize)."""
    _check_q8_0(wq, k)
    return _call("dequantize_q8_0", wq, k)  # type: ignore[no-any-return]


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row: r = 1 / sqrtf(dot16(x, x, n) / n + eps); y = (x * r) * w. x: [M, n], w: [n]."""
    _f32(x, "x", 2), _f32(w, "w", 1)
    if w.shape[0] != x.shape[1]:
        raise KernelError(f"rmsnorm: w has {w.shape[0]} elements, rows have {x.shape[1]}")
    return _call("rmsnorm", x, w, float(eps))  # type: ignore[no-any-return]


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Elementwise gelu_tanh(gate) * up (fixed float32 formula, libm tanhf); any equal shapes."""
    _f32(gate, "gate"), _f32(up, "up")
    if gate.shape != up.shape:
        raise KernelError(f"gelu_tanh_mul: shapes differ {tuple(gate.shape)} vs {tuple(up.shape)}")
    return _call("gelu_tanh_mul", gate, up)  # type: ignore[no-any-return]


def attention(
    q: torch.Tensor,
    k_caches: Sequence[torch.Tensor],
    v_caches: Sequence[torch.Tensor],
    seq: torch.Tensor,
    pos: torch.Tensor,
    window: int,
    scale: float,
) -> torch.Tensor:
    """Causal GQA attention of T tokens against per-sequence KV caches; returns [T, H, D].

    q: [T, H, D]; k_caches[i], v_caches[i]: [KV, cap, D] (cache of sequence i); seq, pos: int64
    [T]. Token t attends to positions lo..pos[t] of cache seq[t], lo = max(0, pos[t]-window+1)
    if window > 0 else 0. Each (t, h) result depends only on q[t, h], that cache and (pos,
    window): never on T or on the other tokens of the call.
    """
    _f32(q, "q", 3)
    if len(k_caches) == 0 or len(k_caches) != len(v_caches):
        raise KernelError("attention: k_caches and v_caches must be non-empty and equal-length")
    t, h, d = q.shape
    first = _f32(k_caches[0], "k_caches[0]", 3)
    kv, cap = first.shape[0], first.shape[1]
    if kv == 0 or h % kv:
        raise KernelError(f"attention: {h} query heads not divisible by {kv} KV heads")
    for i, (kc, vc) in enumerate(zip(k_caches, v_caches, strict=True)):
        _f32(kc, f"k_caches[{i}]", 3), _f32(vc, f"v_caches[{i}]", 3)
        if tuple(kc.shape) != (kv, cap, d) or vc.shape != kc.shape:
            raise KernelError(f"attention: cache {i} must be [{kv}, {cap}, {d}]")
    for name, ix in (("seq", seq), ("pos", pos)):
        if not isinstance(ix, torch.Tensor) or ix.dtype != torch.int64 or ix.device.type != "cpu":
            raise KernelError(f"attention: {name} must be an int64 CPU tensor")
        if ix.dim() != 1 or ix.shape[0] != t or not ix.is_contiguous():
            raise KernelError(f"attention: {name} must be contiguous [T={t}]")
    if t and (int(seq.min()) < 0 or int(seq.max()) >= len(k_caches)):
        raise KernelError("attention: seq index out of range of the cache lists")
    if t and (int(pos.min()) < 0 or int(pos.max()) >= cap):
        raise KernelError(f"attention: positions must be in [0, {cap})")
    return _call(  # type: ignore[no-any-return]
        "attention", q, list(k_caches), list(v_caches), seq, pos, int(window), float(scale)
    )


def argmax(x: torch.Tensor) -> torch.Tensor:
    """int64 [M]: first index of each row's maximum; x: [M, N] float32, N > 0."""
    _f32(x, "x", 2)
    if x.shape[1] == 0:
        raise KernelError("argmax: rows are empty")
    return _call("argmax", x)  # type: ignore[no-any-return]
