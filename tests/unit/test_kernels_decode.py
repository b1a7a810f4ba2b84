"""The decode step's scheduling and fusions change no bit.

* The spin pool (csrc/verinfer_pool.h) splits a decode GEMV's panels between threads: every
  output must equal the one-thread result, with the pool on or off, at any thread count, when
  several Python threads call at once (a busy pool runs the caller's work elsewhere) and in a
  forked child (which inherits the pool's state but not its threads).
* ``Ops.group``/``linear_group`` runs q/k/v (Gemma 3: all Q5_0 in half the layers) and
  gate/up in one call: each output is still its own fmaf chain, so the bits are the separate
  calls' bits.
* ``rmsnorm_rope_half`` is ``rope_half(rmsnorm(x))`` in one pass, with the same roundings.

"Identical" means equal int32 views, never allclose.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest
import torch
from test_kernels_quant import rand_x, random_rows  # the random-block generator

from verinfer.engine import kernels as vk
from verinfer.engine.engine import Engine
from verinfer.engine.loader import embedded_model_path, load_model
from verinfer.engine.models.common import rope_half
from verinfer.engine.ops import InvariantOps, Matrix, TorchOps
from verinfer.errors import KernelError
from verinfer.protocol.sampling_params import SamplingParams

ISAS = vk.supported_isas()
# (qtype, N, K): over the pool's one-thread bound (64 KiB of panels), N not a multiple of 32
BIG = [("Q8_0", 300, 512), ("Q5_0", 290, 512), ("Q4_1", 400, 768), ("Q4_K", 333, 768),
       ("Q6_K", 260, 512)]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.fixture(autouse=True)
def _restore_state() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    vk.set_spin_pool(True)
    vk.set_isa("auto")
    torch.set_num_threads(threads)


def quant(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    return vk.pack_quant(torch.from_numpy(random_rows(qtype, n, k, seed)), qtype, k)


def one_thread(fn):  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(2)


@pytest.mark.parametrize("qtype,n,k", BIG)
def test_spin_pool_gemv_equals_one_thread(qtype: str, n: int, k: int) -> None:
    wp = quant(qtype, n, k, seed=n)
    for m in (1, 2, 4):
        x = rand_x(m, k, seed=m)
        ref = one_thread(lambda x=x: vk.linear_quant_packed(x, wp, qtype, n, k))
        for threads in (2, 3):
            torch.set_num_threads(threads)
            for pool in (True, False):
                vk.set_spin_pool(pool)
                for _ in range(3):  # repeated regions: the workers are spinning by now
                    assert same(vk.linear_quant_packed(x, wp, qtype, n, k), ref), (threads, pool)


def test_spin_pool_fp32_gemv_and_isa_paths() -> None:
    w = torch.randn(200, 640)
    wp = vk.pack_f32(w)
    x = rand_x(1, 640, seed=3)
    ref = one_thread(lambda: vk.linear_packed(x, wp, 200))
    for isa in ISAS:
        with vk.forced_isa(isa):
            assert same(vk.linear_packed(x, wp, 200), ref), isa


def test_concurrent_callers_share_the_pool_safely() -> None:
    qtype, n, k = "Q5_0", 1000, 640
    wp = quant(qtype, n, k, seed=1)
    xs = [rand_x(1, k, seed=s) for s in range(4)]
    refs = [one_thread(lambda x=x: vk.linear_quant_packed(x, wp, qtype, n, k)) for x in xs]
    torch.set_num_threads(2)
    bad: list[int] = []

    def worker(i: int) -> None:
        for _ in range(40):
            if not same(vk.linear_quant_packed(xs[i], wp, qtype, n, k), refs[i]):
                bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and bad == []


def test_threads_with_different_thread_counts_alternate() -> None:
    """torch's thread count is per calling thread: an engine thread at 2 and the main thread at
    3 alternate between their own pools, with the one-thread bits."""
    qtype, n, k = "Q4_K", 333, 768
    wp = quant(qtype, n, k, seed=9)
    x = rand_x(1, k, seed=9)
    ref = one_thread(lambda: vk.linear_quant_packed(x, wp, qtype, n, k))
    outs: list[torch.Tensor] = []

    def other() -> None:
        torch.set_num_threads(2)
        outs.extend(vk.linear_quant_packed(x, wp, qtype, n, k) for _ in range(20))

    torch.set_num_threads(3)
    t = threading.Thread(target=other)
    t.start()
    outs.extend(vk.linear_quant_packed(x, wp, qtype, n, k) for _ in range(20))
    t.join(timeout=120)
    assert not t.is_alive() and len(outs) == 40 and all(same(o, ref) for o in outs)


def _child(conn, x: torch.Tensor, wp: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(2)
    conn.send(vk.linear_quant_packed(x, wp, "Q8_0", 300, 512).numpy().tobytes())


def test_forked_child_runs_the_pool_without_the_parents_threads() -> None:
    wp = quant("Q8_0", 300, 512, seed=5)
    x = rand_x(1, 512, seed=5)
    torch.set_num_threads(2)
    ref = vk.linear_quant_packed(x, wp, "Q8_0", 300, 512)  # the parent's pool is running
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, x, wp))
    proc.start()
    assert parent.poll(60), "the forked child hung in the kernel"
    assert parent.recv() == ref.numpy().tobytes()
    proc.join(timeout=30)


def _matrix(ops: InvariantOps, qtype: str | None, n: int, k: int, seed: int) -> Matrix:
    if qtype is None:
        return ops.prepare(Matrix(torch.randn(n, k, generator=torch.Generator().manual_seed(seed))))
    blocks = torch.from_numpy(random_rows(qtype, n, k, seed))
    return ops.prepare(Matrix(None, qtype=qtype, blocks=blocks))


@pytest.mark.parametrize("qtypes,ns,k,fused", [
    (("Q5_0", "Q5_0", "Q5_0"), (1024, 256, 256), 640, True),  # Gemma 3 270M's q, k, v
    # ... where v is Q8_0: on AVX-512 CPUs 5-bit and int8 panels are two layouts (a mixed group);
    # elsewhere Q5_0 packs into int8 panels too (kernels.panel_layout), so the three fuse
    (("Q5_0", "Q5_0", "Q8_0"), (1024, 256, 256), 640, vk.panel_layout("Q5_0") == "q8"),
    (("Q5_0", "Q5_0"), (2048, 2048), 640, True),  # its gate, up
    (("Q4_K", "Q4_K"), (64, 96), 256, True),
    ((None, None), (64, 32), 48, True),  # fp32 panels
    (("Q4_K", "Q8_0"), (64, 64), 256, False),  # two panel layouts: separate calls
    (("Q8_0", "Q8_0"), (40, 64), 256, False),  # a part that is not whole panels
])
def test_linear_group_equals_separate_linears(qtypes: tuple, ns: tuple, k: int,
                                              fused: bool) -> None:
    ops = InvariantOps()
    parts = [_matrix(ops, q, n, k, seed=i) for i, (q, n) in enumerate(zip(qtypes, ns, strict=True))]
    x = {m: rand_x(m, k, seed=m) for m in (1, 3, 9)}  # decode rows and the large-M path
    before = {m: [ops.linear(x[m], p) for p in parts] for m in x}
    g = ops.group(parts)
    assert (g.packed is not None) == fused
    # quantized parts of one K in several layouts: one multi-layout decode call
    assert g.mixed == (len({vk.panel_layout(q) for q in qtypes}) > 1 and None not in qtypes)
    for m in x:
        outs = ops.linear_group(x[m], g)
        assert len(outs) == len(parts)
        for out, ref, p in zip(outs, before[m], parts, strict=True):
            assert same(out, ref)
            assert same(ops.linear(x[m], p), ref)  # a part alone still works (a view if fused)
    if fused:
        assert g.packed is not None
        whole = g.packed.untyped_storage().data_ptr()
        assert all(p.packed is not None and p.packed.untyped_storage().data_ptr() == whole
                   for p in parts)  # the parts are views: stored once


def test_torch_ops_group_runs_the_parts() -> None:
    ops = TorchOps()
    parts = [Matrix(torch.randn(8, 16)), Matrix(torch.randn(4, 16))]
    x = torch.randn(2, 16)
    outs = ops.linear_group(x, ops.group(parts))
    assert all(torch.equal(o, x @ p.dense().T) for o, p in zip(outs, parts, strict=True))


@pytest.mark.parametrize("t,h,d", [(1, 4, 256), (1, 1, 256), (5, 4, 256), (3, 2, 6), (70, 1, 64)])
def test_rmsnorm_rope_half_equals_the_two_steps(t: int, h: int, d: int) -> None:
    g = torch.Generator().manual_seed(t * 100 + h * 10 + d)
    x = torch.randn(t, h, d, generator=g) * 3
    w = torch.randn(d, generator=g) + 1
    ang = torch.rand(t, d // 2, generator=g, dtype=torch.float64) * 1000
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    ref = rope_half(vk.rmsnorm(x.view(t * h, d), w, 1e-6).view(t, h, d), cos, sin)
    for isa in ISAS:
        with vk.forced_isa(isa):
            assert same(vk.rmsnorm_rope_half(x, w, 1e-6, cos, sin), ref), isa
    assert same(InvariantOps().rmsnorm_rope_half(x, w, 1e-6, cos, sin), ref)
    fast = TorchOps()
    assert same(fast.rmsnorm_rope_half(x, w, 1e-6, cos, sin),
                rope_half(fast.rmsnorm(x, w, 1e-6), cos, sin))


def test_rmsnorm_rope_half_bad_inputs() -> None:
    x, w = torch.randn(2, 4, 8), torch.randn(8)
    cos = sin = torch.randn(2, 4)
    for args in [(torch.randn(2, 4, 7), torch.randn(7), cos, sin),  # odd D
                 (x, torch.randn(6), cos, sin),
                 (x, w, torch.randn(3, 4), sin),
                 (x.transpose(0, 1), w, cos, sin),
                 (x.double(), w, cos, sin)]:
        with pytest.raises(KernelError):
            vk.rmsnorm_rope_half(args[0], args[1], 1e-6, args[2], args[3])


# Gemma 3 270M (embedded Q4_K_M), BOS + ids 1000..1014, 24 greedy tokens: the roll-up digest the
# engine gave before the spin pool and the fused calls (commit ee35653) -- they must not move it.
GEMMA_DIGEST = "d900cba0d487968dd285b15fd08f4bc26e1a742bc5cf4e9e53016a01046a98c6"


def test_gemma_generation_digest_is_unchanged() -> None:
    engine = Engine(load_model(embedded_model_path()), "invariant", max_seqs=2)
    try:
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        result = engine.generate([2, *range(1000, 1015)], params)
    finally:
        engine.close()
    assert result.logit_digest.hex() == GEMMA_DIGEST
