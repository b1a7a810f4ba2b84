"""The Triton kernels of :mod:`verinfer.engine.triton_ops` (imported only from there, lazily:
this module imports triton at its top). Why each is batch invariant: triton_ops' docstring."""


import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])
def matmul(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, sxm, swn, ssn, sym,
           QUANT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           SPLIT_K: tl.constexpr, INTERPRET_DOT: tl.constexpr):
    pid = tl.program_id(0)
    n_m = (M + BM - 1) // BM
    n_n = (N + BN - 1) // BN
    # persistent: program pid computes tiles pid, pid + grid, ... (the grid is a launch
    # parameter, not a constexpr: no recompilation when M changes the tile count)
    for tile in range(pid, n_m * n_n, tl.num_programs(0)):
        pm = tile // n_n
        pn = tile % n_n
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)  # SPLIT_K == 2 only (negative control)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            xt = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :],
                         mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            wmask = (rn[:, None] < N) & (rk[None, :] < K)
            if QUANT:  # Q8_0: int8 value * fp32(fp16 scale), one exact product
                q = tl.load(w_ptr + rn[:, None] * swn + rk[None, :], mask=wmask, other=0)
                d = tl.load(s_ptr + rn * ssn + k0 // 32, mask=rn < N, other=0.0)
                wt = q.to(tl.float32) * d[:, None]
            else:
                wt = tl.load(w_ptr + rn[:, None] * swn + rk[None, :], mask=wmask,
                             other=0.0)
            if INTERPRET_DOT:
                # the interpreter's tl.dot is numpy's matmul, whose bits depend on a row's place
                # in the tile (OpenBLAS edge kernels): one product per (m, k, n), summed over k
                part = tl.sum(xt[:, :, None] * tl.trans(wt)[None, :, :], axis=1)
            else:  # fp32 FMAs in k order per output (no TF32, no tensor cores)
                part = tl.dot(xt, tl.trans(wt), input_precision="ieee")
            if SPLIT_K == 2:
                if (k0 // BK) % 2 == 1:
                    acc2 += part
                else:
                    acc += part
            else:
                acc += part
        if SPLIT_K == 2:
            acc = acc + acc2
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

# RMSNorm is written out in each kernel (no nested jit function: the interpreter re-patches
# the language on every nested call). Per row: ss = tl.sum(x*x) over one power-of-two block,
# ms = ss / n, inv = 1 / sqrt(ms + eps) (both correctly rounded), y = (x * inv) * w.
@triton.jit
def rmsnorm(x_ptr, w_ptr, y_ptr, N, sx, sy, eps, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    m = r < N
    x = tl.load(x_ptr + row * sx + r, mask=m, other=0.0)
    w = tl.load(w_ptr + r, mask=m, other=0.0)
    if CHUNK == BLOCK:
        ss = tl.sum(x * x, axis=0)
    else:  # negative control only: another summation order
        ss = tl.sum(tl.sum(tl.reshape(x * x, (BLOCK // CHUNK, CHUNK)), axis=1), axis=0)
    inv = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(ss, N.to(tl.float32)) + eps))
    tl.store(y_ptr + row * sy + r, x * inv * w, mask=m)


@triton.jit
def add_rmsnorm(x_ptr, o_ptr, post_ptr, nxt_ptr, y_ptr, N, sx, so, sy, eps,
                HAS_POST: tl.constexpr, BLOCK: tl.constexpr):
    """x += rmsnorm(o, post) (x += o without post), in place; y = rmsnorm(x, nxt)."""
    row = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    m = r < N
    n = N.to(tl.float32)
    x = tl.load(x_ptr + row * sx + r, mask=m, other=0.0)
    o = tl.load(o_ptr + row * so + r, mask=m, other=0.0)
    if HAS_POST:
        pw = tl.load(post_ptr + r, mask=m, other=0.0)
        inv_o = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(o * o, axis=0), n) + eps))
        o = o * inv_o * pw
    x = x + o
    tl.store(x_ptr + row * sx + r, x, mask=m)
    nw = tl.load(nxt_ptr + r, mask=m, other=0.0)
    inv = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(x * x, axis=0), n) + eps))
    tl.store(y_ptr + row * sy + r, x * inv * nw, mask=m)


@triton.jit
def glu(g_ptr, u_ptr, y_ptr, F, sg, su, sy, GELU: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    for c0 in range(0, F, BLOCK):
        r = c0 + tl.arange(0, BLOCK)
        m = r < F
        g = tl.load(g_ptr + row * sg + r, mask=m, other=0.0)
        u = tl.load(u_ptr + row * su + r, mask=m, other=0.0)
        if GELU:  # 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), tanh via exp
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            t = 1.0 - tl.div_rn(2.0, tl.exp(2.0 * z) + 1.0)
            a = 0.5 * g * (1.0 + t)
        else:
            a = tl.div_rn(g, 1.0 + tl.exp(-g))
        tl.store(y_ptr + row * sy + r, a * u, mask=m)

@triton.jit(do_not_specialize=["layer"])
def kv_write(k_ptr, v_ptr, kbase, vbase, caps, seq, pos, layer, sk, sv,
             KV: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(seq + t)
    p = tl.load(pos + t)
    cap = tl.load(caps + s)
    off = ((layer * KV + h) * cap + p) * D + tl.arange(0, D)
    kc = tl.load(kbase + s).to(tl.pointer_type(tl.float32))
    vc = tl.load(vbase + s).to(tl.pointer_type(tl.float32))
    tl.store(kc + off, tl.load(k_ptr + t * sk + h * D + tl.arange(0, D)))
    tl.store(vc + off, tl.load(v_ptr + t * sv + h * D + tl.arange(0, D)))

@triton.jit(do_not_specialize=["layer", "window"])
def attention(q_ptr, o_ptr, kbase, vbase, caps, seq, pos, layer, sq, so, window, scale,
              H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
              GP: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query token, KV head): its G query heads (GQA group, padded to GP)
    walk the keys 0..pos in BLOCK_N tiles aligned to position 0 (from the window's first
    tile), online softmax in fp32. Each query head's arithmetic is its own: the same for any
    T, any other sequence, prefill or decode."""
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.load(seq + t)
    p = tl.load(pos + t)
    cap = tl.load(caps + s)
    kc = tl.load(kbase + s).to(tl.pointer_type(tl.float32))
    vc = tl.load(vbase + s).to(tl.pointer_type(tl.float32))
    base = (layer * KV + kvh) * cap * D
    rd = tl.arange(0, D)
    rg = tl.arange(0, GP)
    gmask = rg < G
    q = tl.load(q_ptr + t * sq + (kvh * G + rg)[:, None] * D + rd[None, :],
                mask=gmask[:, None], other=0.0)
    lo = tl.where(window > 0, tl.maximum(p - window + 1, 0), 0)
    start = (lo // BLOCK_N) * BLOCK_N  # tiles aligned to position 0
    m_i = tl.full((GP,), -float("inf"), tl.float32)
    l_i = tl.zeros((GP,), dtype=tl.float32)
    acc = tl.zeros((GP, D), dtype=tl.float32)
    for n0 in range(start, p + 1, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        valid = (rn >= lo) & (rn <= p)
        kt = tl.load(kc + base + rn[:, None] * D + rd[None, :], mask=valid[:, None], other=0.0)
        sc = tl.sum(q[:, None, :] * kt[None, :, :], axis=2) * scale  # [GP, BLOCK_N]
        sc = tl.where(valid[None, :], sc, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(sc - m_new[:, None])
        vt = tl.load(vc + base + rn[:, None] * D + rd[None, :], mask=valid[:, None], other=0.0)
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * vt[None, :, :], axis=1)
        m_i = m_new
    tl.store(o_ptr + t * so + (kvh * G + rg)[:, None] * D + rd[None, :], acc / l_i[:, None],
             mask=gmask[:, None])
