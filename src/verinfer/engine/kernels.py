"""Typed wrapper over the batch-invariant C++ kernels (``verinfer._kernels``, csrc/).

Every reduction in these kernels has one fixed arithmetic order that depends only on its length
(see ``dot16`` in csrc/verinfer_kernels.cpp), so a row's result never depends on how many rows
share the call, on the thread count or on the dispatched ISA path (avx512 / avx2 / scalar give
identical bits). All tensors are CPU and contiguous; floats are float32; nothing is copied or
converted implicitly. The C++ side validates every input (dtype, contiguity, shapes, index
ranges) before touching memory, and this wrapper turns its errors into :class:`KernelError`;
validation lives there, not here, because these functions run ~150 times per decoded token and
Python-side checks would cost more than the small kernels. The C++ side releases the GIL.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

from verinfer.errors import KernelError

_ext: ModuleType | None
_IMPORT_ERROR: str | None
try:  # built by `pip install --no-build-isolation --no-deps -e .`
    _ext = importlib.import_module("verinfer._kernels")
    _IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised only without a build
    _ext = None
    _IMPORT_ERROR = str(exc)

ISAS = ("scalar", "avx2", "avx512")
Q8_0_BLOCK = 32  # weights per Q8_0 block: fp16 scale + 32 int8 = 34 bytes
PANEL = 32  # output columns per packed panel (pack_f32 / pack_q8_0)
Q8_0_PANEL_BLOCK_BYTES = 2 * PANEL + Q8_0_BLOCK * PANEL  # 32 fp16 scales + 32 x 32 int8 = 1088


ISA_ENV = "VERINFER_KERNEL_ISA"  # scalar | avx2 | avx512 | auto (unset or empty = auto)
_env_applied = False
_env_lock = threading.Lock()


def _lib() -> ModuleType:
    if _ext is None:
        raise KernelError(
            "verinfer._kernels is not built; run "
            f"`pip install --no-build-isolation --no-deps -e .` ({_IMPORT_ERROR})"
        )
    if not _env_applied:
        _apply_isa_env(_ext)
    return _ext


def _apply_isa_env(ext: ModuleType) -> None:
    """Dispatch to the ISA path named by VERINFER_KERNEL_ISA, once, before the first kernel call.

    The bits are the same on every path (that is the point), so this is for auditing that claim
    on a real deployment and for timing a path; a path this CPU lacks is refused, never silently
    replaced by another one. Stays unapplied on error, so every later call raises it again.
    """
    global _env_applied
    with _env_lock:
        if _env_applied:
            return
        want = os.environ.get(ISA_ENV, "").strip().lower() or "auto"
        if want != "auto":
            if want not in ISAS:
                raise KernelError(f"{ISA_ENV}={want!r} is not an ISA path: use one of "
                                  f"{', '.join(ISAS)} or auto")
            have = [str(s) for s in ext.supported_isas()]
            if want not in have:
                raise KernelError(f"{ISA_ENV}={want}: this CPU cannot run the {want} path "
                                  f"(it supports {', '.join(have)})")
            ext.set_isa(want)
        _env_applied = True


def _call(name: str, *args: Any) -> Any:
    """Run one extension function; its input checks (c10::Error) surface as KernelError."""
    fn = getattr(_lib(), name)
    try:
        return fn(*args)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise KernelError(f"{name}: {exc}") from exc


def _tensor(name: str, *args: Any) -> torch.Tensor:
    out = _call(name, *args)
    if not isinstance(out, torch.Tensor):  # pragma: no cover - would be an extension bug
        raise KernelError(f"{name}: extension returned {type(out).__name__}")
    return out


def available() -> bool:
    """Whether the compiled extension can be imported."""
    return _ext is not None


def isa() -> str:
    """The ISA path in use: 'avx512', 'avx2' or 'scalar' (VERINFER_KERNEL_ISA, else the best)."""
    return str(_call("isa"))


def supported_isas() -> list[str]:
    """ISA paths this CPU can run, slowest first (always includes 'scalar')."""
    return [str(s) for s in _call("supported_isas")]


def set_isa(name: str) -> None:
    """Force an ISA path ('scalar', 'avx2', 'avx512') or go back to the best one ('auto').
    Raises KernelError for an unknown name or a path this CPU cannot run. Process-wide."""
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
    return _tensor("linear", x, w)


def q8_0_row_bytes(k: int) -> int:
    """Bytes per GGUF Q8_0 row of k weights (k % 32 == 0)."""
    return k // Q8_0_BLOCK * 34


def linear_q8_0(x: torch.Tensor, wq: torch.Tensor, k: int) -> torch.Tensor:
    """Exactly ``linear(x, dequantize_q8_0(wq, k))`` without materializing the fp32 weights.

    x: [M, K] float32; wq: uint8 [N, K/32*34] GGUF Q8_0 rows (per 32 weights an fp16 scale d,
    then 32 int8 q; weight = float(d) * float(q)); k: K, a positive multiple of 32.
    """
    return _tensor("linear_q8_0", x, wq, int(k))


def dequantize_q8_0(wq: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 [N, K] with W[n, k] = float(d) * float(q), bit-equal to gguf.quants.dequantize."""
    return _tensor("dequantize_q8_0", wq, int(k))


# ---- packed outer-product family ------------------------------------------------------------
# A second fixed order, chosen because it is easy to make fast at large M: every output has ONE
# sequential accumulator, y[m, n] = fmaf(x[m, k], W[n, k], acc) for k = 0..K-1 in increasing
# order from acc = 0.0f. SIMD lanes run over n (never over k) and nothing is split over k, so
# the result depends only on x[m], W[n] and K: not on M, the row's position, tiling, threads or
# the ISA path. It is NOT the same order as ``linear`` (dot16): the two families give different
# bits, and a model must use one family for decode and replay alike.


def pack_f32(w: torch.Tensor) -> torch.Tensor:
    """Repack fp32 weights [N, K] (nn.Linear layout) once, at model load, into panels.

    Layout: float32 [P, K, 32] with P = ceil(N / 32) and ``wp[p, k, i] = w[32 p + i, k]``;
    rows 32 p + i >= N are zero (computed, never returned). The microkernel streams each panel
    contiguously. Pass N again to :func:`linear_packed`.
    """
    return _tensor("pack_f32", w)


def linear_packed(x: torch.Tensor, wp: torch.Tensor, n: int) -> torch.Tensor:
    """y [M, n]: y[m, j] = sequential fmaf chain over k of x[m, k] * w[j, k] (see above).

    x: [M, K] float32; wp: ``pack_f32(w)`` of w [n, K]; n: the original row count of w.
    """
    return _tensor("linear_packed", x, wp, int(n))


def pack_q8_0(wq: torch.Tensor, k: int) -> torch.Tensor:
    """Repack GGUF Q8_0 rows (uint8 [N, K/32*34]) once into panels for
    :func:`linear_q8_0_packed`.

    Layout: uint8 [P, K/32, 1088], P = ceil(N / 32). Block [p, b] covers rows 32 p .. 32 p + 31
    and k = 32 b .. 32 b + 31: first the 32 rows' fp16 scales d (64 bytes, row order), then
    32 x 32 int8 q, k-major (byte 64 + 32 kk + i is row 32 p + i, k = 32 b + kk). Padding rows
    have d = 0, q = 0. Values are unchanged: weight = float(d) * float(q), one exact multiply.
    """
    return _tensor("pack_q8_0", wq, int(k))


def linear_q8_0_packed(x: torch.Tensor, wqp: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Exactly ``linear_packed(x, pack_f32(dequantize_q8_0(wq, k)), n)`` bit for bit, with
    wqp = ``pack_q8_0(wq, k)``. M <= 4 streams int8 + fp16 scales (memory-bound LM head);
    larger M dequantizes panels into fp32 scratch and runs the fp32 microkernel."""
    return _tensor("linear_q8_0_packed", x, wqp, int(n), int(k))


def q4_1_row_bytes(k: int) -> int:
    """Bytes of one GGUF Q4_1 row of k weights (32-weight blocks: fp16 d, fp16 m, 16 bytes)."""
    return k // 32 * 20


def pack_q4_1(wq: torch.Tensor, k: int) -> torch.Tensor:
    """Repack GGUF Q4_1 rows (uint8 [N, K/32*20]) once into panels for
    :func:`linear_q4_1_packed`.

    Layout: uint8 [P, K/32, 640], P = ceil(N / 32). Block [p, b] covers rows 32 p .. 32 p + 31
    and k = 32 b .. 32 b + 31: the 32 rows' fp16 scales d (64 bytes), their fp16 minima m (64
    bytes), then 16 x 32 bytes, byte 128 + 32 kp + i holding row 32 p + i's q at k = 32 b + kp
    (low nibble) and k = 32 b + kp + 16 (high nibble) -- GGUF's nibble order. Padding rows are
    zero. Values are unchanged: weight = float(d) * q + float(m) with one rounding, exactly
    ``gguf.quants.dequantize`` (the product is exact), computed in the kernel as one fmaf.
    """
    return _tensor("pack_q4_1", wq, int(k))


def linear_q4_1_packed(x: torch.Tensor, wqp: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Exactly ``linear_packed(x, pack_f32(dequantized Q4_1 weights), n)`` bit for bit, with
    wqp = ``pack_q4_1(wq, k)``. M <= 4 streams nibbles + fp16 scales/minima (0.625 bytes per
    weight instead of 4: decode is memory-bound); larger M dequantizes panels into fp32 scratch
    and runs the fp32 microkernel."""
    return _tensor("linear_q4_1_packed", x, wqp, int(n), int(k))


# GGUF block types the quantized panels read: type name -> (weights per block, bytes per block).
QUANT_BLOCKS = {"Q8_0": (32, 34), "Q5_0": (32, 22), "Q4_1": (32, 20), "Q4_K": (256, 144),
                "Q6_K": (256, 210)}


# Q5_0's two panel forms, by name (plain "Q5_0" packs into the one this CPU decodes fastest:
# csrc q5_0_panels, overridable with VERINFER_Q5_PANELS=5bit|int8). Both decode to the same bits.
Q5_0_PANEL_FORMS = ("Q5_0:5bit", "Q5_0:int8")


def panel_layout(qtype: str | None) -> str:
    """The packed layout (csrc PanelFmt: q8, q5_0, q4_1, q4_k, q6_k) a matrix of GGUF type
    ``qtype`` packs into; None: fp32 panels ("f32"). Types of one layout can share a kernel call.
    Every layout reads about the file's bytes, except Q5_0 packed as int8 panels ("q8") on CPUs
    without AVX-512, where that is faster."""
    return "f32" if qtype is None else str(_call("panel_format", qtype))


def set_spin_pool(on: bool) -> None:
    """Decode-size kernels on the spinning thread pool (default) or on OpenMP's threads with
    small matrices on the calling thread (the old scheduling, kept to measure against). Only
    which thread computes an output changes, never a bit. Process-wide."""
    _call("set_spin_pool", bool(on))


def quant_row_bytes(qtype: str, k: int) -> int:
    """Bytes of one GGUF row of k weights of block type ``qtype`` (a key of QUANT_BLOCKS)."""
    try:
        weights, nbytes = QUANT_BLOCKS[qtype]
    except KeyError:
        raise KernelError(f"unsupported GGUF block type {qtype!r} "
                          f"({', '.join(QUANT_BLOCKS)})") from None
    if k <= 0 or k % weights:
        raise KernelError(f"{qtype} rows need k % {weights} == 0, got k={k}")
    return k // weights * nbytes


def pack_quant(wq: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """Repack GGUF rows (uint8 [N, quant_row_bytes(qtype, k)], the file's bytes) once, at model
    load, into 32-row panels for :func:`linear_quant_packed`.

    Layout: uint8 [P, K/U, B], P = ceil(N / 32); each unit of U k holds the panel's 32 rows,
    k-major in blocks of 32 k, with the per-row constants the format needs first. U = 32 for
    Q8_0 (B = 1088: fp16 d, int8 q), Q4_1 (640: fp16 d and m, nibbles) and Q5_0 (704: fp16 d,
    the 5th bits as one 32-bit word per k, nibbles: the file's 22 bytes per 32 weights);
    U = 256 for the K-quants, whose super-block header keeps the file's fp16 d (and dmin) and
    the sub-block scales as bytes, multiplied out in the kernel: Q4_K (4736: 0.58 bytes/weight)
    and Q6_K (8768: int8 q - 32, 1.07 bytes/weight). csrc/verinfer_kernels.cpp (PanelFmt) has
    the details. Every weight decodes to exactly ``gguf.quants.dequantize``'s value.
    """
    return _tensor("pack_quant", wq, qtype, int(k))


def linear_quant_packed(x: torch.Tensor, wqp: torch.Tensor, qtype: str, n: int,
                        k: int) -> torch.Tensor:
    """Exactly ``linear_packed(x, pack_f32(gguf.quants.dequantize(wq)), n)`` bit for bit, with
    wqp = ``pack_quant(wq, qtype, k)``. M <= 4 (decode) decodes each block on the fly into the
    FMA chain, reading the quantized bytes only; larger M (prefill, replay) dequantizes one
    panel group at a time into fp32 scratch and runs the fp32 microkernel."""
    return _tensor("linear_quant_packed", x, wqp, qtype, int(n), int(k))


def linear_quant_packed_multi(x: torch.Tensor, wqps: Sequence[torch.Tensor],
                              qtypes: Sequence[str], ns: Sequence[int], k: int) -> torch.Tensor:
    """Decode (x: M <= 4 rows) over matrices of one K and any block types in one call:
    ``torch.cat([linear_quant_packed(x, w, q, n, k) for ...], dim=1)`` bit for bit (each part
    runs its own GEMV on its own panels), with one crossing into C++ and one parallel region —
    for groups such as Gemma 3's q, k (Q5_0) and v (Q8_0), whose panel layouts differ."""
    return _tensor("linear_quant_packed_multi", x, list(wqps), [str(q) for q in qtypes],
                   [int(n) for n in ns], int(k))


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row of x [M, n]: r = 1 / sqrtf(dot16(x, x, n) / n + eps); y = (x * r) * w; w: [n].

    Gemma's (1 + w) weight convention is the caller's business: pass the effective weight."""
    return _tensor("rmsnorm", x, w, float(eps))


def rmsnorm_rope_half(x: torch.Tensor, w: torch.Tensor, eps: float, cos: torch.Tensor,
                      sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> per head ``rope_half(rmsnorm(x[t, h], w, eps), cos[t], sin[t])`` in one
    pass, bit-equal to the two steps (:func:`rmsnorm`, then models/common.py ``rope_half``'s
    separately rounded products and sums); cos, sin: [T, D/2]."""
    return _tensor("rmsnorm_rope_half", x, w, float(eps), cos, sin)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Elementwise gelu_tanh(gate) * up in a fixed float32 formula (libm tanhf); equal shapes."""
    return _tensor("gelu_tanh_mul", gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Elementwise (g / (1 + expf(-g))) * up in float32, in that order (Llama MLP); equal shapes."""
    return _tensor("silu_mul", gate, up)


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

    q: [T, H, D]; k_caches[i], v_caches[i]: [KV, cap_i, D] (cache of sequence i; capacities
    may differ per sequence; H % KV == 0);
    seq, pos: int64 [T]. Token t attends to positions lo..pos[t] of cache seq[t], where
    lo = max(0, pos[t] - window + 1) if window > 0 else 0; query head h uses KV head
    h // (H // KV). Each (t, h) result depends only on q[t, h], that cache and (pos, window):
    never on T or on the other tokens of the call. The caller writes the new keys/values into
    the caches before calling.
    """
    return _tensor(
        "attention", q, list(k_caches), list(v_caches), seq, pos, int(window), float(scale)
    )


def argmax(x: torch.Tensor) -> torch.Tensor:
    """int64 [M]: first index of each row's maximum; x: [M, N] float32, N > 0."""
    return _tensor("argmax", x)


def sample_rows(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                us: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the token drawn from each row of ``logits`` [R, V] (float32) with u = ``us[r]``
    (float64 [R], in [0, 1)), by sampling rule vi-sample-v2 (csrc/verinfer_sampling.cpp; the
    executable reference is ``sampling.sample_reference``). Rows run in parallel."""
    return _tensor("sample_rows", logits, float(temperature), int(top_k), float(top_p), us)


def exp64(x: torch.Tensor) -> torch.Tensor:
    """The sampler's exp of float64 ``x`` <= 0 (IEEE +, -, * only; 0 below -700)."""
    return _tensor("exp64", x)
