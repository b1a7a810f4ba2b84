"""The own engine on an NVIDIA GPU: an :class:`~verinfer.engine.ops.Ops` of Triton kernels whose
every output bit is independent of the batch (docs/gpu.md, issue 35).

Triton is imported lazily (inside :func:`_k`), so the CPU install never needs it. Under
``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (Triton's interpreter, numpy
underneath): that is how CI tests them without a GPU (tests/unit/test_triton_ops.py); the
interpreter's bits are not a GPU's, only the structure (tiles, order, what depends on what) is
the same.

Why each kernel is batch invariant (one row's bits never depend on the other rows):

* **matmul** (``_matmul``): a persistent kernel (grid = min(tiles, SMs), each program walks
  tiles ``pid, pid + grid, ...``) with ONE tile configuration per (dtype, weight format),
  whatever M is (``MATMUL_CONFIGS``); K is walked in ascending BK steps into one accumulator
  (no split-K: ``SPLIT_K`` exists only for the negative control, the served ops pass 1);
  ``tl.dot(..., input_precision="ieee")``: fp32 FMAs, never TF32. M is not specialized
  (``do_not_specialize``): M = 1 compiles the same code as M = 64. Which program computes a
  tile never changes the arithmetic of an output element, and rows beyond M are masked loads
  of 0 that no other row's sum reads.
* **RMSNorm / residual + RMSNorm / GLU**: one row per program, the row's sum of squares one
  ``tl.sum`` over a fixed power-of-two block; ``1/sqrt`` correctly rounded (``sqrt_rn``,
  ``div_rn``).
* **attention** (``_attention``): one program per (query token, head); its keys are walked in
  fixed tiles of ``ATTN_BLOCK_N`` positions aligned to position 0 (the first tile is the
  aligned one holding the window's first key), online softmax in fp32. A position's tile
  sequence depends only on its own position: the same in prefill, decode, a chunk or a
  replay; no split-KV. K/V are written into the caches (``_kv_write``) before the attention
  kernel reads them, on the same stream.
* **GGUF weights** stay quantized on the device: Q8_0 as int8 values + fp32 scales,
  multiplied inside the matmul (the exact products ``gguf.quants.dequantize`` gives); other
  block types are dequantized once at load into fp32 on the device (exact, more memory).
* Compute dtype: **float32** (activations, accumulators, KV cache, logits): ``COMPUTE_DTYPE``,
  the fingerprint's ``dtype``. Rotary stays the shared ``ops.rope`` in torch (IEEE products
  and sums, exactly rounded on any device); sampling stays the CPU rule over the float32
  logits row (engine.py copies the logits to the host).

Every kernel configuration is in ``kernel_configs()``; its hash is part of the fingerprint's
``linear_order``, so changing a tile changes the approved fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any

import torch

from verinfer.engine.ops import (
    GluAct,
    KernelMode,
    Matrix,
    MatrixGroup,
    TorchOps,
    make_ops,
    rope,
)
from verinfer.errors import KernelError

COMPUTE_DTYPE = "float32"
KERNEL_VERSION = "triton-fixed-tile-v1"
#: (weight format) -> tile configuration. One per format, whatever M is (fp32 activations).
MATMUL_CONFIGS: dict[str, dict[str, int]] = {
    "f32": {"BM": 16, "BN": 64, "BK": 32, "num_warps": 4},
    "Q8_0": {"BM": 16, "BN": 64, "BK": 32, "num_warps": 4},
}
ATTN_BLOCK_N = 32  # keys per attention tile, aligned to position 0
ROW_WARPS = 4
#: programs of the persistent matmul when no GPU says how many SMs it has (the interpreter)
INTERPRET_PROGRAMS = 4


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def kernel_configs() -> dict[str, Any]:
    """Everything that fixes a reduction order in these kernels (hashed into the fingerprint)."""
    return {"version": KERNEL_VERSION, "matmul": MATMUL_CONFIGS, "attn_block_n": ATTN_BLOCK_N,
            "row_warps": ROW_WARPS, "compute_dtype": COMPUTE_DTYPE, "split_k": 1,
            "split_kv": 1, "input_precision": "ieee"}


def config_hash() -> str:
    doc = json.dumps(kernel_configs(), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(doc).hexdigest()[:16]


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return str(triton.__version__)


@cache
def _k() -> SimpleNamespace:
    """The kernels, defined on first use (triton imported here, never at module import)."""
    try:
        import triton
    except ImportError as e:
        raise KernelError("the GPU kernels need Triton (`import triton` failed: "
                          f"{e}); CPU CI: scripts/ci-extras.d/40-triton") from e

    from verinfer.engine import triton_kernels as tk

    return SimpleNamespace(triton=triton, matmul=tk.matmul, rmsnorm=tk.rmsnorm,
                           add_rmsnorm=tk.add_rmsnorm, glu=tk.glu, kv_write=tk.kv_write,
                           attention=tk.attention)


def _check_heads(h: int, kv: int, d: int) -> None:
    if h % kv or d & (d - 1):
        raise KernelError(f"{h} heads over {kv} KV heads of dim {d}: the attention kernel "
                          "needs whole GQA groups and a power-of-two head dim")


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass
class DeviceWeight:
    """A weight as the matmul reads it: fp32 [N, K], or Q8_0 as int8 [N, K] + fp32 scales
    [N, K/32] (the fp16 block scales widened, exactly)."""

    fmt: str  # "f32" | "Q8_0"
    w: torch.Tensor
    scales: torch.Tensor | None
    n: int
    k: int


def cuda_description() -> dict[str, str]:
    """SKU, driver and CUDA of device 0 (reported; the SKU is the hardware class)."""
    props = torch.cuda.get_device_properties(0)
    driver = "unknown"
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            driver = f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    return {"sku": props.name, "capability": f"{props.major}.{props.minor}",
            "sms": str(props.multi_processor_count), "cuda": str(torch.version.cuda),
            "driver_api": driver}


def require_cuda() -> None:
    """Refuses clearly when a CUDA device is asked for and there is none (or no Triton)."""
    if not torch.cuda.is_available():
        raise KernelError(
            f"device cuda was asked for, but torch {torch.__version__} sees no CUDA device "
            f"(built with CUDA {torch.version.cuda}): run on a GPU machine, or use the CPU "
            f"engine (--device cpu)")
    _k()


class TritonOps:
    """:class:`~verinfer.engine.ops.Ops` of the batch-invariant Triton kernels on ``device``
    (``cuda``; ``cpu`` only under ``TRITON_INTERPRET=1``)."""

    mode: KernelMode = "invariant"

    def __init__(self, device: str = "cuda") -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            require_cuda()
        elif not interpreting():
            raise KernelError("the Triton kernels run on CPU tensors only under "
                              "TRITON_INTERPRET=1 (tests, `scripts/gpu-check --dry-run`)")
        self.k = _k()
        self.nprog = (torch.cuda.get_device_properties(self.device).multi_processor_count
                      if self.device.type == "cuda" else INTERPRET_PROGRAMS)
        self.linear_order = (f"{KERNEL_VERSION}:k-ascending;cfg={config_hash()};"
                             f"triton={triton_version()};cuda={torch.version.cuda}")
        self._dev: dict[int, tuple[Matrix, DeviceWeight]] = {}
        self._moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._ptrs: tuple[Any, Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    # ---- test hooks (the negative controls in tests/ override these) ------------------------
    def split_k(self, m: int) -> int:
        return 1

    def attn_block_n(self, t: int) -> int:
        return ATTN_BLOCK_N

    def norm_chunk(self, t: int, block: int) -> int:
        return block

    # ---- placement ---------------------------------------------------------------------------
    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the device (small host tensors — norms, rotary rows, seq/pos — are copied
        once per object: the model passes the same ones to every layer)."""
        if t.device == self.device:
            return t
        hit = self._moved.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        if len(self._moved) > 512:
            self._moved.clear()
        out = t.to(self.device)
        self._moved[id(t)] = (t, out)
        return out

    def prepare(self, w: Matrix) -> Matrix:
        if id(w) in self._dev:
            return w
        n, k = w.shape
        if w.qtype == "Q8_0" and w.blocks is not None:
            b = w.blocks.reshape(n, k // 32, 34)
            scales = b[:, :, :2].contiguous().view(torch.float16).to(torch.float32)
            dw = DeviceWeight("Q8_0", b[:, :, 2:].contiguous().view(torch.int8).reshape(n, k)
                              .to(self.device), scales.reshape(n, k // 32).to(self.device), n, k)
            w.blocks = w.blocks.to(self.device)  # embedding rows: dequantized on the device
            w.q8_0 = w.blocks
        else:  # fp32, or another block type dequantized once (exact) into fp32 on the device
            f = w.dense().to(self.device).contiguous()
            w.f32, w.blocks, w.qtype = f, None, None
            w.q8_0 = w.q4_1 = None
            dw = DeviceWeight("f32", f, None, n, k)
        self._dev[id(w)] = (w, dw)
        return w

    def device_weight(self, w: Matrix) -> DeviceWeight:
        hit = self._dev.get(id(w))
        if hit is None or hit[0] is not w:
            raise KernelError("weight matrix used before Ops.prepare placed it on the device")
        return hit[1]

    # ---- matmul ------------------------------------------------------------------------------
    def matmul(self, x: torch.Tensor, dw: DeviceWeight, split_k: int | None = None
               ) -> torch.Tensor:
        x = self.to_device(x)
        if x.stride(-1) != 1:
            x = x.contiguous()
        m = x.shape[0]
        y = torch.empty(m, dw.n, dtype=torch.float32, device=self.device)
        if m == 0:
            return y
        cfg = MATMUL_CONFIGS[dw.fmt]
        tiles = -(-m // cfg["BM"]) * -(-dw.n // cfg["BN"])
        nprog = min(tiles, self.nprog)
        quant = dw.scales is not None
        s = dw.scales if dw.scales is not None else dw.w
        self.k.matmul[(nprog,)](
            x, dw.w, s, y, m, dw.n, dw.k, x.stride(0), dw.w.stride(0), s.stride(0), y.stride(0),
            QUANT=quant, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
            SPLIT_K=split_k if split_k is not None else self.split_k(m),
            INTERPRET_DOT=self.device.type != "cuda",
            num_warps=cfg["num_warps"])
        return y

    def linear(self, x: torch.Tensor, w: Matrix) -> torch.Tensor:
        return self.matmul(x, self.device_weight(w))

    def group(self, parts: Sequence[Matrix]) -> MatrixGroup:
        return MatrixGroup(list(parts))

    def linear_group(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        return [self.linear(x, p) for p in g.parts]

    def linear_group_blocks(self, x: torch.Tensor, g: MatrixGroup) -> list[torch.Tensor]:
        return self.linear_group(x, g)

    # ---- rows --------------------------------------------------------------------------------
    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        x = self.to_device(x)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = torch.empty(x2.shape, dtype=torch.float32, device=self.device)
        n = shape[-1]
        block = _pow2(n)
        if x2.shape[0]:
            self.k.rmsnorm[(x2.shape[0],)](x2, self.to_device(w), y, n, x2.stride(0),
                                           y.stride(0), float(eps), BLOCK=block,
                                           CHUNK=self.norm_chunk(x2.shape[0], block),
                                           num_warps=ROW_WARPS)
        return y.reshape(shape)

    def rmsnorm_rope_half(self, x: torch.Tensor, w: torch.Tensor, eps: float,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rope(self.rmsnorm(x, w, eps), self.to_device(cos), self.to_device(sin),
                    interleaved=False)

    def _glu(self, gate: torch.Tensor, up: torch.Tensor, act: GluAct) -> torch.Tensor:
        gate, up = self.to_device(gate), self.to_device(up)
        t, f = gate.shape
        y = torch.empty(t, f, dtype=torch.float32, device=self.device)
        if t:
            self.k.glu[(t,)](gate, up, y, f, gate.stride(0), up.stride(0), y.stride(0),
                             GELU=act == "gelu_tanh", BLOCK=min(_pow2(f), 1024),
                             num_warps=ROW_WARPS)
        return y

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self._glu(gate, up, "gelu_tanh")

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self._glu(gate, up, "silu")

    def glu(self, y: torch.Tensor, act: GluAct) -> torch.Tensor:
        gate, up = y.chunk(2, dim=1)
        return self._glu(gate, up, act)

    def linear_glu(self, x: torch.Tensor, g: MatrixGroup, act: GluAct) -> torch.Tensor:
        gate, up = self.linear_group(x, g)
        return self._glu(gate, up, act)

    def add_rmsnorm_(self, x: torch.Tensor, o: torch.Tensor, post: torch.Tensor | None,
                     nxt: torch.Tensor, eps: float) -> torch.Tensor:
        if x.device != self.device or x.stride(-1) != 1:
            raise KernelError("add_rmsnorm_ updates x in place: it must be a contiguous "
                              "device tensor")
        o = self.to_device(o)
        t, n = x.shape
        y = torch.empty(t, n, dtype=torch.float32, device=self.device)
        if t:
            pw = self.to_device(post) if post is not None else x
            self.k.add_rmsnorm[(t,)](x, o, pw, self.to_device(nxt), y, n, x.stride(0),
                                     o.stride(0), y.stride(0), float(eps),
                                     HAS_POST=post is not None, BLOCK=_pow2(n),
                                     num_warps=ROW_WARPS)
        return y

    # ---- attention ---------------------------------------------------------------------------
    def _cache_table(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Device tables of each sequence's cache address and capacity (built once per list:
        the model passes the same lists to every layer)."""
        if self._ptrs is not None and self._ptrs[0] is k_caches and self._ptrs[1] is v_caches:
            return self._ptrs[2]
        for c in (*k_caches, *v_caches):
            if c.device != self.device or c.dtype != torch.float32 or not c.is_contiguous():
                raise KernelError("KV caches must be contiguous float32 tensors on the device "
                                  f"{self.device} (KVCache(device=...))")
        kb = torch.tensor([c.data_ptr() for c in k_caches], dtype=torch.int64)
        vb = torch.tensor([c.data_ptr() for c in v_caches], dtype=torch.int64)
        caps = torch.tensor([c.shape[-2] for c in k_caches], dtype=torch.int64)
        table = (kb.to(self.device), vb.to(self.device), caps.to(self.device))
        self._ptrs = (k_caches, v_caches, table)
        return table

    def qk_rope_attention(self, qkv: list[torch.Tensor], n_heads: int, n_kv_heads: int,
                          head_dim: int, q_norm: torch.Tensor | None,
                          k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                          sin: torch.Tensor, interleaved: bool, k_caches: list[torch.Tensor],
                          v_caches: list[torch.Tensor], layer: int, seq: torch.Tensor,
                          pos: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        H, KV, D = n_heads, n_kv_heads, head_dim
        y = torch.cat(qkv, dim=1) if len(qkv) > 1 else qkv[0]
        T = y.shape[0]
        q, k, v = (a.reshape(T, -1, D) for a in y.split([H * D, KV * D, KV * D], dim=1))
        cos, sin = self.to_device(cos), self.to_device(sin)
        q = rope(q if q_norm is None else self.rmsnorm(q, q_norm, eps), cos, sin, interleaved)
        k = rope(k if k_norm is None else self.rmsnorm(k, k_norm, eps), cos, sin, interleaved)
        k = k.reshape(T, KV * D).contiguous()
        v = v.reshape(T, KV * D).contiguous()
        q = q.reshape(T, H * D).contiguous()
        seq_d, pos_d = self.to_device(seq), self.to_device(pos)
        kb, vb, caps = self._cache_table(k_caches, v_caches)
        _check_heads(H, KV, D)  # before anything is written
        out = torch.empty(T, H * D, dtype=torch.float32, device=self.device)
        if T:
            # the cache is written before attention reads it (same stream: in order)
            self.k.kv_write[(T, KV)](k, v, kb, vb, caps, seq_d, pos_d, layer, k.stride(0),
                                     v.stride(0), KV=KV, D=D, num_warps=1)
            self._attend(q, out, kb, vb, caps, seq_d, pos_d, layer, window, scale, H, KV, D)
        return out

    def _attend(self, q: torch.Tensor, out: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                caps: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, layer: int,
                window: int, scale: float, H: int, KV: int, D: int) -> None:
        _check_heads(H, KV, D)
        g = H // KV
        self.k.attention[(q.shape[0], KV)](
            q, out, kb, vb, caps, seq, pos, layer, q.stride(0), out.stride(0), int(window),
            float(scale), H=H, KV=KV, D=D, G=g, GP=_pow2(g), BLOCK_N=self.attn_block_n(q.shape[0]),
            num_warps=ROW_WARPS)

    def attention(self, q: torch.Tensor, k_caches: list[torch.Tensor],
                  v_caches: list[torch.Tensor], seq: torch.Tensor, pos: torch.Tensor,
                  window: int, scale: float) -> torch.Tensor:
        """Attention over per-layer caches [KV, cap, D] (``Ops.attention``): the caches given
        as one-layer tensors, i.e. layer 0 of [1, KV, cap, D] views."""
        T, H, D = q.shape
        kc = [c.unsqueeze(0) for c in k_caches]
        vc = [c.unsqueeze(0) for c in v_caches]
        KV = kc[0].shape[1]
        kb, vb, caps = self._cache_table(kc, vc)
        qd = self.to_device(q).reshape(T, H * D).contiguous()
        out = torch.empty(T, H * D, dtype=torch.float32, device=self.device)
        if T:
            self._attend(qd, out, kb, vb, caps, self.to_device(seq), self.to_device(pos), 0,
                         window, scale, H, KV, D)
        return out.reshape(T, H, D)


class DeviceTorchOps(TorchOps):
    """Plain torch ops (cuBLAS, SDPA; NOT batch invariant) on a device: the comparison
    ``scripts/gpu-check`` measures the cost of invariance against, same model code (its cache
    writes and attention loop over the batch's sequences in Python, as TorchOps does on the
    CPU: at batch 64 that loop is part of what it costs)."""

    def __init__(self, device: str = "cuda") -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            require_cuda()

    def prepare(self, w: Matrix) -> Matrix:
        w.f32 = w.dense().to(self.device)
        if w.blocks is not None:
            w.blocks = w.blocks.to(self.device)
            w.q8_0 = w.blocks if w.qtype == "Q8_0" else None
        return w

    def _d(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return super().rmsnorm(self._d(x), self._d(w), eps)

    def add_rmsnorm_(self, x: torch.Tensor, o: torch.Tensor, post: torch.Tensor | None,
                     nxt: torch.Tensor, eps: float) -> torch.Tensor:
        return super().add_rmsnorm_(x, o, None if post is None else self._d(post),
                                    self._d(nxt), eps)

    def qk_rope_attention(self, qkv: list[torch.Tensor], n_heads: int, n_kv_heads: int,
                          head_dim: int, q_norm: torch.Tensor | None,
                          k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                          sin: torch.Tensor, interleaved: bool, k_caches: list[torch.Tensor],
                          v_caches: list[torch.Tensor], layer: int, seq: torch.Tensor,
                          pos: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        # seq/pos index device tensors (the cache writes): on the device too
        return super().qk_rope_attention(qkv, n_heads, n_kv_heads, head_dim, q_norm, k_norm,
                                         eps, self._d(cos), self._d(sin), interleaved,
                                         k_caches, v_caches, layer, self._d(seq), self._d(pos),
                                         window, scale)

    def attention(self, q: torch.Tensor, k_caches: list[torch.Tensor],
                  v_caches: list[torch.Tensor], seq: torch.Tensor, pos: torch.Tensor,
                  window: int, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        n_heads = q.shape[1]
        seq_l, pos_l = seq.tolist(), pos.tolist()
        by_seq: dict[int, list[int]] = {}
        for i, s in enumerate(seq_l):
            by_seq.setdefault(s, []).append(i)
        for s, rows_l in by_seq.items():
            rows = torch.tensor(rows_l, device=self.device)
            p = torch.tensor([pos_l[i] for i in rows_l], device=self.device)
            n_keys = max(pos_l[i] for i in rows_l) + 1
            k = k_caches[s][:, :n_keys]
            v = v_caches[s][:, :n_keys]
            rep = n_heads // k.shape[0]
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            kpos = torch.arange(n_keys, device=self.device)
            mask = kpos[None, :] <= p[:, None]
            if window > 0:
                mask &= kpos[None, :] > p[:, None] - window
            qs = q.index_select(0, rows).transpose(0, 1)
            o = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=mask,
                                                                 scale=scale)
            out.index_copy_(0, rows, o.transpose(0, 1))
        return out


def device_ops(mode: KernelMode, device: str) -> Any:
    """The Ops for ``mode`` on ``device``: ``cpu`` engine.ops.make_ops's (C++ kernels, plain
    torch); ``cuda`` the Triton kernels or plain torch on the GPU."""
    if device == "cpu":
        return make_ops(mode)
    if mode == "invariant":
        return TritonOps(device)
    if mode == "fast":
        return DeviceTorchOps(device)
    raise ValueError(f"unknown kernel mode {mode!r}")


def hardware_facts(ops: Any) -> tuple[str, dict[str, Any]]:
    """(hardware_class, reported facts) of an engine on ``ops`` off the CPU path."""
    dev = getattr(ops, "device", torch.device("cpu"))
    reported: dict[str, Any] = {"triton": triton_version(), "kernel_configs": kernel_configs(),
                                "compute_dtype": COMPUTE_DTYPE}
    if dev.type == "cuda":
        desc = cuda_description()
        reported.update(desc)
        return f"cuda:{desc['sku']}", reported
    # Triton's interpreter on CPU tensors (tests, dry runs): numpy's bits, never a GPU's
    return f"cpu:triton-interpret;torch:{torch.__version__}", reported
