"""The llama.cpp half of bench/engine.py: greedy decode with llama-cpp-python, decode-only tok/s.

Runs in its own venv (``scripts/bootstrap-bench`` builds llama-cpp-python into .venv-bench), so
it imports nothing from verinfer or torch. Started as ``python bench/llamacpp_decode.py
MODEL.gguf THREADS CTX``, it prints ``{"ready": true, "version": ...}``, then answers each stdin
line ``{"prompt": [ids], "new_tokens": N}`` with ``{"decode_tok_s": ..., "prefill_s": ...,
"ids": [...]}`` (one JSON object per line). The prompt goes in as token ids, the same ids the
engine gets (no BOS added); the first token comes from the prefill; decode tok/s is N - 1 over
the wall time of the N - 1 single-token evaluations that follow, each with its greedy argmax
over the logits (our engine's steps sample too).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from llama_cpp import Llama, __version__


def main() -> None:
    model, threads, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = Llama(model_path=model, n_ctx=ctx, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    n_vocab = llm.n_vocab()

    def greedy() -> int:
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        return int(np.argmax(logits))

    print(json.dumps({"ready": True, "version": __version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        llm.reset()  # n_tokens = 0: the next eval drops the whole KV cache
        t0 = time.perf_counter()
        llm.eval(req["prompt"])
        ids = [greedy()]
        t1 = time.perf_counter()
        for _ in range(req["new_tokens"] - 1):
            llm.eval([ids[-1]])
            ids.append(greedy())
        t2 = time.perf_counter()
        print(json.dumps({"decode_tok_s": (len(ids) - 1) / (t2 - t1), "prefill_s": t1 - t0,
                          "ids": ids}), flush=True)


if __name__ == "__main__":
    main()
