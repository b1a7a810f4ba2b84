"""Serving benchmark: a real `verinfer serve --operator-dir` process on the embedded Gemma 3
270M, against the bare engine in-process and HF transformers `generate`.

Run from the repository root: ``.venv/bin/python bench/serve.py``. Progress goes to stderr;
the last stdout line is one JSON object.

Method (see docs/operator-bench.md):
- every request is a distinct chat prompt (no prefix can be reused), greedy, max_tokens 32,
  EOS honoured (nothing ignored: tokens are what `usage.completion_tokens` reports);
- server levels 1, 4 and 16 are closed loops of that many official-SDK clients; tok/s =
  completion tokens of the level / its wall time; p50/p99 = request latency percentiles;
- the server signs, seals and durably enqueues every response (operator dir, local DA,
  jsonl batch sink); the evidence time per response is the server's own histogram
  `verinfer_evidence_seconds` (_sum/_count deltas over the concurrency-1 level), and
  `overhead_fraction` = that mean / the mean end-to-end latency at concurrency 1;
- engine: the same prompt token ids through `Engine.submit` from 16 closed-loop threads;
- HF: `generate` (greedy, same prompt ids and token budget), one request after another.

Grammar overhead (issue 34, ``grammar_overhead_fraction``): SmolLM2 in-process at batch 1, a
``json_schema`` request (a Pydantic-shaped object) decoded greedily; the mask cost is the time of
the very work the engine does per step for it (``OutputState.allowed`` + ``push``: llguidance's
mask and the matcher's advance), re-run over the same output tokens, divided by the decode's
wall time. ``--grammar-only`` runs just this part.

``--smoke`` (CI, tests/slow/test_bench_smoke_gemma.py): the same parts, max_tokens 4, 2/4/16
requests at levels 1/4/16 and 1 HF request: it checks that the bench runs, not its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_reference import load_hf_model
from verinfer.engine.chat import ChatMessage, render_chat
from verinfer.engine.engine import Engine
from verinfer.engine.loader import embedded_model_path, load_model
from verinfer.protocol.sampling_params import SamplingParams

MAX_TOKENS = 32
LEVELS = {1: int(os.environ.get("BENCH_C1_REQUESTS", "6")),
          4: int(os.environ.get("BENCH_C4_REQUESTS", "16")),
          16: int(os.environ.get("BENCH_C16_REQUESTS", "48"))}
HF_REQUESTS = int(os.environ.get("BENCH_HF_REQUESTS", "5"))
TOPICS = ("the sea", "a mountain", "bread", "the moon", "a library", "rain", "a bicycle",
          "winter", "a garden", "coffee", "a train", "music", "a river", "the desert",
          "a cat", "the city")
NAME = "gemma"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompt_text(i: int) -> str:
    """Distinct for every i, so no request shares a prefix-cache entry with another."""
    return f"Request {i}: write one sentence about {TOPICS[i % len(TOPICS)]}."


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]


def closed_loop(concurrency: int, indices: range, one: Callable[[int], int]) -> dict[str, Any]:
    """Runs request i for every i in `indices` with `concurrency` workers; `one(i)` returns
    the tokens it produced."""
    lat: list[float] = []
    lock = threading.Lock()

    def timed(i: int) -> int:
        t0 = time.perf_counter()
        toks = one(i)
        with lock:
            lat.append(time.perf_counter() - t0)
        return toks

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(timed, indices))
    wall = time.perf_counter() - t0
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "requests": len(indices),
            "p50_ms": 1000 * percentile(lat, 0.5), "p99_ms": 1000 * percentile(lat, 0.99),
            "mean_ms": 1000 * statistics.fmean(lat)}


def evidence_totals(base: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    total = count = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "verinfer_evidence_seconds":
            for s in fam.samples:
                if s.name.endswith("_sum"):
                    total = s.value
                elif s.name.endswith("_count"):
                    count = s.value
    return total, count


def start_server(model: Path, state: Path) -> tuple[subprocess.Popen[bytes], str]:
    init = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(state),
                           "--light-kdf", "--batch-max-age-s", "1", "--unsafe-dev"],
                          capture_output=True, text=True, timeout=300)
    if init.returncode != 0:
        raise SystemExit(f"operator init failed: {init.stderr}")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "verinfer", "serve", "--model", str(model),
                             "--port", str(port), "--name", NAME, "--operator-dir", str(state),
                             "--max-seqs", "16", "--unsafe-dev"], stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"verinfer serve exited with {proc.returncode}: {err}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("verinfer serve did not start")
        time.sleep(0.5)


def bench_server(model: Path) -> dict[str, Any]:
    from openai import OpenAI

    with tempfile.TemporaryDirectory(prefix="verinfer-bench-serve-") as tmp:
        proc, base = start_server(model, Path(tmp) / "operator")
        try:
            client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                            timeout=600)
            start = 10_000  # prompt numbering: every request of the run is distinct

            def one(i: int) -> int:
                r = client.chat.completions.create(
                    model=NAME, messages=[{"role": "user", "content": prompt_text(i)}],
                    max_tokens=MAX_TOKENS, temperature=0)
                if "verification" not in (r.model_extra or {}):
                    raise SystemExit("a response came back without its verification object")
                assert r.usage is not None
                return r.usage.completion_tokens

            one(9_999)  # warm-up: first touch of weights and kernels
            out: dict[str, Any] = {}
            for c, n in LEVELS.items():
                before = evidence_totals(base)
                res = closed_loop(c, range(start, start + n), one)
                start += n
                after = evidence_totals(base)
                done = after[1] - before[1]
                res["evidence_mean_ms"] = 1000 * (after[0] - before[0]) / done if done else None
                out[f"c{c}"] = res
                log(f"server c{c}: {res['tok_s']:.2f} tok/s, p50 {res['p50_ms']:.0f} ms, "
                    f"p99 {res['p99_ms']:.0f} ms, evidence {res['evidence_mean_ms']:.2f} ms "
                    f"({n} requests, {res['tokens']} tokens, {res['wall_s']:.1f} s)")
            client.close()
            status = subprocess.run([sys.executable, "-m", "verinfer", "operator", "status",
                                     str(Path(tmp) / "operator")], capture_output=True,
                                    text=True, timeout=60)
            out["outbox"] = json.loads(status.stdout)["entries"] if status.returncode == 0 \
                else None
            return out
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def prompt_ids(engine: Engine, i: int) -> list[int]:
    return render_chat(engine.tokenizer, [ChatMessage("user", prompt_text(i))])


def bench_engine(model: Path) -> tuple[dict[str, Any], list[list[int]]]:
    engine = Engine(load_model(model), "invariant", max_seqs=16)
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        ids = [prompt_ids(engine, 20_000 + i) for i in range(LEVELS[16] + 1)]
        engine.generate(ids[-1], params)  # warm-up

        def one(i: int) -> int:
            return len(engine.submit(ids[i], params).result().token_ids)

        res = closed_loop(16, range(LEVELS[16]), one)
        log(f"engine c16: {res['tok_s']:.2f} tok/s ({res['tokens']} tokens, "
            f"{res['wall_s']:.1f} s)")
        return res, ids[:HF_REQUESTS]
    finally:
        engine.close()


@torch.inference_mode()
def bench_hf(model: Path, ids: list[list[int]]) -> dict[str, Any]:
    hf, _ = load_hf_model(model, tokenizer=False)  # it is given token ids

    def one(i: int) -> int:
        x = torch.tensor([ids[i]], dtype=torch.long)
        out = hf.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                          max_new_tokens=MAX_TOKENS, pad_token_id=hf.config.pad_token_id)
        return int(out.shape[1] - x.shape[1])

    hf.generate(input_ids=torch.tensor([ids[0]]), max_new_tokens=2, do_sample=False,
                pad_token_id=hf.config.pad_token_id)  # warm-up
    res = closed_loop(1, range(len(ids)), one)
    log(f"hf sequential: {res['tok_s']:.2f} tok/s ({res['tokens']} tokens, "
        f"{res['wall_s']:.1f} s)")
    return res


GRAMMAR_SCHEMA = {"type": "object", "additionalProperties": False,
                  "required": ["name", "city", "age", "tags"],
                  "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                 "age": {"type": "integer"},
                                 "tags": {"type": "array", "items": {"type": "string"}}}}


def bench_grammar(rounds: int = 3, max_tokens: int = 96) -> dict[str, Any]:
    """``grammar_overhead_fraction``: mask cost / decode wall time at batch 1 on SmolLM2."""
    from verinfer.engine.grammar import grammar_tokenizer
    from verinfer.engine.loader import smollm2_model_path
    from verinfer.protocol.grammar import compile_grammar, response_format_spec

    engine = Engine(load_model(smollm2_model_path()), "invariant", max_seqs=1)
    try:
        spec = response_format_spec({"type": "json_schema", "json_schema": {
            "name": "person", "strict": True, "schema": GRAMMAR_SCHEMA}})
        assert spec is not None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                grammar=compile_grammar(spec))
        plain = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        gt = grammar_tokenizer(engine, engine.tokenizer, engine.config.vocab_size)
        ids = render_chat(engine.tokenizer, [ChatMessage(
            "user", "Describe a person as JSON with name, city, age and tags.")])
        engine.generate(ids, params)  # warm-up (the llguidance tokenizer is built once)
        decode_s = mask_s = step_s = plain_s = 0.0
        tokens = plain_tokens = 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            gen = engine.generate(ids, params)
            decode_s += time.perf_counter() - t0
            tokens += len(gen.token_ids)
            # the engine's per-step v3 work again, on a logits row of the vocabulary's size:
            # mask + draw + advance (step_s), of which llguidance's mask and advance (mask_s)
            state = engine.output_state_v3(params)
            row = np.random.default_rng(0).standard_normal(engine.config.vocab_size,
                                                           dtype=np.float32)
            for pos, tok in enumerate(gen.token_ids):
                t1 = time.perf_counter()
                state.choose(row, pos)
                state.push(tok)
                step_s += time.perf_counter() - t1
            mask_s += state.mask_seconds
            t0 = time.perf_counter()
            plain_tokens += len(engine.generate(ids, plain).token_ids)
            plain_s += time.perf_counter() - t0
        if gen.finish_reason == "stop":
            json.loads(engine.tokenizer.decode(gen.token_ids))  # the grammar held
        del gt
    finally:
        engine.close()
    out = {"grammar_overhead_fraction": round(mask_s / decode_s, 5),
           "grammar_step_overhead_fraction": round(step_s / decode_s, 5),
           "grammar_mask_ms_per_token": round(1000 * mask_s / tokens, 4),
           "grammar_decode_tok_s_b1": round(tokens / decode_s, 3),
           "plain_decode_tok_s_b1": round(plain_tokens / plain_s, 3),
           "plain_tokens_per_answer": plain_tokens // rounds,
           "grammar_tokens_per_answer": tokens // rounds, "grammar_model": "smollm2"}
    log(f"grammar: {out}")
    return out


def main() -> None:
    global MAX_TOKENS, LEVELS, HF_REQUESTS  # every part reads these module constants
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CI smoke run: tiny sizes")
    ap.add_argument("--grammar-only", action="store_true",
                    help="only the structured-output part (grammar_overhead_fraction)")
    args = ap.parse_args()
    if args.grammar_only:
        print(json.dumps(bench_grammar(rounds=1 if args.smoke else 3,
                                       max_tokens=24 if args.smoke else 96)))
        return
    if args.smoke:
        MAX_TOKENS, LEVELS, HF_REQUESTS = 4, {1: 2, 4: 4, 16: 16}, 1
    t_start = time.perf_counter()
    model = embedded_model_path()
    log(f"threads={torch.get_num_threads()} model={model}")
    server = bench_server(model)
    engine, hf_ids = bench_engine(model)
    hf = bench_hf(model, hf_ids)
    c1 = server["c1"]
    out: dict[str, Any] = {}
    for c in LEVELS:
        r = server[f"c{c}"]
        out[f"c{c}_tok_s"] = round(r["tok_s"], 3)
        out[f"c{c}_p50_ms"] = round(r["p50_ms"], 1)
        out[f"c{c}_p99_ms"] = round(r["p99_ms"], 1)
    evidence_ms = c1["evidence_mean_ms"]
    out.update({
        "engine_c16_tok_s": round(engine["tok_s"], 3),
        "hf_seq_tok_s": round(hf["tok_s"], 3),
        "c16_over_hf_seq": round(server["c16"]["tok_s"] / hf["tok_s"], 3),
        "c16_over_engine_c16": round(server["c16"]["tok_s"] / engine["tok_s"], 3),
        "evidence_ms_c1": round(evidence_ms, 3),
        "evidence_ms_c16": round(server["c16"]["evidence_mean_ms"], 3),
        "c1_mean_latency_ms": round(c1["mean_ms"], 1),
        "overhead_fraction": round(evidence_ms / c1["mean_ms"], 5),
        "requests": {f"c{c}": n for c, n in LEVELS.items()} | {"hf": len(hf_ids),
                                                              "engine_c16": LEVELS[16]},
        "max_tokens": MAX_TOKENS,
        "mean_completion_tokens": round(c1["tokens"] / c1["requests"], 2),
        "outbox_entries_after_run": server["outbox"],
        "threads": torch.get_num_threads(),
    })
    out.update(bench_grammar(rounds=1 if args.smoke else 3,
                             max_tokens=24 if args.smoke else 96))
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
