"""Bench smoke for the benches that load the real Gemma 3 270M (and HF transformers' copy of
it): each runs once with ``--smoke`` (smallest sizes, one round) and its last stdout line is
checked as in tests/integration/test_bench_smoke.py, which lists every bench and its test.

All three load HF transformers' Gemma from the GGUF, which is mostly transformers' reader
walking the 262k-token vocabulary (~35 s of CPU each here): they share one converted copy
(bench/hf_reference.py's VERINFER_HF_MODEL_CACHE), so only the first pays it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from support.bench import count, expect, mapping, number, rate, run_bench, text


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    d = tmp_path_factory.mktemp("hf-models")
    yield {"VERINFER_HF_MODEL_CACHE": str(d)}
    shutil.rmtree(d, ignore_errors=True)  # ~1 GB of fp32 weights: not kept with pytest's tmp


def test_engine_bench(hf_cache: dict[str, str]) -> None:
    """Every part: ours vs HF on Gemma and SmolLM2, llama.cpp when .venv-bench has it (the
    bench says why not otherwise), replay, the server's peak RSS."""
    out = run_bench("engine", "--smoke", timeout=600, env=hf_cache)
    expect(out, {"invariant_tok_s_b1": rate, "invariant_decode_tok_s_b1": rate,
                 "hf_tok_s_b1": rate, "ratio_b1": rate, "replay_ratio": rate,
                 "replay_gflops": rate, "sgemm_peak_gflops": rate,
                 "replay_share_of_fma_peak": rate, "peak_rss_mb": rate,
                 "smollm2_tok_s_b1": rate, "smollm2_hf_tok_s_b1": rate, "smollm2_ratio_b1": rate,
                 "kernel_isa": text, "threads": count})
    if "llamacpp_decode_tok_s_b1" in out:  # present exactly when .venv-bench has llama_cpp
        expect(out, {"llamacpp_decode_tok_s_b1": rate, "own_over_llamacpp_b1": rate,
                     "greedy_agree_tokens": count, "llamacpp_version": text})


def test_serve_bench(hf_cache: dict[str, str]) -> None:
    out = run_bench("serve", "--smoke", timeout=600, env=hf_cache)
    checks = {f"c{c}_{k}": rate for c in (1, 4, 16) for k in ("tok_s", "p50_ms", "p99_ms")}
    expect(out, checks | {"engine_c16_tok_s": rate, "hf_seq_tok_s": rate,
                          "c16_over_hf_seq": rate, "c16_over_engine_c16": rate,
                          "evidence_ms_c1": rate, "evidence_ms_c16": rate,
                          "overhead_fraction": rate, "c1_mean_latency_ms": rate,
                          "mean_completion_tokens": rate, "requests": mapping,
                          "outbox_entries_after_run": mapping, "total_s": rate,
                          "grammar_overhead_fraction": rate,
                          "grammar_step_overhead_fraction": rate})


def test_hf_baseline_probe_bench(hf_cache: dict[str, str]) -> None:
    out = run_bench("hf_baseline_probe", "--smoke", timeout=600, env=hf_cache)
    expect(out, {"generate": mapping, "forward_ms": mapping, "load_s": number,
                 "rss_after_load_mib": rate, "peak_rss_mib": rate, "attn_implementation": text,
                 "cache": text})
    for batch in ("batch1", "batch4"):
        expect(out["generate"], {batch: mapping}, "generate.")
        expect(out["generate"][batch], {"tok_s": rate, "ms_per_token": rate,
                                        "ms_per_step": rate}, f"generate.{batch}.")
    assert out["forward_ms"] and all(rate(v) for v in out["forward_ms"].values()), out
