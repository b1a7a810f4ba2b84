"""Engine benchmark on the embedded Gemma 3 270M (and SmolLM2-135M-Instruct, Q4_1): invariant
kernels vs HF transformers and vs llama.cpp.

Run from the repository root: ``.venv/bin/python bench/engine.py [options]`` (or ``verinfer bench
engine``; ``--help`` lists the options: prompt length, new tokens, batch sizes, rounds, parts to
skip). Prints progress lines, then one JSON object as the last line.

Method (one process, one run, so ratios share the machine's noise): the engines are loaded, then
rounds alternate ours / HF / llama.cpp; each side's median over the rounds is reported.
* ``invariant_tok_s_bB`` / ``hf_tok_s_bB`` / ``ratio_bB``: generated tokens of the whole batch over
  wall time including prefill, as HF ``generate`` does (greedy, EOS ignored).
* ``invariant_decode_tok_s_bB``: decode only -- tokens after the first over the time from the first
  token (which ends the prefill) to the last, per the engine's on_step callbacks.
* ``llamacpp_decode_tok_s_b1`` / ``own_over_llamacpp_b1``: the same decode-only measure for
  llama.cpp (llama-cpp-python from ``scripts/bootstrap-bench``, run by bench/llamacpp_decode.py in a
  subprocess of .venv-bench) on the same GGUF file, same prompt ids, same thread count, batch 1;
  ``greedy_agree_tokens``: how many greedy ids the two produce alike before they first differ
  (llama.cpp quantizes activations to 8 bits, so they part at the first near-tie). Skipped, with
  a line saying so, when .venv-bench cannot import llama_cpp.
* Replay: wall time of one replay pass over a 128-token generation / the wall time it took to
  generate those tokens (``replay_ratio``); ``replay_gflops`` counts its matmul FLOPs (2 x weights x
  tokens for the layers, 2 x vocab x dim per logit row) over its wall time, and
  ``replay_share_of_fma_peak`` divides that by ``sgemm_peak_gflops``, torch's MKL sgemm on
  1024^3 (best of 10) at the same thread count in the same run: the FMA throughput this machine
  delivers.
* Peak RSS: VmHWM of a real ``verinfer serve`` process (with its evidence pipeline: receipts,
  envelopes, outbox, publisher) holding the model after it has answered a request.
SmolLM2: the same batch-1 rounds against HF's ``LlamaForCausalLM`` on the same GGUF
(``smollm2_tok_s_b1``, ``smollm2_hf_tok_s_b1``, ``smollm2_ratio_b1``). ``--models smollm2`` runs
only that part (``gemma``: only Gemma's).
``--smoke`` (CI, tests/slow/test_bench_smoke_gemma.py): every part once at the smallest sizes
(prompt 4, 2 new tokens, batch 1, 1 round, an 8-token replay, 1 sgemm): it checks that the
bench runs, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import time_generate_then_replay
from hf_reference import hf_generate_tok_s, load_hf_model
from verinfer.engine import kernels
from verinfer.engine.engine import Engine, StepEvent
from verinfer.engine.fingerprint import cpu_description
from verinfer.engine.loader import embedded_model_path, load_model, smollm2_model_path
from verinfer.protocol.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (default 16)")
    ap.add_argument("--new-tokens", type=int, default=128, help="generated tokens (default 128)")
    ap.add_argument("--batch-sizes", default="1,4", help="comma-separated (default 1,4)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    ap.add_argument("--models", default="gemma,smollm2", help="gemma, smollm2 or both")
    for part in ("hf", "llamacpp", "replay", "rss"):
        ap.add_argument(f"--no-{part}", action="store_true", help=f"skip the {part} part")
    ap.add_argument("--smoke", action="store_true",
                    help="CI smoke run: smallest sizes, every part once (overrides the sizes)")
    args = ap.parse_args(argv)
    args.replay_tokens, args.sgemm_reps = (8, 1) if args.smoke else (128, 10)
    if args.smoke:
        args.prompt_len, args.new_tokens, args.batch_sizes, args.rounds = 4, 2, "1", 1
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    if args.prompt_len < 1 or args.new_tokens < 2 or not args.batch_sizes or args.rounds < 1:
        ap.error("need --prompt-len >= 1, --new-tokens >= 2, a batch size and --rounds >= 1")
    return args


def prompts(batch: int, seed: int, length: int, vocab: int = 262_144,
            bos: int | None = None) -> list[list[int]]:
    """Random ids (clear of the low special ids, inside the vocabulary) after the model's BOS, as
    a tokenizer would start them: without it, Gemma's logits are a flat mess of near-ties and
    engines that round differently part at once."""
    rng = random.Random(seed)
    top = min(vocab, 200_000)
    head = [] if bos is None else [bos]
    return [head + [rng.randrange(1000, top) for _ in range(length - len(head))]
            for _ in range(batch)]


def ours_round(engine: Engine, batch: int, seed: int, args: argparse.Namespace
               ) -> tuple[float, float, list[int]]:
    """(tok/s incl. prefill, decode-only tok/s, greedy ids of the first prompt)."""
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    ps = prompts(batch, seed, args.prompt_len, engine.config.vocab_size, args.bos)
    firsts: list[float] = []
    lasts: list[float] = []

    def on_step(ev: StepEvent) -> None:
        if ev.index == 0:
            firsts.append(time.perf_counter())
        if ev.finished is not None:
            lasts.append(time.perf_counter())

    t0 = time.perf_counter()
    futs = [engine.submit(p, params, on_step=on_step) for p in ps]
    results = [f.result() for f in futs]
    total = time.perf_counter() - t0
    n = sum(len(r.token_ids) for r in results)
    decode = (n - batch) / (max(lasts) - max(firsts))
    return n / total, decode, results[0].token_ids


class LlamaCpp:
    """llama-cpp-python in a subprocess of .venv-bench (bench/llamacpp_decode.py)."""

    def __init__(self, model: Path, threads: int, ctx: int) -> None:
        self.proc = subprocess.Popen(
            [str(BENCH_PYTHON), str(ROOT / "bench" / "llamacpp_decode.py"), str(model),
             str(threads), str(ctx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = str(self._read()["version"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"bench/llamacpp_decode.py exited with {self.proc.wait()}")
        return dict(json.loads(line))

    def run(self, prompt: list[int], new_tokens: int) -> tuple[float, list[int]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "new_tokens": new_tokens}) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        return float(out["decode_tok_s"]), [int(i) for i in out["ids"]]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def llamacpp_available() -> str | None:
    """None when the llama.cpp comparison can run, else why not."""
    if not BENCH_PYTHON.exists():
        return "no .venv-bench (run scripts/bootstrap-bench)"
    probe = subprocess.run([str(BENCH_PYTHON), "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        return "llama_cpp is not importable in .venv-bench (run scripts/bootstrap-bench)"
    return None


def agree_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def matmul_weights(engine: Engine) -> tuple[int, int]:
    """(weights in the layers' matrices, vocab x dim of the LM head)."""
    w = engine.loaded.weights
    shapes = [tuple(t.shape) for n, t in w.f32.items() if n.startswith("blk.") and t.dim() == 2]
    shapes += [w.matrix(n).shape for n in w.blocks if n.startswith("blk.")]
    layer = sum(n * k for n, k in shapes)
    cfg = engine.config
    return layer, cfg.vocab_size * cfg.dim


def sgemm_peak_gflops(reps: int = 10) -> float:
    """Best of 10 MKL sgemms of 1024^3: what the FMA units deliver here (the best run is the
    one least disturbed by other processes on a shared machine)."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / best / 1e9


def replay_measure(engine: Engine, prompt_len: int, tokens: int = 128, sgemm_reps: int = 10
                   ) -> dict[str, float]:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    p = prompts(1, 99, prompt_len)[0]
    timing = time_generate_then_replay(engine, p, params)
    res, gen_s, rep_s = timing.generation, timing.generate_s, timing.replay_s
    layer, head = matmul_weights(engine)
    flops = 2 * layer * (len(p) + len(res.token_ids)) + 2 * head * len(res.token_ids)
    peak = sgemm_peak_gflops(sgemm_reps)
    log(f"replay: generate {tokens} tokens {gen_s:.2f}s, replay {rep_s:.2f}s, "
        f"{flops / rep_s / 1e9:.1f} GFLOP/s of {peak:.1f} (MKL sgemm)")
    return {"replay_ratio": round(rep_s / gen_s, 4), "replay_generate_s": round(gen_s, 3),
            "replay_s": round(rep_s, 3), "replay_gflops": round(flops / rep_s / 1e9, 2),
            "sgemm_peak_gflops": round(peak, 2),
            "replay_share_of_fma_peak": round(flops / rep_s / 1e9 / peak, 3)}


def server_peak_rss_mb() -> float:
    """Start `verinfer serve`, send one request, read the process's peak RSS (VmHWM)."""
    import socket
    import tempfile

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Path(tempfile.mkdtemp(prefix="verinfer-bench-")) / "operator"
    subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(state),
                    "--light-kdf", "--unsafe-dev"], check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "verinfer", "serve", "--port", str(port),
                             "--name", "default", "--operator-dir", str(state), "--unsafe-dev"],
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise SystemExit(f"verinfer serve exited with {proc.returncode}: {err}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
            "model": "default", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hello"}]})
        r.raise_for_status()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        hwm_kb = next(int(line.split()[1]) for line in status.splitlines()
                      if line.startswith("VmHWM:"))
        return hwm_kb / 1024
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def smollm2(args: argparse.Namespace) -> dict[str, float]:
    """Batch-1 generation on SmolLM2 vs HF, alternating rounds (medians)."""
    path = smollm2_model_path()
    engine = Engine(load_model(path), "invariant", max_seqs=8)
    args.bos = engine.tokenizer.spec.bos_id
    hf, _ = load_hf_model(path, tokenizer=False)
    ours_round(engine, 1, 0, args)  # warm up
    res: dict[str, list[float]] = {"ours": [], "hf": []}
    for r in range(args.rounds):
        res["ours"].append(ours_round(engine, 1, r, args)[0])
        res["hf"].append(hf_generate_tok_s(hf, 1, args.prompt_len, args.new_tokens, seed=r))
        log(f"smollm2 round {r}: ours={res['ours'][-1]:.2f} hf={res['hf'][-1]:.2f}")
    engine.close()
    ours, ref = statistics.median(res["ours"]), statistics.median(res["hf"])
    return {"smollm2_hf_tok_s_b1": round(ref, 3), "smollm2_tok_s_b1": round(ours, 3),
            "smollm2_ratio_b1": round(ours / ref, 3)}


def gemma(args: argparse.Namespace) -> dict[str, Any]:
    path = embedded_model_path()
    log(f"threads={torch.get_num_threads()} isa={kernels.isa()} model={path}")
    engine = Engine(load_model(path), "invariant", max_seqs=8)
    args.bos = engine.tokenizer.spec.bos_id
    hf = None if args.no_hf else load_hf_model(path, tokenizer=False)[0]  # ids in, ids out
    llama: LlamaCpp | None = None
    why_not = "skipped (--no-llamacpp)" if args.no_llamacpp else llamacpp_available()
    if why_not is None:
        llama = LlamaCpp(path, args.threads, args.prompt_len + args.new_tokens + 8)
        log(f"llama.cpp: llama-cpp-python {llama.version}, {args.threads} threads")
    else:
        log(f"llama.cpp comparison: {why_not}")
    ours_round(engine, 1, 0, args)  # warm up (first touch of weights, rope tables)
    res: dict[str, list[float]] = {}
    agree: list[int] = []
    for r in range(args.rounds):
        for b in args.batch_sizes:
            full, decode, ids = ours_round(engine, b, r, args)
            res.setdefault(f"ours_b{b}", []).append(full)
            res.setdefault(f"ours_decode_b{b}", []).append(decode)
            if b == 1 and llama is not None:
                first = prompts(1, r, args.prompt_len, engine.config.vocab_size, args.bos)[0]
                tok_s, their_ids = llama.run(first, args.new_tokens)
                res.setdefault("llamacpp_decode_b1", []).append(tok_s)
                agree.append(agree_prefix(ids, their_ids))
            if hf is not None:
                res.setdefault(f"hf_b{b}", []).append(
                    hf_generate_tok_s(hf, b, args.prompt_len, args.new_tokens, seed=r))
        log(f"round {r}: " + ", ".join(f"{k}={v[-1]:.2f}" for k, v in res.items()))
    del hf
    if llama is not None:
        llama.close()
    med = {k: statistics.median(v) for k, v in res.items()}
    out: dict[str, Any] = {}
    for b in args.batch_sizes:
        if f"hf_b{b}" in med:
            out[f"hf_tok_s_b{b}"] = round(med[f"hf_b{b}"], 3)
        out[f"invariant_tok_s_b{b}"] = round(med[f"ours_b{b}"], 3)
        out[f"invariant_decode_tok_s_b{b}"] = round(med[f"ours_decode_b{b}"], 3)
        if f"hf_b{b}" in med:
            out[f"ratio_b{b}"] = round(med[f"ours_b{b}"] / med[f"hf_b{b}"], 3)
    if "llamacpp_decode_b1" in med and "ours_decode_b1" in med:
        out["llamacpp_decode_tok_s_b1"] = round(med["llamacpp_decode_b1"], 3)
        out["own_over_llamacpp_b1"] = round(med["ours_decode_b1"] / med["llamacpp_decode_b1"], 3)
        out["greedy_agree_tokens"] = min(agree)
        out["llamacpp_version"] = llama.version if llama else None
    if not args.no_replay:
        out.update(replay_measure(engine, args.prompt_len, args.replay_tokens, args.sgemm_reps))
    engine.close()
    del engine
    if not args.no_rss:
        out["peak_rss_mb"] = round(server_peak_rss_mb(), 1)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    which = args.models.split(",")
    out: dict[str, Any] = {}
    if "gemma" in which:
        out.update(gemma(args))
    if "smollm2" in which and not args.no_hf:
        out.update(smollm2(args))
    out.update({"rounds": args.rounds, "threads": torch.get_num_threads(),
                "kernel_isa": kernels.isa(), "cpu": cpu_description()[0],
                "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                "batch_sizes": args.batch_sizes})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
