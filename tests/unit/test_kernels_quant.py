"""Quantized panels (Q8_0, Q5_0, Q4_1, Q4_K, Q6_K): the kernels decode GGUF blocks on the fly and
must give the SAME BITS as the fp32 packed kernel on gguf's own dequantization of those blocks —
for every format, row count (decode M <= 4 and the large-M scratch path), ISA path and thread
count.

The blocks are random bytes with hand-picked fp16 scales (normal, subnormal, -0.0, +-65504, zero),
so every bit pattern a file could hold is exercised, not just what a quantizer would produce
(gguf-py cannot quantize the K-quants anyway). "Identical" means equal int32 views, never allclose.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from verinfer.engine import kernels as vk
from verinfer.engine.ops import InvariantOps, Matrix, TorchOps
from verinfer.errors import KernelError

ISAS = vk.supported_isas()
FORMATS = list(vk.QUANT_BLOCKS)
# byte offsets of the fp16 fields inside one GGUF block (scales, minima): the rest is random
HALF_FIELDS = {"Q8_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}
SHAPES = [(37, 256), (70, 512)]  # N not a multiple of 32 (padding rows), K = 1 and 2 super-blocks
ROWS = [1, 2, 3, 4, 5, 17]  # 1..4: the fused decode path; 5, 17: dequantize-to-scratch GEMM


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def extreme_halves(rng: np.random.Generator, n: int) -> np.ndarray:
    """fp16 bit patterns: ordinary scales over 29 binades, subnormals of either sign, -0.0,
    +-65504 (the largest finite) and zero; never inf or NaN (no file holds them)."""
    kind = rng.integers(0, 6, n)
    ordinary = (rng.uniform(-1, 1, n) * 2.0 ** rng.integers(-14, 15, n)).astype(np.float16)
    out = ordinary.view(np.uint16).copy()
    sign = rng.integers(0, 2, n).astype(np.uint16) << 15
    out[kind == 1] = (rng.integers(1, 1024, n).astype(np.uint16) | sign)[kind == 1]  # subnormal
    out[kind == 2] = 0x8000  # -0.0
    out[kind == 3] = (np.uint16(0x7BFF) | sign)[kind == 3]  # +-65504
    out[kind == 4] = 0
    return out


def random_rows(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    per_block, nbytes = vk.QUANT_BLOCKS[qtype]
    raw = rng.integers(0, 256, (n, k // per_block, nbytes), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        halves = extreme_halves(rng, n * (k // per_block))
        raw[:, :, off:off + 2] = halves.view(np.uint8).reshape(n, k // per_block, 2)
    return raw.reshape(n, -1)


def gguf_dense(qtype: str, raw: np.ndarray) -> torch.Tensor:
    deq = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(deq))


def rand_x(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))


@pytest.fixture(autouse=True)
def _restore_state() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    vk.set_isa("auto")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=[(q, s) for q in FORMATS for s in SHAPES],
                ids=lambda p: f"{p[0]}-{p[1][0]}x{p[1][1]}")
def case(request: pytest.FixtureRequest) -> tuple[str, int, int, torch.Tensor, torch.Tensor]:
    """(qtype, N, K, packed quantized panels, fp32 panels of gguf's dequantization)."""
    qtype, (n, k) = request.param
    raw = random_rows(qtype, n, k, seed=n + k)
    dense = gguf_dense(qtype, raw)
    assert torch.isfinite(dense).all()
    assert (dense == 0).any() and (bits(dense) == bits(torch.tensor(-0.0))).any()
    return qtype, n, k, vk.pack_quant(torch.from_numpy(raw), qtype, k), vk.pack_f32(dense)


def test_bits_equal_the_fp32_kernel_on_gguf_values_on_every_isa(case: tuple) -> None:
    qtype, n, k, wqp, wp = case
    for m in ROWS:
        x = rand_x(m, k, seed=m)
        ref = vk.linear_packed(x, wp, n)
        for isa in ISAS:
            with vk.forced_isa(isa):
                got = vk.linear_quant_packed(x, wqp, qtype, n, k)
            assert same(got, ref), (qtype, m, isa)


def test_row_invariance(case: tuple) -> None:
    """Each row of a 9-row call (the GEMM path) equals that row alone (the decode path) and
    inside a 3-row call."""
    qtype, n, k, wqp, _ = case
    x = rand_x(9, k, seed=42)
    full = vk.linear_quant_packed(x, wqp, qtype, n, k)
    for i in range(9):
        assert same(full[i:i + 1], vk.linear_quant_packed(x[i:i + 1], wqp, qtype, n, k)), i
    assert same(full[3:6], vk.linear_quant_packed(x[3:6].contiguous(), wqp, qtype, n, k))


@pytest.mark.parametrize("qtype", FORMATS)
def test_thread_invariance(qtype: str) -> None:
    # over 1 MiB packed, so that the decode path (M <= 4) also splits its panels over threads
    # (smaller matrices run on the calling thread)
    n, k = 1100, 2048
    raw = torch.from_numpy(random_rows(qtype, n, k, seed=7))
    wqp = vk.pack_quant(raw, qtype, k)
    assert wqp.numel() > 1 << 20
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out[threads] = [vk.linear_quant_packed(rand_x(m, k, seed=m), wqp, qtype, n, k)
                        for m in (1, 4, 40)]
    assert all(same(a, b) for a, b in zip(out[1], out[2], strict=True))


def test_legacy_q8_0_and_q4_1_entry_points_are_the_same_kernels() -> None:
    for qtype, pack, linear in (("Q8_0", vk.pack_q8_0, vk.linear_q8_0_packed),
                                ("Q4_1", vk.pack_q4_1, vk.linear_q4_1_packed)):
        raw = torch.from_numpy(random_rows(qtype, 40, 256, seed=3))
        wqp = pack(raw, 256)
        assert torch.equal(wqp, vk.pack_quant(raw, qtype, 256))
        x = rand_x(2, 256, seed=1)
        assert same(linear(x, wqp, 40, 256), vk.linear_quant_packed(x, wqp, qtype, 40, 256))


@pytest.mark.parametrize("qtype", FORMATS)
def test_matrix_keeps_blocks_and_ops_agree(qtype: str) -> None:
    """Through the engine's Ops: a quantized Matrix packs from its blocks (no fp32 copy), its
    dense()/rows() are gguf's values, and the invariant result equals the fp32 Matrix's."""
    n, k = 45, 256
    raw = random_rows(qtype, n, k, seed=11)
    ref = gguf_dense(qtype, raw)
    ops = InvariantOps()
    wq = ops.prepare(Matrix(None, qtype=qtype, blocks=torch.from_numpy(raw)))
    assert wq.f32 is None and wq.packed is not None and wq.packed.dtype == torch.uint8
    assert wq.shape == (n, k)
    x = rand_x(3, k, seed=5)
    assert same(ops.linear(x, wq), ops.linear(x, ops.prepare(Matrix(ref.clone()))))
    ids = torch.tensor([44, 0, 7])
    assert same(wq.rows(ids), ref.index_select(0, ids))
    assert same(wq.dense(), ref)
    torch.testing.assert_close(TorchOps().linear(x, wq), x @ ref.T, rtol=1e-4, atol=1e-3)


def test_bad_inputs_are_kernel_errors() -> None:
    raw = torch.from_numpy(random_rows("Q4_K", 8, 256, seed=1))
    with pytest.raises(KernelError, match="unsupported GGUF block type 'Q3_K'"):
        vk.pack_quant(raw, "Q3_K", 256)
    with pytest.raises(KernelError, match="Q4_K needs K % 256 == 0"):
        vk.pack_quant(raw[:, :72].contiguous(), "Q4_K", 128)
    with pytest.raises(KernelError, match="rows must be 576 bytes for Q4_K with K=1024, got 144"):
        vk.pack_quant(raw, "Q4_K", 1024)
    wqp = vk.pack_quant(raw, "Q4_K", 256)
    with pytest.raises(KernelError, match="from pack_quant"):
        vk.linear_quant_packed(rand_x(1, 256, 0), wqp, "Q6_K", 8, 256)  # other panel format
    with pytest.raises(KernelError, match="does not match"):
        vk.linear_quant_packed(rand_x(1, 256, 0), wqp, "Q4_K", 33, 256)
    with pytest.raises(KernelError, match="x has K=128"):
        vk.linear_quant_packed(rand_x(1, 128, 0), wqp, "Q4_K", 8, 256)
    assert vk.quant_row_bytes("Q6_K", 512) == 420
    with pytest.raises(KernelError, match="k % 32"):
        vk.quant_row_bytes("Q5_0", 48)
