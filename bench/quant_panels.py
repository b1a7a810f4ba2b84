"""Decode-size cost of the quantized panels (issue 19): bytes streamed per token and GEMV time.

Runs against whatever ``verinfer`` is first on PYTHONPATH, so two builds (e.g. a worktree at
main and one with new panels) can be compared by alternating subprocesses:

  python bench/quant_panels.py --part stream|gemma --compare OLD_SRC NEW_SRC [--isa avx2]
  python bench/quant_panels.py --part stream|gemma --old-so OLD_BUILD/_kernels...so  (one process)

Parts (each prints one JSON line; ``--compare`` alternates OLD/NEW runs and prints medians):
  stream     M = 1 GEMV per format over many distinct copies of one Gemma 3 270M-shaped matrix
             (more bytes than the last-level cache, so every weight comes from memory), best of
             a few passes: us per matrix and the GB/s of packed bytes it streamed; and M = 128
             on one matrix (the large-M path: panel groups dequantized into scratch).
  gemma      Gemma 3 270M Q4_K_M (the embedded file): packed bytes a batch-1 decode step reads
             (every layer matrix once + the LM head), decode tok/s over greedy steps, and the
             generation's logit digest (must not change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch

# Gemma 3 270M shapes [N, K] per GGUF type (gate/up 2048x640 Q5_0, o 640x1024 Q4_K, down
# 640x2048 Q6_K, v 256x640 Q8_0 in half the layers).
STREAM = [("Q5_0", 2048, 640), ("Q4_K", 640, 1024), ("Q6_K", 640, 2048), ("Q8_0", 2048, 640)]
STREAM_BYTES = 640 << 20  # > the 480 MiB L3 this VM reports


def _rows(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    """Random GGUF rows with ordinary fp16 scales (random bits elsewhere)."""
    from verinfer.engine import kernels as vk

    per, nbytes = vk.QUANT_BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // per, nbytes), dtype=np.uint8)
    offs = {"Q8_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}[qtype]
    for off in offs:
        h = (rng.uniform(-1, 1, (n, k // per)) * 0.01).astype(np.float16)
        raw[:, :, off:off + 2] = h.view(np.uint8).reshape(n, k // per, 2)
    return torch.from_numpy(raw.reshape(n, -1))


def stream(rounds: int) -> dict[str, Any]:
    from verinfer.engine import kernels as vk

    out: dict[str, Any] = {"isa": vk.isa(), "threads": torch.get_num_threads()}
    for qtype, n, k in STREAM:
        one = vk.pack_quant(_rows(qtype, n, k, 1), qtype, k)
        copies = [one.clone() for _ in range(max(2, STREAM_BYTES // one.numel()))]
        x = torch.randn(1, k)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for w in copies:
                vk.linear_quant_packed(x, w, qtype, n, k)
            best = min(best, (time.perf_counter() - t0) / len(copies))
        out[f"{qtype}_{n}x{k}_bytes"] = one.numel()
        out[f"{qtype}_{n}x{k}_us"] = round(best * 1e6, 2)
        out[f"{qtype}_{n}x{k}_gbs"] = round(one.numel() / best / 1e9, 2)
        del copies
        x = torch.randn(128, k)  # large M (prefill, replay): panels dequantized into scratch
        best = float("inf")
        for _ in range(rounds * 2):
            t0 = time.perf_counter()
            for _ in range(4):
                vk.linear_quant_packed(x, one, qtype, n, k)
            best = min(best, (time.perf_counter() - t0) / 4)
        out[f"{qtype}_{n}x{k}_m128_us"] = round(best * 1e6, 1)
    return out


def _matrices(obj: Any, seen: set[int], found: list[Any]) -> None:
    from verinfer.engine.ops import Matrix

    if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, bytes, torch.Tensor)):
        return
    seen.add(id(obj))
    if isinstance(obj, Matrix):
        found.append(obj)
        return
    if isinstance(obj, dict):
        for v in obj.values():
            _matrices(v, seen, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _matrices(v, seen, found)
    elif type(obj).__module__.startswith("verinfer") and hasattr(obj, "__dict__"):
        for v in list(vars(obj).values()):
            _matrices(v, seen, found)


def gemma(tokens: int) -> dict[str, Any]:
    from verinfer.engine import kernels as vk
    from verinfer.engine.engine import Engine
    from verinfer.engine.loader import embedded_model_path, load_model
    from verinfer.protocol.sampling_params import SamplingParams

    engine = Engine(load_model(embedded_model_path()), "invariant", max_seqs=2)
    try:
        found: list[Any] = []
        _matrices(engine.model, set(), found)
        storages: dict[int, int] = {}
        by_type: dict[str, int] = {}
        for m in found:
            if m.packed is None:
                continue
            st = m.packed.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
            key = str(m.qtype)
            by_type[key] = by_type.get(key, 0) + m.packed.numel() * m.packed.element_size()
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        digest = engine.generate([2, *range(1000, 1015)], params).logit_digest.hex()
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        engine.generate([2, *range(2000, 2015)], params)  # warm
        t0 = time.perf_counter()
        engine.generate([2, *range(3000, 3015)], params)
        dt = time.perf_counter() - t0
    finally:
        engine.close()
    return {"isa": vk.isa(), "packed_mb": round(sum(storages.values()) / 1e6, 2),
            "packed_mb_by_type": {k: round(v / 1e6, 2) for k, v in sorted(by_type.items())},
            "tok_s": round(tokens / dt, 2), "digest": digest}


def load_so(path: str) -> Any:
    """Another build's extension as its own module (the init symbol is PyInit__kernels, so the
    module's last name must stay ``_kernels``); its globals (ISA, pool) are its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vi_old_build._kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def stream_ab(old_so: str, rounds: int) -> dict[str, Any]:
    """The stream part with the old build's kernels and this one's in ONE process, passes
    alternating, so load hits both alike: median and best us per matrix of each."""
    from verinfer.engine import kernels as vk

    old = load_so(old_so)
    isa = vk.isa()
    old.set_isa(isa)
    # one thread: count the thread's CPU time, so that being descheduled on a shared machine is
    # not counted (memory and cache contention still are); more threads: wall time
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    out: dict[str, Any] = {"isa": isa, "threads": torch.get_num_threads(),
                           "clock": clock.__name__}
    for qtype, n, k in STREAM:
        raw = _rows(qtype, n, k, 1)
        x = torch.randn(1, k)
        sets = {"old": (old, old.pack_quant(raw, qtype, k)),
                "new": (vk, vk.pack_quant(raw, qtype, k))}
        assert torch.equal(sets["old"][0].linear_quant_packed(x, sets["old"][1], qtype, n, k),
                           vk.linear_quant_packed(x, sets["new"][1], qtype, n, k))
        times: dict[str, list[float]] = {"old": [], "new": []}
        for name, (mod, one) in sets.items():
            copies = [one.clone() for _ in range(max(2, STREAM_BYTES // one.numel()))]
            sets[name] = (mod, copies)
        for r in range(rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                mod, copies = sets[name]
                t0 = clock()
                for w in copies:
                    mod.linear_quant_packed(x, w, qtype, n, k)
                times[name].append((clock() - t0) / len(copies) * 1e6)
        for name in ("old", "new"):
            nbytes = sets[name][1][0].numel()
            out[f"{qtype}_{n}x{k}_{name}_bytes"] = nbytes
            out[f"{qtype}_{n}x{k}_{name}_us_median"] = round(statistics.median(times[name]), 1)
            out[f"{qtype}_{n}x{k}_{name}_us_best"] = round(min(times[name]), 1)
        out[f"{qtype}_{n}x{k}_new_over_old_median"] = round(
            statistics.median(times["new"]) / statistics.median(times["old"]), 3)
        out[f"{qtype}_{n}x{k}_new_over_old_best"] = round(min(times["new"]) / min(times["old"]), 3)
        out[f"{qtype}_{n}x{k}_new_over_old_paired"] = round(statistics.median(  # adjacent passes
            a / b for a, b in zip(times["new"], times["old"], strict=True)), 3)
        del sets
        # large M on one matrix (from the caches): the prefill/replay path
        xl = torch.randn(128, k)
        big = {"old": (old, old.pack_quant(raw, qtype, k)),
               "new": (vk, vk.pack_quant(raw, qtype, k))}
        tl: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(rounds * 2):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                mod, w = big[name]
                t0 = clock()
                for _ in range(4):
                    mod.linear_quant_packed(xl, w, qtype, n, k)
                tl[name].append((clock() - t0) / 4 * 1e6)
        out[f"{qtype}_{n}x{k}_m128_new_over_old_median"] = round(
            statistics.median(tl["new"]) / statistics.median(tl["old"]), 3)
        out[f"{qtype}_{n}x{k}_m128_new_over_old_best"] = round(min(tl["new"]) / min(tl["old"]), 3)
        out[f"{qtype}_{n}x{k}_m128_old_us_median"] = round(statistics.median(tl["old"]), 1)
    return out


def gemma_ab(old_so: str, tokens: int, rounds: int) -> dict[str, Any]:
    """Gemma 3 270M decode with the old build's kernels and this one's in ONE process: two
    engines, each packed by its own build, generating in alternation (the kernels module's
    extension is switched between calls; the engines' worker threads are idle then)."""
    from verinfer.engine import kernels as vk
    from verinfer.engine.engine import Engine
    from verinfer.engine.loader import embedded_model_path, load_model
    from verinfer.protocol.sampling_params import SamplingParams

    old = load_so(old_so)
    isa = vk.isa()
    old.set_isa(isa)
    exts = {"old": old, "new": vk._ext}
    # one thread: the process's CPU time (the engine's worker computes, the caller waits), so
    # that being descheduled on a shared machine is not counted; more threads: wall time
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    # a build before panel_format packed every type into its own layout (session 7's panels)
    legacy = {"Q8_0": "q8", "Q5_0": "q5_0", "Q4_1": "q4_1", "Q4_K": "q4_k", "Q6_K": "q6_k"}
    panel_layout = vk.panel_layout

    def layout_of(ext: Any) -> Any:
        if hasattr(ext, "panel_format"):
            return panel_layout
        return lambda q: "f32" if q is None else legacy[q]

    layouts = {name: layout_of(ext) for name, ext in exts.items()}

    def use(name: str) -> None:
        vk._ext = exts[name]
        vk.panel_layout = layouts[name]

    engines = {}
    for name in ("old", "new"):
        use(name)
        engines[name] = Engine(load_model(embedded_model_path()), "invariant", max_seqs=2)
    tok_s: dict[str, list[float]] = {"old": [], "new": []}
    digests: dict[str, set[str]] = {"old": set(), "new": set()}
    try:
        for name in ("old", "new"):
            use(name)
            engines[name].generate([2, *range(2000, 2015)], SamplingParams(max_tokens=8))
        for r in range(rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                use(name)
                params = SamplingParams(max_tokens=tokens, ignore_eos=True)
                t0 = clock()
                res = engines[name].generate([2, *range(1000, 1015)], params)
                tok_s[name].append(tokens / (clock() - t0))
                digests[name].add(res.logit_digest.hex())
    finally:
        for e in engines.values():
            e.close()
        use("new")
    med = {n: round(statistics.median(v), 2) for n, v in tok_s.items()}
    return {"isa": isa, "threads": torch.get_num_threads(), "rounds": rounds, "tokens": tokens,
            "tok_s_median": med, "new_over_old": round(med["new"] / med["old"], 3),
            "tok_s_all": {n: [round(t, 2) for t in v] for n, v in tok_s.items()},
            "digests_equal": digests["old"] == digests["new"] and len(digests["new"]) == 1,
            "clock": clock.__name__, "load": os.getloadavg()[0]}


def compare(old: str, new: str, part: str, rounds: int, isa: str | None, tokens: int) -> None:
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    env = dict(os.environ)
    if isa:
        env["VERINFER_KERNEL_ISA"] = isa
    for r in range(rounds):
        order = (("old", old), ("new", new))
        for name, src in order if r % 2 == 0 else order[::-1]:
            cmd = [sys.executable, __file__, "--part", part, "--tokens", str(tokens)]
            res = subprocess.run(cmd, env={**env, "PYTHONPATH": src}, capture_output=True,
                                 text=True, check=True)
            line = json.loads(res.stdout.strip().splitlines()[-1])
            runs[name].append(line)
            print(name, json.dumps(line), flush=True)
    summary: dict[str, Any] = {}
    for key, val in runs["old"][0].items():
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            o = statistics.median(x[key] for x in runs["old"])
            n = statistics.median(x[key] for x in runs["new"])
            summary[key] = {"old": o, "new": n, "new_over_old": round(n / o, 3) if o else None}
    print(json.dumps({"part": part, "isa": runs["new"][0].get("isa"), "rounds": rounds,
                      "load": os.getloadavg()[0], "median": summary}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=["stream", "gemma"], default="stream")
    ap.add_argument("--compare", nargs=2, metavar=("OLD_SRC", "NEW_SRC"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--isa", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--old-so", help="another build's _kernels .so: stream both in one process")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.old_so and a.part == "gemma":
        print(json.dumps(gemma_ab(a.old_so, a.tokens, a.rounds * 4)))
    elif a.old_so:
        print(json.dumps(stream_ab(a.old_so, a.rounds * 4)))
    elif a.compare:
        compare(a.compare[0], a.compare[1], a.part, a.rounds, a.isa, a.tokens)
    elif a.part == "stream":
        print(json.dumps(stream(5)))
    else:
        print(json.dumps(gemma(a.tokens)))


if __name__ == "__main__":
    main()
