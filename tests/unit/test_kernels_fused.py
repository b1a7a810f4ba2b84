"""The fused decode-step kernels (csrc/verinfer_fused.cpp, engine/fused.py) give the very bits
of the unfused sequences they replace, on every ISA path, and refuse bad input with
KernelError before writing anything.

* ``add_rmsnorm_``: ``x = x + rmsnorm(o, post)`` (or ``x + o``) then ``rmsnorm(x, next)``.
* ``qk_rope_attention``: per-head rmsnorm (optional), rope_half / rope_interleaved, the
  KVCache writes, then ``kernels.attention`` over the layer — for a batch mixing decode tokens
  and a prefill chunk of sequences with different cache sizes, q|k|v given as one grouped
  output or as three strided column blocks.
* ``glu``: gelu_tanh_mul / silu_mul of the two column halves.

"Identical" means equal int32 views, never allclose.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from verinfer.engine import fused
from verinfer.engine import kernels as vk
from verinfer.engine.models.common import Batch, KVCache, Segment, rope_half, rope_interleaved
from verinfer.engine.ops import InvariantOps, TorchOps
from verinfer.errors import KernelError

ISAS = vk.supported_isas()
EPS = 1e-6


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


@pytest.fixture(autouse=True)
def _restore_isa() -> Iterator[None]:
    yield
    vk.set_isa("auto")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- add_rmsnorm_ -----------------------------------------------------------------------------
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("with_post", [True, False])
def test_add_rmsnorm_equals_add_then_norm(t: int, with_post: bool) -> None:
    g = gen(t)
    n = 640
    x = torch.randn(t, n, generator=g) * 4
    o = torch.randn(t, n, generator=g) * 50
    post, nxt = torch.randn(n, generator=g) + 1, torch.randn(n, generator=g) + 1
    ref_x = x + (vk.rmsnorm(o, post, EPS) if with_post else o)
    ref_h = vk.rmsnorm(ref_x, nxt, EPS)
    for isa in ISAS:
        with vk.forced_isa(isa):
            xi = x.clone()
            h = fused.add_rmsnorm_(xi, o, post if with_post else None, nxt, EPS)
            assert same(xi, ref_x) and same(h, ref_h), isa
    xi = x.clone()
    assert same(InvariantOps().add_rmsnorm_(xi, o, post if with_post else None, nxt, EPS), ref_h)
    xt = x.clone()  # the fast mode's unfused version updates x the same way
    TorchOps().add_rmsnorm_(xt, o, None, nxt, EPS)
    assert same(xt, x + o)


def test_add_rmsnorm_bad_inputs() -> None:
    x, o, w = torch.randn(2, 8), torch.randn(2, 8), torch.randn(8)
    for args in [(x, torch.randn(2, 7), w, w),  # o's shape
                 (x, o, torch.randn(7), w),  # post's size
                 (x, o, w, torch.randn(9)),  # next's size
                 (x.t(), o.t(), w, w),  # not contiguous
                 (x.double(), o, w, w),
                 (x, o.half(), w, w),
                 (x.view(2, 2, 4), o.view(2, 2, 4), torch.randn(4), torch.randn(4))]:
        before = args[0].clone()
        with pytest.raises(KernelError):
            fused.add_rmsnorm_(args[0], args[1], args[2], args[3], EPS)
        assert same(args[0], before)  # refused before touching x


# ---- qk_rope_attention --------------------------------------------------------------------------
H, KV, D, LAYERS, LAYER = 4, 2, 16, 3, 1
# a decode token of sequence 1 at position 9, then a prefill chunk of sequence 0 (positions 3..7)
SEGS = [Segment(0, 9, 1), Segment(1, 3, 5)]
CAPS = [12, 20]


def _setup(seed: int) -> tuple[torch.Tensor, ...]:
    """y: one grouped q|k|v output [T, (H + 2 KV) D]; q, k, v its strided column blocks."""
    g = gen(seed)
    t = sum(s.length for s in SEGS)
    y = torch.randn(t, (H + 2 * KV) * D, generator=g) * 3
    q, k, v = y.split([H * D, KV * D, KV * D], dim=1)
    ang = torch.rand(t, D // 2, generator=g, dtype=torch.float64) * 100
    return y, q, k, v, torch.cos(ang).float(), torch.sin(ang).float()


def _caches(seed: int) -> list[KVCache]:
    g = gen(seed)
    out = []
    for cap in CAPS:  # earlier positions already filled, as in a real step
        c = KVCache(LAYERS, KV, D, cap)
        c.k.copy_(torch.randn(c.k.shape, generator=g))
        c.v.copy_(torch.randn(c.v.shape, generator=g))
        out.append(c)
    return out


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qn: torch.Tensor | None,
               kn: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
               caches: list[KVCache], window: int) -> torch.Tensor:
    """The unfused sequence the models ran before (views, norm kernel, common.py rope,
    KVCache.write, attention kernel)."""
    t = q.shape[0]
    q, k, v = q.view(t, H, D), k.view(t, KV, D), v.view(t, KV, D)
    rot = rope_interleaved if interleaved else rope_half

    def prep(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        n = x.shape[1]
        if w is not None:
            x = vk.rmsnorm(x.reshape(t * n, D), w, EPS).view(t, n, D)
        return rot(x, cos, sin)

    qr, kr = prep(q, qn), prep(k, kn)
    batch = Batch(torch.zeros(t, dtype=torch.int64), SEGS, caches, torch.arange(t))
    row = 0
    for s in SEGS:
        caches[s.slot].write(LAYER, s.start, kr[row:row + s.length], v[row:row + s.length])
        row += s.length
    a = vk.attention(qr.contiguous(), [c.k[LAYER] for c in caches],
                     [c.v[LAYER] for c in caches], batch.seq, batch.pos, window, 0.125)
    return a.reshape(t, H * D)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("window", [0, 4])
def test_qk_rope_attention_equals_unfused(interleaved: bool, normed: bool, window: int) -> None:
    y, q, k, v, cos, sin = _setup(7)
    g = gen(8)
    qn = torch.randn(D, generator=g) + 1 if normed else None
    kn = torch.randn(D, generator=g) + 1 if normed else None
    ref_caches = _caches(9)
    ref = _reference(q, k, v, qn, kn, cos, sin, interleaved, ref_caches, window)
    t = q.shape[0]
    batch = Batch(torch.zeros(t, dtype=torch.int64), SEGS, _caches(9), torch.arange(t))
    for isa in ISAS:
        for blocks in ([y], [q, k, v], [q.contiguous(), k.contiguous(), v.contiguous()]):
            with vk.forced_isa(isa):
                caches = _caches(9)
                batch.caches = caches
                a = fused.qk_rope_attention(blocks, H, KV, D, qn, kn, EPS, cos, sin, interleaved,
                                            batch.k_caches, batch.v_caches, LAYER, batch.seq,
                                            batch.pos, window, 0.125)
                assert same(a, ref), isa
                for c, rc in zip(caches, ref_caches, strict=True):
                    assert same(c.k, rc.k) and same(c.v, rc.v), isa


def test_qk_rope_attention_torch_ops_fills_the_same_cache_positions() -> None:
    """The fast mode's unfused version writes k/v where the kernel does (values differ only
    by its own rounding of rope/norm: here no norm, so rope is the same PyTorch ops)."""
    y, q, k, v, cos, sin = _setup(3)
    t = q.shape[0]
    ref_caches = _caches(4)
    _reference(q, k, v, None, None, cos, sin, True, ref_caches, 0)
    caches = _caches(4)
    batch = Batch(torch.zeros(t, dtype=torch.int64), SEGS, caches, torch.arange(t))
    TorchOps().qk_rope_attention([y], H, KV, D, None, None, EPS, cos, sin, True, batch.k_caches,
                                 batch.v_caches, LAYER, batch.seq, batch.pos, 0, 0.125)
    for c, rc in zip(caches, ref_caches, strict=True):
        assert same(c.k, rc.k) and same(c.v, rc.v)


def test_qk_rope_attention_bad_inputs_write_nothing() -> None:
    y, q, k, v, cos, sin = _setup(5)
    t = q.shape[0]
    caches = _caches(6)
    kc, vc = [c.k for c in caches], [c.v for c in caches]
    seq = torch.tensor([0, 1, 1, 1, 1, 1])
    pos = torch.tensor([9, 3, 4, 5, 6, 7])
    w = torch.ones(D)
    good = dict(qkv=[q, k, v], n_heads=H, n_kv_heads=KV, head_dim=D, q_norm=w, k_norm=w,
                eps=EPS, cos=cos, sin=sin, interleaved=False, k_caches=kc, v_caches=vc,
                layer=LAYER, seq=seq, pos=pos, window=0, scale=0.1)
    snapshot = [(c.k.clone(), c.v.clone()) for c in caches]
    bad = [
        dict(pos=torch.tensor([9, 3, 4, 5, 6, 20])),  # past sequence 1's capacity (20)
        dict(pos=torch.tensor([12, 3, 4, 5, 6, 7])),  # past sequence 0's capacity (12)
        dict(pos=torch.tensor([9, 3, 4, 5, 6, -1])),
        dict(seq=torch.tensor([0, 1, 1, 1, 1, 2])),  # no third cache
        dict(seq=seq.int()),
        dict(pos=pos[:3]),
        dict(layer=LAYERS),
        dict(layer=-1),
        dict(cos=cos[:, :3]),
        dict(sin=sin[:2]),
        dict(q_norm=torch.ones(D + 1)),
        dict(n_kv_heads=3),  # H % KV != 0
        dict(n_heads=0),
        dict(head_dim=7),  # odd
        dict(head_dim=8),  # the blocks' columns are not H D, KV D, KV D
        dict(qkv=[q, k, v[:, :D]]),  # v's heads differ from k's
        dict(qkv=[q, k]),
        dict(qkv=[y[:, :-1]]),
        dict(qkv=[y[:3]]),  # rows differ from cos/sin/seq/pos
        dict(qkv=[q, k[:3], v]),
        dict(qkv=[q.double(), k, v]),
        dict(qkv=[y.view(t, H + 2 * KV, D)]),  # blocks are 2-D
        dict(k_caches=[c.double() for c in kc]),
        dict(k_caches=[c[0] for c in kc]),  # a layer's view, not the whole cache
        dict(v_caches=vc[:1]),
        dict(k_caches=[], v_caches=[]),
        dict(k_caches=[kc[0], kc[1][:, :1]]),  # KV heads of cache 1
    ]
    for change in bad:
        args = dict(good, **change)
        with pytest.raises(KernelError):
            fused.qk_rope_attention(**args)  # type: ignore[arg-type]
        for c, (k0, v0) in zip(caches, snapshot, strict=True):
            assert same(c.k, k0) and same(c.v, v0), change
    fused.qk_rope_attention(**good)  # type: ignore[arg-type]  # the good call does write
    assert not same(caches[1].k, snapshot[1][0])


# ---- glu ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [1, 4])
def test_glu_equals_elementwise_kernels_on_halves(t: int) -> None:
    y = torch.randn(t, 2 * 96, generator=gen(t)) * 4
    gate, up = y[:, :96].contiguous(), y[:, 96:].contiguous()
    for isa in ISAS:
        with vk.forced_isa(isa):
            assert same(fused.glu(y, "gelu_tanh"), vk.gelu_tanh_mul(gate, up)), isa
            assert same(fused.glu(y, "silu"), vk.silu_mul(gate, up)), isa
    assert same(InvariantOps().glu(y, "silu"), vk.silu_mul(gate, up))


def test_glu_bad_inputs() -> None:
    for y, act in [(torch.randn(2, 7), "silu"), (torch.randn(2, 8), "relu"),
                   (torch.randn(2, 8).double(), "silu"), (torch.randn(8, 2).t(), "silu"),
                   (torch.randn(8), "silu")]:
        with pytest.raises(KernelError):
            fused.glu(y, act)  # type: ignore[arg-type]
