"""Q4_1 in the packed fixed-order kernels (SmolLM2's weight format).

A Q4_1 weight is GGUF's ``float(d) * q + float(m)`` (``gguf.quants.dequantize``: the product is
exact, one rounding for the add); the streaming kernel computes it as one fmaf of the same
operands, so ``linear_q4_1_packed`` must give exactly the bits of the fp32 packed GEMM on the
dequantized matrix -- for every row count, ISA path and thread count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from verinfer.engine import kernels as vk
from verinfer.engine.ops import Matrix, make_ops
from verinfer.errors import KernelError

ISAS = vk.supported_isas()
ROWS = [1, 2, 3, 4, 5, 9, 17, 64, 333]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g))


def q4_1(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF Q4_1 bytes of a random [n, k] matrix, and gguf's own fp32 dequantization."""
    w = rand(n, k, seed=seed).numpy()
    raw = quantize(w, GGMLQuantizationType.Q4_1)
    deq = dequantize(raw, GGMLQuantizationType.Q4_1).reshape(n, k)
    return torch.from_numpy(np.ascontiguousarray(raw)), torch.from_numpy(deq.astype(np.float32))


@pytest.fixture(autouse=True)
def _restore_state() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    vk.set_isa("auto")
    torch.set_num_threads(threads)


def test_dequantized_values_are_exact_fp32() -> None:
    """d * q is exact in fp32, so GGUF's value is one rounding of d*q + m: recomputing it in
    float64 and rounding once gives the same bits."""
    raw, deq = q4_1(40, 64, seed=1)
    blocks = raw.view(40, 2, 20).numpy()
    d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float64)
    m = blocks[:, :, 2:4].copy().view(np.float16).astype(np.float64)
    qs = blocks[:, :, 4:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)  # GGUF nibble order
    exact = (d * q + m).astype(np.float32).reshape(40, 64)
    assert np.array_equal(exact.view(np.int32), deq.numpy().view(np.int32))


def test_pack_q4_1_layout() -> None:
    n, k = 40, 64
    raw, _ = q4_1(n, k)
    p = vk.pack_q4_1(raw, k)
    assert p.shape == (2, 2, 640) and p.dtype == torch.uint8
    rows = raw.view(n, 2, 20)
    for r in (0, 31, 32, 39):
        for b in range(2):
            blk, i = p[r // 32, b], r % 32
            assert torch.equal(blk[2 * i:2 * i + 2], rows[r, b, :2])
            assert torch.equal(blk[64 + 2 * i:64 + 2 * i + 2], rows[r, b, 2:4])
            # nibble byte of (kp, row i) at (kp // 2) * 64 + 4 * (i % 16) + 2 * (kp % 2) + i // 16
            at = [128 + (kp // 2) * 64 + 4 * (i % 16) + 2 * (kp % 2) + i // 16 for kp in range(16)]
            assert torch.equal(blk[at], rows[r, b, 4:])
    assert not p[1, :, 16:64].any()  # padding rows 40..63: d = m = q = 0


@pytest.mark.parametrize("m,n,k", [(1, 37, 64), (2, 70, 96), (3, 33, 32), (4, 20, 640),
                                   (5, 19, 96), (70, 40, 2048), (333, 97, 128)])
def test_linear_q4_1_packed_equals_linear_packed_on_dequantized(m: int, n: int, k: int) -> None:
    raw, deq = q4_1(n, k, seed=m)
    wqp, wp = vk.pack_q4_1(raw, k), vk.pack_f32(deq)
    x = rand(m, k, seed=27)
    for isa in ISAS:
        with vk.forced_isa(isa):
            assert same(vk.linear_q4_1_packed(x, wqp, n, k), vk.linear_packed(x, wp, n)), isa


def test_linear_q4_1_packed_isa_rows_threads() -> None:
    k, n = 576, 70
    raw, _ = q4_1(n, k, seed=3)
    wqp = vk.pack_q4_1(raw, k)
    x = rand(17, k, seed=28)
    results = {}
    for isa in ISAS:
        with vk.forced_isa(isa):
            results[isa] = vk.linear_q4_1_packed(x, wqp, n, k)
    ref = results["scalar"]
    assert all(same(r, ref) for r in results.values()), sorted(results)
    for m in ROWS:
        xm = rand(m, k, seed=m)
        y = vk.linear_q4_1_packed(xm, wqp, n, k)
        for i in range(m):
            assert same(y[i:i + 1], vk.linear_q4_1_packed(xm[i:i + 1], wqp, n, k)), (m, i)
    torch.set_num_threads(1)
    assert same(vk.linear_q4_1_packed(x, wqp, n, k), ref)


def test_invariant_ops_use_the_q4_1_blocks() -> None:
    raw, deq = q4_1(45, 96, seed=5)
    ops = make_ops("invariant")
    w = ops.prepare(Matrix(deq, q4_1=raw))
    assert w.packed is not None and w.packed.shape == (2, 3, 640)
    x = rand(3, 96, seed=6)
    assert same(ops.linear(x, w), vk.linear_packed(x, vk.pack_f32(deq), 45))


def test_q4_1_bad_inputs_raise_kernel_error() -> None:
    raw, deq = q4_1(40, 64)
    wqp = vk.pack_q4_1(raw, 64)
    x = torch.randn(3, 64)
    cases: list[Callable[[], object]] = [
        lambda: vk.pack_q4_1(raw, 32),  # row length does not match K
        lambda: vk.pack_q4_1(raw, 48),  # K % 32
        lambda: vk.pack_q4_1(raw.view(torch.int8), 64),
        lambda: vk.pack_q4_1(raw[:, :30].contiguous(), 64),
        lambda: vk.pack_q4_1(raw[:0], 64),
        lambda: vk.linear_q4_1_packed(x, wqp, 40, 32),
        lambda: vk.linear_q4_1_packed(x, wqp, 70, 64),  # n does not match the panels
        lambda: vk.linear_q4_1_packed(x, raw, 40, 64),  # not packed
        lambda: vk.linear_q4_1_packed(x, vk.pack_f32(deq), 40, 64),  # fp32 panels
        lambda: vk.linear_q4_1_packed(x.double(), wqp, 40, 64),
        lambda: vk.linear_q4_1_packed(x[:, :32].contiguous(), wqp, 40, 64),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(KernelError):
            case()
            pytest.fail(f"case {i} did not raise")
