"""Probe the HF transformers baseline for Gemma 3 270M on this machine.

Prints the HF config, greedy ``generate`` throughput at batch 1 and 4, single-forward latencies,
and the RSS after loading. The last line of output is one JSON object with all numbers.

Usage: ``python bench/hf_baseline_probe.py [--smoke]``; ``--smoke`` (CI,
tests/slow/test_bench_smoke_gemma.py): 4 new tokens, forwards of 1 and 4 tokens, one rep each,
no tokenizer load.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_reference import (
    config_summary,
    gemma_gguf_path,
    hf_generate_tok_s,
    load_hf_model,
)

PROMPT_LEN = 16
NEW_TOKENS = 64
FORWARD_LENS = (1, 4, 128, 600)


@torch.inference_mode()
def forward_ms(model: Any, seq_len: int, reps: int) -> float:
    """Median wall ms of one full forward (no cache) over ``reps`` runs, after one warmup."""
    gen = torch.Generator().manual_seed(seq_len)
    ids = torch.randint(1000, 200_000, (1, seq_len), generator=gen)
    model(input_ids=ids, use_cache=False)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def generate_cache_info(model: Any) -> dict[str, Any]:
    """What ``generate`` uses by default: cache class and per-layer cache classes."""
    ids = torch.randint(1000, 200_000, (1, 4), generator=torch.Generator().manual_seed(1))
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=2,
        min_new_tokens=2,
        return_dict_in_generate=True,
        pad_token_id=model.config.pad_token_id,
    )
    cache = out.past_key_values
    layers = getattr(cache, "layers", [])
    return {
        "cache_class": type(cache).__name__,
        "layer_cache_classes": sorted({type(layer).__name__ for layer in layers}),
        "cache_implementation": model.generation_config.cache_implementation,
        "attn_implementation": model.config._attn_implementation,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CI smoke run: tiny sizes, 1 rep")
    smoke = ap.parse_args().smoke
    new_tokens = 4 if smoke else NEW_TOKENS
    forward_lens = FORWARD_LENS[:2] if smoke else FORWARD_LENS
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    path = gemma_gguf_path()
    t0 = time.perf_counter()
    model, _tok = load_hf_model(path, tokenizer=not smoke)  # the tokenizer load is in load_s
    load_s = time.perf_counter() - t0
    rss_after_load = proc.memory_info().rss
    # ru_maxrss is KiB on Linux: the true peak, including transient dequantization buffers.
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    cfg = config_summary(model)
    print("HF config:")
    print(json.dumps(cfg, indent=1, default=str))
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, threads={threads}, load {load_s:.1f}s")
    print(
        f"RSS: before load {rss0 / 2**20:.0f} MiB, after load {rss_after_load / 2**20:.0f} MiB, "
        f"peak {peak_rss / 2**20:.0f} MiB"
    )

    cache_info = generate_cache_info(model)
    print(f"generate defaults: {cache_info}")

    gen_results: dict[str, dict[str, float]] = {}
    for batch in (1, 4):
        tok_s = hf_generate_tok_s(model, batch, PROMPT_LEN, new_tokens)
        ms_per_step = batch / tok_s * 1e3
        gen_results[f"batch{batch}"] = {
            "tok_s": round(tok_s, 2),
            "ms_per_token": round(1e3 / tok_s, 2),
            "ms_per_step": round(ms_per_step, 2),
        }
        print(
            f"generate batch={batch} prompt={PROMPT_LEN} new={new_tokens}: {tok_s:.2f} tok/s "
            f"({1e3 / tok_s:.1f} ms/token, {ms_per_step:.1f} ms/step)"
        )

    fwd: dict[str, float] = {}
    for n in forward_lens:
        ms = forward_ms(model, n, reps=1 if smoke else 5 if n <= 128 else 3)
        fwd[str(n)] = round(ms, 2)
        print(f"forward seq_len={n}: {ms:.1f} ms")

    result = {
        "engine": "hf_transformers",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "threads": threads,
        "dtype": "float32",
        "attn_implementation": cache_info["attn_implementation"],
        "cache": cache_info["cache_class"],
        "layer_caches": cache_info["layer_cache_classes"],
        "prompt_len": PROMPT_LEN,
        "new_tokens": new_tokens,
        "generate": gen_results,
        "forward_ms": fwd,
        "load_s": round(load_s, 1),
        "rss_after_load_mib": round(rss_after_load / 2**20, 1),
        "peak_rss_mib": round(peak_rss / 2**20, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
