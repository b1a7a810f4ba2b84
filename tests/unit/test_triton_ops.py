"""The GPU engine's Triton kernels (engine/triton_ops.py) under Triton's CPU interpreter.

``TRITON_INTERPRET=1`` runs the kernels on CPU tensors (triton 3.9.0, scripts/ci-extras.d/
40-triton). The interpreter's bits are numpy's, not a GPU's: what is proven here is the
structure — every output equals a float64 reference within tolerance, and no output bit
depends on the rows next to it, on the batch size, on prefill vs decode or on how a prompt
is chunked — and each property has a negative control (a kernel variant that breaks it: the
test must see the difference). On a GPU, ``scripts/gpu-check`` measures the same properties.
Shapes are tiny: the interpreter costs milliseconds per program.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: run scripts/ci-extras.d/40-triton")

from verinfer.engine import triton_ops
from verinfer.engine.loader import LoadedModel
from verinfer.engine.models.common import Batch, KVCache, Segment
from verinfer.engine.models.registry import model_class
from verinfer.engine.ops import Matrix, TorchOps
from verinfer.engine.triton_ops import ATTN_BLOCK_N, TritonOps, config_hash
from verinfer.errors import KernelError

RTOL = 1e-5


class SplitKWhenSmall(TritonOps):
    """Negative control: split-K for small M (what a GEMM library's heuristics do)."""

    def split_k(self, m: int) -> int:
        return 2 if m <= 4 else 1


class DecodeTiles(TritonOps):
    """Negative control: another KV tile size for single-token (decode) calls."""

    def attn_block_n(self, t: int) -> int:
        return 8 if t == 1 else ATTN_BLOCK_N


class ChunkedNormWhenBatched(TritonOps):
    """Negative control: the row's sum of squares in another order when several rows run."""

    def norm_chunk(self, t: int, block: int) -> int:
        return block if t == 1 else 8


def close64(got: torch.Tensor, ref: torch.Tensor, rtol: float = RTOL) -> bool:
    """``got`` within ``rtol`` of the float64 reference (relative to its largest value)."""
    err = (got.double() - ref).abs().max().item()
    return err <= rtol * max(ref.abs().max().item(), 1.0)


def rows_alone_equal(f, x: torch.Tensor, sizes: range | list[int] | None = None) -> list[int]:
    """Batch sizes (default 1..len(x)) at which some row of ``f(x[:n])`` differs from ``f`` of
    that row alone."""
    sizes = sizes if sizes is not None else range(1, x.shape[0] + 1)
    alone = [f(x[i:i + 1])[0] for i in range(max(sizes))]
    return [n for n in sizes
            if not all(torch.equal(f(x[:n])[i], alone[i]) for i in range(n))]


@pytest.fixture(scope="module", autouse=True)
def interpreter() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` while this module runs, and the kernels decorated under it: jit
    reads the variable when triton_kernels is imported (tests/conftest.py imported triton's own
    library under it). Restored after, so no later test or subprocess inherits it."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    sys.modules.pop("verinfer.engine.triton_kernels", None)
    triton_ops._k.cache_clear()
    yield
    mp.undo()
    sys.modules.pop("verinfer.engine.triton_kernels", None)
    triton_ops._k.cache_clear()


@pytest.fixture(scope="module")
def ops() -> TritonOps:
    return TritonOps("cpu")


def q8_matrix(n: int, k: int, seed: int) -> Matrix:
    import gguf
    import numpy as np

    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.1).numpy()
    blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    return Matrix(None, qtype="Q8_0", blocks=torch.from_numpy(np.ascontiguousarray(blocks)))


# ---- equality with float64 ------------------------------------------------------------------
def test_matmul_f32_and_q8_0_match_float64(ops: TritonOps) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 96, generator=g)
    wf = Matrix(torch.randn(80, 96, generator=g))
    wq = q8_matrix(70, 96, 2)
    ref_q = wq.dense().double()  # gguf's dequantized values, read before prepare moves them
    ops.prepare(wf), ops.prepare(wq)
    assert close64(ops.linear(x, wf), x.double() @ wf.f32.double().T)
    assert close64(ops.linear(x, wq), x.double() @ ref_q.T)
    # negative control: a K walk that stops one tile early is far outside the tolerance
    dw = ops.device_weight(wf)
    short = type(dw)(dw.fmt, dw.w[:, :64].contiguous(), None, dw.n, 64)
    assert not close64(ops.matmul(x[:, :64], short), x.double() @ wf.f32.double().T)


def test_row_kernels_match_float64(ops: TritonOps) -> None:
    g = torch.Generator().manual_seed(3)
    x, o = torch.randn(6, 64, generator=g), torch.randn(6, 64, generator=g)
    w, w2 = torch.rand(64, generator=g) + 0.5, torch.rand(64, generator=g) + 0.5

    def norm64(a: torch.Tensor, wt: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
        a = a.double()
        return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps) * wt.double()

    assert close64(ops.rmsnorm(x, w, 1e-5), norm64(x, w))
    xx = x.clone()
    h = ops.add_rmsnorm_(xx, o, w, w2, 1e-5)
    summed = x.double() + norm64(o, w)
    assert close64(xx, summed) and close64(h, norm64(summed, w2))
    assert close64(ops.silu_mul(x, o), torch.nn.functional.silu(x.double()) * o.double())
    gelu = torch.nn.functional.gelu(x.double(), approximate="tanh") * o.double()
    assert close64(ops.gelu_tanh_mul(x, o), gelu)
    # negative control: the test sees a wrong epsilon
    assert not close64(ops.rmsnorm(x * 1e-3, w, 1e-5), norm64(x * 1e-3, w, 1e-9))


def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: list[int],
                window: int, scale: float) -> torch.Tensor:
    """Float64 causal attention of queries q [T, H, D] over one sequence's k/v [KV, n, D]."""
    T, H, D = q.shape
    rep = H // k.shape[0]
    kk, vv = k.double().repeat_interleave(rep, 0), v.double().repeat_interleave(rep, 0)
    out = torch.empty(T, H, D, dtype=torch.float64)
    for t, p in enumerate(pos):
        lo = max(0, p - window + 1) if window else 0
        s = torch.einsum("hd,hnd->hn", q[t].double(), kk[:, lo:p + 1]) * scale
        out[t] = torch.einsum("hn,hnd->hd", torch.softmax(s, -1), vv[:, lo:p + 1])
    return out


def test_attention_matches_float64_with_window(ops: TritonOps) -> None:
    g = torch.Generator().manual_seed(4)
    H, KV, D, n = 4, 2, 16, 45
    k, v = torch.randn(KV, n, D, generator=g), torch.randn(KV, n, D, generator=g)
    at = [0, 5, 31, 32, 44]  # queries at these positions (tile edges: 32 keys a tile)
    q = torch.randn(len(at), H, D, generator=g)
    seq, pos = torch.zeros(len(at), dtype=torch.int64), torch.tensor(at)
    for window in (0, 20):
        got = ops.attention(q, [k], [v], seq, pos, window, 0.25)
        assert close64(got, attention64(q, k, v, at, window, 0.25))
    # negative control: the comparison sees a window off by one
    assert not close64(ops.attention(q, [k], [v], seq, pos, 20, 0.25),
                       attention64(q, k, v, at, 21, 0.25))


# ---- a row alone vs in a batch of 1..17 ------------------------------------------------------
def test_matmul_row_alone_equals_row_in_batch_1_to_17(ops: TritonOps) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(17, 64, generator=g)
    wf = ops.prepare(Matrix(torch.randn(64, 64, generator=g)))
    wq = ops.prepare(q8_matrix(64, 64, 6))
    for w in (wf, wq):
        assert rows_alone_equal(lambda a, w=w: ops.linear(a, w), x) == []
    # negative control (K = 96: three K tiles, so the split sums in another order)
    bad, x96 = SplitKWhenSmall("cpu"), torch.randn(17, 96, generator=g)
    wb = bad.prepare(Matrix(torch.randn(64, 96, generator=g)))
    assert rows_alone_equal(lambda a: bad.linear(a, wb), x96, [17]) == [17]


def test_row_kernels_row_alone_equals_row_in_batch_1_to_17(ops: TritonOps) -> None:
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(17, 64, generator=g) * 3, torch.rand(64, generator=g) + 0.5
    assert rows_alone_equal(lambda a: ops.rmsnorm(a, w, 1e-6), x) == []
    # the fused residual + norm and the GLU (no reduction) at a few sizes
    assert rows_alone_equal(lambda a: ops.add_rmsnorm_(a.clone(), a * 0.5 - 1, w, w, 1e-6),
                            x, [3, 17]) == []
    assert rows_alone_equal(lambda a: ops.silu_mul(a, a * 0.5), x, [17]) == []
    bad = ChunkedNormWhenBatched("cpu")
    assert rows_alone_equal(lambda a: bad.rmsnorm(a, w, 1e-6), x, [17]) == [17]  # negative


def test_attention_query_alone_equals_query_among_other_sequences(ops: TritonOps) -> None:
    """Decode rows of 1..9 sequences in one call: each row's bits are those it has alone."""
    g = torch.Generator().manual_seed(8)
    H, KV, D, n = 4, 2, 16, 40
    ks = [torch.randn(KV, n, D, generator=g) for _ in range(9)]
    vs = [torch.randn(KV, n, D, generator=g) for _ in range(9)]
    q = torch.randn(9, H, D, generator=g)
    pos = torch.tensor([39, 3, 17, 33, 0, 25, 8, 31, 12])
    alone = [ops.attention(q[i:i + 1], [ks[i]], [vs[i]], torch.zeros(1, dtype=torch.int64),
                           pos[i:i + 1], 0, 0.25)[0] for i in range(9)]
    for b in (2, 5, 9):
        got = ops.attention(q[:b], ks[:b], vs[:b], torch.arange(b), pos[:b], 0, 0.25)
        assert all(torch.equal(got[i], alone[i]) for i in range(b)), b


# ---- prefill vs decode -----------------------------------------------------------------------
def test_attention_prefill_equals_decode(ops: TritonOps) -> None:
    g = torch.Generator().manual_seed(9)
    H, KV, D, n = 4, 2, 16, 34
    k, v = torch.randn(KV, n, D, generator=g), torch.randn(KV, n, D, generator=g)
    q = torch.randn(n, H, D, generator=g)

    def prefill_vs_decode(o: TritonOps) -> list[int]:
        whole = o.attention(q, [k], [v], torch.zeros(n, dtype=torch.int64), torch.arange(n),
                            0, 0.25)
        return [p for p in (0, 7, 31, 32, 33) if not torch.equal(
            o.attention(q[p:p + 1], [k], [v], torch.zeros(1, dtype=torch.int64),
                        torch.tensor([p]), 0, 0.25)[0], whole[p])]

    assert prefill_vs_decode(ops) == []
    assert prefill_vs_decode(DecodeTiles("cpu")) != []  # negative control


# ---- the tiny model: prefill vs decode, chunked vs whole, alone vs batched ---------------------
def model_logits(model: object, loaded: LoadedModel, prompt: list[int],
                 chunks: list[int]) -> torch.Tensor:
    """Logits of every prompt position, the prompt fed in chunks of the given sizes."""
    cfg = loaded.config
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, len(prompt))
    rows, start = [], 0
    for c in chunks:
        toks = torch.tensor(prompt[start:start + c], dtype=torch.int64)
        b = Batch(toks, [Segment(0, start, c)], [cache], torch.arange(c))
        rows.append(model.forward(b))  # type: ignore[attr-defined]
        start += c
    return torch.cat(rows)


@pytest.fixture(scope="module")
def tiny1(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny model with one layer (the interpreter's cost is per kernel call)."""
    from verinfer.engine.loader import load_model
    from verinfer.engine.tiny import TinySpec, write_tiny_llama

    path = tmp_path_factory.mktemp("tiny1") / "tiny1.gguf"
    return load_model(write_tiny_llama(path, seed=0, spec=TinySpec(n_layers=1)))


@pytest.fixture(scope="module")
def prompt(tiny1: LoadedModel) -> list[int]:
    return tiny1.tokenizer.encode("The capital of France is", add_bos=True)


def test_tiny_model_chunked_and_decoded_equal_whole(tiny1: LoadedModel, ops: TritonOps,
                                                   prompt: list[int]) -> None:
    cls = model_class(tiny1.config)
    model = cls(tiny1.config, tiny1.weights, ops)
    n = len(prompt)
    whole = model_logits(model, tiny1, prompt, [n])
    # close to plain torch (a float32 reference of the same model)
    ref = model_logits(cls(tiny1.config, tiny1.weights, TorchOps()), tiny1,
                       prompt, [n])
    assert close64(whole, ref.double(), rtol=1e-4)
    assert torch.equal(model_logits(model, tiny1, prompt, [2, n - 3, 1]), whole)
    # negative control: split-K at small M changes the chunked/decoded prompt's bits
    bad = SplitKWhenSmall("cpu")
    bm = cls(tiny1.config, tiny1.weights, bad)
    assert not torch.equal(model_logits(bm, tiny1, prompt, [2, n - 3, 1]),
                           model_logits(bm, tiny1, prompt, [n]))


def test_tiny_model_sequence_alone_equals_sequence_in_batch(tiny1: LoadedModel, ops: TritonOps,
                                                            prompt: list[int]) -> None:
    cfg = tiny1.config
    model = model_class(cfg)(cfg, tiny1.weights, ops)
    others = [prompt[::-1][:5], prompt[1:4]]

    def step(prompts: list[list[int]]) -> torch.Tensor:
        caches = [KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, len(p)) for p in prompts]
        segs, start, last = [], 0, []
        for i, p in enumerate(prompts):
            segs.append(Segment(i, 0, len(p)))
            start += len(p)
            last.append(start - 1)
        toks = torch.tensor([t for p in prompts for t in p], dtype=torch.int64)
        return model.forward(Batch(toks, segs, caches, torch.tensor(last)))

    alone = step([prompt])[0]
    assert torch.equal(step([others[0], prompt, others[1]])[1], alone)


# ---- the ops' identity and refusals ------------------------------------------------------------
def test_fingerprint_names_the_kernels_and_refuses_cuda_without_a_gpu(ops: TritonOps) -> None:
    from verinfer.engine.triton_ops import hardware_facts

    assert f"cfg={config_hash()}" in ops.linear_order and "triton=3.9.0" in ops.linear_order
    hw, reported = hardware_facts(ops)
    assert hw.startswith("cpu:triton-interpret")  # never a GPU's class
    assert reported["kernel_configs"]["split_k"] == 1
    assert reported["compute_dtype"] == "float32"
    if not torch.cuda.is_available():
        with pytest.raises(KernelError, match="no CUDA device"):
            TritonOps("cuda")


def test_engine_refuses_cuda_clearly_without_a_gpu(tiny_path: Path) -> None:
    from verinfer.engine.backends import EngineChoice, UnknownBackendError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(KernelError, match="sees no CUDA device"):
        EngineChoice("own", "invariant", device="cuda").load(tiny_path)
    with pytest.raises(UnknownBackendError):
        EngineChoice("own", "invariant", device="tpu")
    with pytest.raises(UnknownBackendError):  # --device is the own engine's
        EngineChoice("vllm", device="cuda")


def test_the_cuda_choice_round_trips_and_its_receipts_name_the_own_backend() -> None:
    from verinfer.engine.backends import EngineChoice, backend_for_fingerprint
    from verinfer.engine.fingerprint import DEVICE_BACKEND

    choice = EngineChoice("own", "invariant", device="cuda")
    assert EngineChoice.from_json(choice.to_json()) == choice
    assert EngineChoice.from_json({"backend": "own"}).device == "cpu"  # older documents
    assert backend_for_fingerprint(DEVICE_BACKEND) == "own"
    assert backend_for_fingerprint("torch-cpu") == "own"
