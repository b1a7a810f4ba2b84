"""Micro-benchmark: verinfer kernels vs torch.nn.functional.linear (MKL).

Usage: python bench/kernels.py [--threads N] [--quick] [--quant] [--smoke]
Prints a table, then one JSON object (all timings in ms, best of a few repeats) as the last line.
Per shape, F.linear (MKL), linear (dot16 family) and linear_packed (packed outer-product family)
are timed interleaved; for the LM-head shape also linear_q8_0 and linear_q8_0_packed.
``--quant`` instead times the quantized panels of every GGUF block type the engine reads, at the
Gemma 3 270M shapes that use it, against the fp32 panels of the same (dequantized) values: decode
(M <= 4) should gain from reading fewer bytes; at large M the quantized path dequantizes a panel
group into scratch, and this shows what that costs against holding an fp32 copy.
``--smoke`` (CI, tests/integration/test_bench_smoke.py): every kernel once at M = 1 and 4, the
LM-head shape cut to 4,096 rows: it checks that the bench runs, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from verinfer.engine import kernels

SHAPES = [(2048, 640), (640, 2048), (1024, 640), (262144, 640)]  # [N, K] of Gemma 3 270M
ROWS = [1, 4, 128, 600]
LM_HEAD_N = 262144
SMOKE_LM_HEAD_N = 4096  # --smoke: the vocabulary-sized shape, small enough to run in CI


def best_ms(
    fns: list[Callable[[], object]], batch_s: float = 0.02, rounds: int = 12
) -> list[float]:
    """Best per-call time in ms of each fn; batches of the fns alternate so that load from other
    processes on this shared machine hits them alike, and the minimum filters it out."""
    reps = []
    for fn in fns:
        fn()
        t0 = time.perf_counter()
        fn()
        reps.append(max(1, int(batch_s / max(time.perf_counter() - t0, 1e-6))))
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(reps[i]):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / reps[i] * 1e3)
    return best


def q8_0_bytes(w: torch.Tensor) -> torch.Tensor:
    """Quantize fp32 [N, K] to GGUF Q8_0 bytes [N, K/32*34] (numpy-free, same layout as gguf)."""
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    d = blocks.abs().amax(dim=2, keepdim=True) / 127
    q = torch.where(d == 0, 0.0, blocks / d).round().clamp(-127, 127).to(torch.int8)
    dh = d.to(torch.float16).view(torch.uint8).reshape(n, k // 32, 2)
    return torch.cat([dh, q.view(torch.uint8)], dim=2).reshape(n, k // 32 * 34).contiguous()


QUANT_SHAPES = [("Q5_0", 2048, 640), ("Q5_0", 1024, 640), ("Q4_K", 640, 1024),
                ("Q6_K", 640, 2048), ("Q8_0", 262144, 640)]


def random_blocks(qtype: str, n: int, k: int) -> torch.Tensor:
    """Random GGUF rows with small, finite fp16 scales (the values do not matter for timing)."""
    per, nbytes = kernels.QUANT_BLOCKS[qtype]
    raw = torch.randint(0, 256, (n, k // per, nbytes), dtype=torch.uint8)
    half_at = {"Q6_K": [208], "Q4_1": [0, 2], "Q4_K": [0, 2]}.get(qtype, [0])
    for off in half_at:
        d = (torch.rand(n, k // per, 1) * 1e-3).to(torch.float16).view(torch.uint8)
        raw[:, :, off:off + 2] = d
    return raw.reshape(n, -1).contiguous()


def smoke_shapes(shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(SMOKE_LM_HEAD_N if n == LM_HEAD_N else n, k) for n, k in shapes]


def quant_main(rows_list: list[int], lm_head_n: int = LM_HEAD_N, rounds: int = 12
               ) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    print(f"{'type':>5} {'N':>7} {'K':>5} {'M':>4} {'fp32 ms':>9} {'quant ms':>9} {'fp32/q':>7}"
          f" {'q GB/s':>7}")
    for qtype, n, k in QUANT_SHAPES:
        n = lm_head_n if n == LM_HEAD_N else n
        raw = random_blocks(qtype, n, k)
        wqp = kernels.pack_quant(raw, qtype, k)
        wp = kernels.pack_f32(torch.randn(n, k))
        for m in rows_list:
            if n == lm_head_n and m > 4:
                continue
            x = torch.randn(m, k)
            f, q = best_ms([lambda x=x, wp=wp, n=n: kernels.linear_packed(x, wp, n),
                            lambda x=x, wqp=wqp, t=qtype, n=n, k=k:
                            kernels.linear_quant_packed(x, wqp, t, n, k)],
                           rounds=min(rounds, 6) if n == lm_head_n else rounds)
            gbs = wqp.numel() / (q * 1e-3) / 1e9
            rows.append({"qtype": qtype, "N": n, "K": k, "M": m, "fp32_ms": f, "quant_ms": q,
                         "quant_weight_gb_s": round(gbs, 2)})
            print(f"{qtype:>5} {n:>7} {k:>5} {m:>4} {f:9.3f} {q:9.3f} {f / q:7.2f} {gbs:7.2f}",
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--quick", action="store_true", help="skip M >= 128 on the LM-head shape")
    ap.add_argument("--quant", action="store_true", help="quantized panels vs fp32 panels")
    ap.add_argument("--smoke", action="store_true", help="CI smoke run: tiny shapes, 1 round")
    args = ap.parse_args()
    lm_head_n = SMOKE_LM_HEAD_N if args.smoke else LM_HEAD_N
    rows_m = [1, 4] if args.smoke else ROWS
    rounds_small, rounds_big = (1, 1) if args.smoke else (12, 4)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.quant:
        print(f"isa={kernels.isa()} threads={torch.get_num_threads()}")
        res = quant_main([1, 4] if args.quick or args.smoke else [1, 4, 128], lm_head_n,
                         rounds_small)
        print(json.dumps({"isa": kernels.isa(), "threads": torch.get_num_threads(),
                          "results": res}))
        return
    rows: list[dict[str, object]] = []
    print(f"isa={kernels.isa()} threads={torch.get_num_threads()}")
    print(
        f"{'op':>6} {'N':>7} {'K':>5} {'M':>4} {'F.linear':>9} {'vi':>9} {'packed':>9}"
        f" {'F/vi':>5} {'F/pk':>5} {'vi/pk':>6}"
    )

    def report(op: str, n: int, k: int, m: int, ref: float, ours: float, pk: float) -> None:
        rows.append(
            {"op": op, "N": n, "K": k, "M": m, "torch_ms": ref, "vi_ms": ours, "packed_ms": pk}
        )
        print(
            f"{op:>6} {n:>7} {k:>5} {m:>4} {ref:9.3f} {ours:9.3f} {pk:9.3f}"
            f" {ref / ours:5.2f} {ref / pk:5.2f} {ours / pk:6.2f}",
            flush=True,
        )

    for n, k in smoke_shapes(SHAPES) if args.smoke else SHAPES:
        w = torch.randn(n, k)
        wp = kernels.pack_f32(w)
        big = n == lm_head_n
        for m in rows_m:
            if big and m > 4 and args.quick:
                continue
            x = torch.randn(m, k)
            ref, ours, pk = best_ms(
                [
                    lambda x=x, w=w: F.linear(x, w),
                    lambda x=x, w=w: kernels.linear(x, w),
                    lambda x=x, wp=wp, n=n: kernels.linear_packed(x, wp, n),
                ],
                rounds=rounds_big if big and m > 4 else rounds_small,
            )
            report("fp32", n, k, m, ref, ours, pk)
        if big:
            wq = q8_0_bytes(w)
            wqp = kernels.pack_q8_0(wq, k)
            for m in rows_m:
                if m > 4 and args.quick:
                    continue
                x = torch.randn(m, k)
                ref, ours, pk = best_ms(
                    [
                        lambda x=x, w=w: F.linear(x, w),
                        lambda x=x, wq=wq, k=k: kernels.linear_q8_0(x, wq, k),
                        lambda x=x, wqp=wqp, n=n, k=k: kernels.linear_q8_0_packed(x, wqp, n, k),
                    ],
                    rounds=rounds_big if m > 4 else rounds_small,
                )
                report("q8_0", n, k, m, ref, ours, pk)
    print(json.dumps({"isa": kernels.isa(), "threads": torch.get_num_threads(), "results": rows}))


if __name__ == "__main__":
    main()
