"""Engine benchmark on the embedded Gemma 3 270M (and SmolLM2-135M-Instruct, Q4_1): invariant
kernels vs HF transformers.

Run from the repository root: ``.venv/bin/python bench/engine.py`` (or ``verinfer bench
engine``). Prints progress lines, then one JSON object as the last line.

Method (one process, one run, so ratios share the machine's noise): both engines are loaded,
then rounds alternate ours / HF for batch 1 and batch 4 (prompt 16 tokens, 64 new tokens,
greedy, EOS ignored); each side's median over the rounds is reported. tok/s counts generated
tokens of the whole batch over wall time including prefill, as HF ``generate`` does.
Replay: wall time of one replay pass over a 128-token generation / the wall time it took to
generate those tokens. Peak RSS: VmHWM of a real ``verinfer serve`` process (with its evidence
pipeline: receipts, envelopes, outbox, publisher) holding the model after it has answered a
request.
SmolLM2: the same batch-1 rounds against HF's ``LlamaForCausalLM`` on the same GGUF
(``smollm2_tok_s_b1``, ``smollm2_hf_tok_s_b1``, ``smollm2_ratio_b1``). ``BENCH_MODELS=smollm2``
runs only that part (``gemma``: only Gemma's).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_reference import hf_generate_tok_s, load_hf_model
from verinfer.engine import kernels
from verinfer.engine.engine import Engine
from verinfer.engine.fingerprint import cpu_description
from verinfer.engine.loader import embedded_model_path, load_model, smollm2_model_path
from verinfer.engine.sampling import SamplingParams

PROMPT_LEN, NEW_TOKENS, ROUNDS = 16, 64, int(os.environ.get("BENCH_ROUNDS", "3"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompts(batch: int, seed: int, vocab: int = 262_144) -> list[list[int]]:
    rng = random.Random(seed)
    top = min(vocab, 200_000)  # clear of the low special ids, inside the vocabulary
    return [[rng.randrange(1000, top) for _ in range(PROMPT_LEN)] for _ in range(batch)]


def ours_tok_s(engine: Engine, batch: int, seed: int) -> float:
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    ps = prompts(batch, seed, engine.config.vocab_size)
    t0 = time.perf_counter()
    futs = [engine.submit(p, params) for p in ps]
    n = sum(len(f.result().token_ids) for f in futs)
    return n / (time.perf_counter() - t0)


def replay_ratio(engine: Engine) -> tuple[float, float, float]:
    params = SamplingParams(max_tokens=128, ignore_eos=True)
    p = prompts(1, 99)[0]
    t0 = time.perf_counter()
    res = engine.generate(p, params)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = engine.replay(p, res.token_ids, params)
    rep_s = time.perf_counter() - t0
    if not rep.matches or rep.step_digests != res.step_digests:
        raise SystemExit("replay did not reproduce the decode bit for bit")
    return rep_s / gen_s, gen_s, rep_s


def server_peak_rss_mb() -> float:
    """Start `verinfer serve`, send one request, read the process's peak RSS (VmHWM)."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import tempfile

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


def smollm2() -> dict[str, float]:
    """Batch-1 decode on SmolLM2 vs HF, alternating rounds (medians)."""
    path = smollm2_model_path()
    engine = Engine(load_model(path), "invariant", max_seqs=8)
    hf, _ = load_hf_model(path, tokenizer=False)
    ours_tok_s(engine, 1, 0)  # warm up
    res: dict[str, list[float]] = {"ours": [], "hf": []}
    for r in range(ROUNDS):
        res["ours"].append(ours_tok_s(engine, 1, r))
        res["hf"].append(hf_generate_tok_s(hf, 1, PROMPT_LEN, NEW_TOKENS, seed=r))
        log(f"smollm2 round {r}: ours={res['ours'][-1]:.2f} hf={res['hf'][-1]:.2f}")
    engine.close()
    ours, ref = statistics.median(res["ours"]), statistics.median(res["hf"])
    return {"smollm2_hf_tok_s_b1": round(ref, 3), "smollm2_tok_s_b1": round(ours, 3),
            "smollm2_ratio_b1": round(ours / ref, 3)}


def main() -> None:
    which = os.environ.get("BENCH_MODELS", "gemma,smollm2").split(",")
    if "gemma" not in which:
        print(json.dumps({**smollm2(), "rounds": ROUNDS, "threads": torch.get_num_threads(),
                          "kernel_isa": kernels.isa(), "cpu": cpu_description()[0]}))
        return
    path = embedded_model_path()
    log(f"threads={torch.get_num_threads()} model={path}")
    engine = Engine(load_model(path), "invariant", max_seqs=8)
    hf, _ = load_hf_model(path)
    ours_tok_s(engine, 1, 0)  # warm up (first-touch of weights, rope tables)
    res: dict[str, list[float]] = {"ours_b1": [], "hf_b1": [], "ours_b4": [], "hf_b4": []}
    for r in range(ROUNDS):
        res["ours_b1"].append(ours_tok_s(engine, 1, r))
        res["hf_b1"].append(hf_generate_tok_s(hf, 1, PROMPT_LEN, NEW_TOKENS, seed=r))
        res["ours_b4"].append(ours_tok_s(engine, 4, r))
        res["hf_b4"].append(hf_generate_tok_s(hf, 4, PROMPT_LEN, NEW_TOKENS, seed=r))
        log(f"round {r}: " + ", ".join(f"{k}={v[-1]:.2f}" for k, v in res.items()))
    del hf
    ratio, gen_s, rep_s = replay_ratio(engine)
    log(f"replay: generate 128 tokens {gen_s:.2f}s, replay {rep_s:.2f}s")
    engine.close()
    del engine
    rss = server_peak_rss_mb()
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {
        "hf_tok_s_b1": round(med["hf_b1"], 3),
        "invariant_tok_s_b1": round(med["ours_b1"], 3),
        "ratio_b1": round(med["ours_b1"] / med["hf_b1"], 3),
        "hf_tok_s_b4": round(med["hf_b4"], 3),
        "invariant_tok_s_b4": round(med["ours_b4"], 3),
        "ratio_b4": round(med["ours_b4"] / med["hf_b4"], 3),
        "replay_ratio": round(ratio, 4),
        "replay_generate_s": round(gen_s, 3),
        "replay_s": round(rep_s, 3),
        "peak_rss_mb": round(rss, 1),
        "rounds": ROUNDS,
        "threads": torch.get_num_threads(),
        "kernel_isa": kernels.isa(),
        "cpu": cpu_description()[0],
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
    }
    if "smollm2" in which:
        out.update(smollm2())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
