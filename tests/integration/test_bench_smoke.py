"""Every bench runs in CI, once, at its smallest size: exit 0, the last stdout line one JSON
object, its documented keys there with sane types. The numbers of a smoke run mean nothing
(tiny sizes, one round, a loaded CI machine); what this catches is a bench broken by an
interface change (bench/challenge.py was, for weeks, unnoticed).

The benches that load the real Gemma 3 270M are in tests/slow/test_bench_smoke_gemma.py; those
that need an optional install (vLLM, the image tools) in tests/e2e/test_bench_smoke_optional.py;
``test_every_bench_has_a_smoke_test`` keeps the three in step with bench/.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.bench import (
    BENCH,
    ROOT,
    count,
    expect,
    expect_each,
    flag,
    mapping,
    number,
    rate,
    rate_or_none,
    run_bench,
    text,
)

TESTS = Path(__file__).resolve().parents[1]

# Every name `verinfer bench` lists, and the test that runs it (None: not a benchmark).
SMOKE_TESTS: dict[str, str | None] = {
    "backends": "e2e/test_bench_smoke_optional.py::test_backends_bench",
    "challenge": "integration/test_bench_smoke.py::test_challenge_bench",
    "client": "integration/test_bench_smoke.py::test_client_bench",
    "committer": "integration/test_bench_smoke.py::test_committer_bench",
    "da": "integration/test_bench_smoke.py::test_da_bench",
    "engine": "slow/test_bench_smoke_gemma.py::test_engine_bench",
    "explorer": "integration/test_bench_smoke.py::test_explorer_bench",
    "game": "integration/test_bench_smoke.py::test_game_bench",
    "gas": "integration/test_bench_smoke.py::test_gas_bench",
    "hf_baseline_probe": "slow/test_bench_smoke_gemma.py::test_hf_baseline_probe_bench",
    "hf_reference": None,  # the HF loading library of engine/serve/hf_baseline_probe: no main
    "hostile": "integration/test_bench_smoke.py::test_hostile_bench",
    "image": "e2e/test_bench_smoke_optional.py::test_image_bench",
    "kernels": "integration/test_bench_smoke.py::test_kernels_bench",
    "kms": "integration/test_bench_smoke.py::test_kms_bench",
    "llamacpp_decode": "integration/test_bench_smoke.py::test_llamacpp_decode_bench",
    "quant_panels": "integration/test_bench_smoke.py::test_quant_panels_bench",
    "receipts": "integration/test_bench_smoke.py::test_receipts_bench",
    "reproduce": "integration/test_bench_smoke.py::test_reproduce_bench",
    "serve": "slow/test_bench_smoke_gemma.py::test_serve_bench",
    "stop_rule": "integration/test_bench_smoke.py::test_stop_rule_bench",
    "tokenizer": "integration/test_bench_smoke.py::test_tokenizer_bench",
}


def test_every_bench_has_a_smoke_test() -> None:
    """A new bench without a smoke test (or a smoke test left behind by a removed bench)
    fails here, with the names."""
    from verinfer.cli import bench_names

    assert set(bench_names(ROOT)) == set(SMOKE_TESTS), (
        f"bench/ has {sorted(set(bench_names(ROOT)) - set(SMOKE_TESTS))} without a smoke test;"
        f" smoke tests for {sorted(set(SMOKE_TESTS) - set(bench_names(ROOT)))} name no bench")
    for name, where in SMOKE_TESTS.items():
        if where is None:
            assert "__main__" not in (BENCH / f"{name}.py").read_text(), (
                f"bench/{name}.py runs as a script now: give it a smoke test")
            continue
        path, func = where.split("::")
        assert f"def {func}(" in (TESTS / path).read_text(), f"{where} does not exist"


def test_receipts_bench() -> None:
    out = run_bench("receipts", timeout=120)
    expect(out, {"p50_ms": rate, "p90_ms": rate, "mean_ms": rate, "p50_ms_mlkem768_x25519": rate,
                 "iterations": count, "receipt_bytes": rate, "envelope_bytes": rate,
                 "proof_bytes_1024": rate, "proof_siblings_1024": count, "signer": text})


def test_client_bench() -> None:
    out = run_bench("client", "--answers", "2", "--rounds", "2", timeout=300)
    expect(out, {"client_verify_p50_ms": rate, "client_verify_p90_ms": rate,
                 "client_verify_cold_ms": rate, "chain_reads_warmup": count,
                 "chain_reads_timed": count, "verifications": count})
    assert out["chain_reads_timed"] == 0 and out["verifications"] == 4, out


def test_da_bench() -> None:
    out = run_bench("da", "--quick", timeout=180)
    expect(out, {"local": mapping, "eigenda": mapping, "outbox_entries_per_s": rate,
                 "outbox_enqueue_p50_ms": rate, "outbox_serial_enqueue_per_s": rate,
                 "outbox_entries": count, "outbox_producers": count})
    for backend in ("local", "eigenda", "redis"):
        if backend == "redis" and "redis" not in out:
            continue  # the bench skips a Redis that is down; the others never are
        for size in ("4KB", "256KB"):
            expect(out[backend], {size: mapping}, f"{backend}.")
            expect(out[backend][size], {"put_p50_ms": rate, "put_p99_ms": rate,
                                        "get_p50_ms": rate, "put_per_s": rate,
                                        "get_per_s": rate, "n": count}, f"{backend}.{size}.")


def test_committer_bench() -> None:
    """bench/committer.py (issue 37): 3 replica processes feed the batch committer over Redis."""
    out = run_bench("committer", "--quick", timeout=180)
    expect(out, {"committer_receipts_per_s": rate, "committer_receipts_per_cpu_s": rate,
                 "publish_per_s": rate, "receipts": count,
                 "replicas": count, "batches": count, "elapsed_s": rate,
                 "verify_signatures": flag})
    assert out["receipts"] == 600 and out["replicas"] == 3 and out["batches"] >= 3


def test_tokenizer_bench() -> None:
    """bench/tokenizer.py's own small options (another engineer owns the script)."""
    out = run_bench("tokenizer", "--mb", "0.05", "--reps", "1", "--ref-mb", "0.01", timeout=300)
    expect(out, {"tokenize_mb_s": rate, "tokenize_mb_s_gemma": rate,
                 "tokenize_cpu_mb_s_gemma": rate, "tokenize_mb_s_smollm2": rate,
                 "tokenize_cpu_mb_s_smollm2": rate, "chat_render_s_gemma": number,
                 "speedup_cpu_gemma": rate, "fast_equals_reference_gemma": flag,
                 "words_equal_whole_smollm2": flag})


def test_stop_rule_bench() -> None:
    """bench/stop_rule.py on the tiny vocabulary (no package needed), small sizes."""
    out = run_bench("stop_rule", "--sizes", "20,200", "--reps", "2", "--window", "10",
                    "--tokenizer", "tiny", timeout=120)
    expect(out, {"tokenizer": text, "old_us": mapping, "new_us": mapping,
                 "new_stream_us": mapping, "speedup": mapping, "new_mean_us_per_token": mapping,
                 "equal": flag})
    assert out["equal"] is True
    for key in ("old_us", "new_us", "new_stream_us", "speedup"):
        expect(out[key], {"20": rate, "200": rate}, f"{key}.")


def test_reproduce_bench(tiny_path: Path) -> None:
    out = run_bench("reproduce", "--model", str(tiny_path), "--rounds", "1", timeout=300)
    expect(out, {"reproduce_s": rate, "generate_s": rate, "reproduce_over_generate": rate,
                 "replay_s": rate, "steps_s": mapping, "output_tokens": count,
                 "isa_results": mapping, "same_bits_on_every_isa": flag})
    expect(out["steps_s"], {"signature": number, "replay": rate, "total": rate}, "steps_s.")


def test_challenge_bench() -> None:
    """--tiny: the tiny test model instead of Gemma; one challenge is the bench's default."""
    out = run_bench("challenge", "--tiny", "--challenges", "1", timeout=300)
    expect(out, {"resolve_s": rate, "verifier_over_operator": rate,
                 "operator_cpu_s_per_token": rate, "verifier_reexec_cpu_s_per_token": rate,
                 "verifier_decrypt_cpu_s": rate, "verifier_decrypt_wall_s": rate,
                 "verifier_key_release_wall_s": rate_or_none, "jobs_timed": count,
                 "committee": count, "tokens": count})


def test_kms_bench() -> None:
    out = run_bench("kms", "--smoke", timeout=300)
    expect(out, {"key_release_p50_ms": rate, "key_release_p90_ms": rate,
                 "key_release_two_down_p50_ms": rate, "receipt_release_p50_ms": rate,
                 "software_enclave_child_key_p50_ms": rate,
                 "software_enclave_child_total_p50_ms": rate, "tdx_verify_ms": rate,
                 "envelope_bytes": count, "meets_target": flag,
                 "receipt_release_meets_target": flag})


def test_gas_bench() -> None:
    out = run_bench("gas", "--smoke", timeout=300)
    expect(out, {k: rate for k in (
        "commit_batch_gas", "open_challenge_gas", "open_challenge_gas_first",
        "draw_committee_gas", "draw_gas_1000_verifiers", "register_verifier_gas_max",
        "commit_vote_gas", "reveal_vote_gas", "gas_per_receipt_1024")})


def test_game_bench() -> None:
    out = run_bench("game", "--steps", "20", "--episode-steps", "10", timeout=300)
    expect(out, {"steps": count, "actions": mapping, "violations": count, "seed": count,
                 "steps_per_s": rate, "payoffs_eth": mapping, "outcomes": mapping})
    assert out["steps"] == 20 and sum(out["actions"].values()) == 20
    assert out["violations"] == 0, out["violation_kinds"]


def test_hostile_bench() -> None:
    out = run_bench("hostile", "--fast", "--service", "fake_eigenda", "--attack", "flood",
                    timeout=300)
    expect(out, {"rss_growth_mb_max": number, "health_p99_ms_max": rate,
                 "disk_growth_mb_max": number, "honest_success_ratio": rate})
    assert out["scale"] == "fast" and out["over_budget"] == [], out["over_budget"]


def test_explorer_bench() -> None:
    out = run_bench("explorer", "--receipts", "20", "--batch-size", "10", "--challenges", "2",
                    "--requests", "20", timeout=300)
    expect(out, {"p95_page_ms": rate, "p50_page_ms": rate, "index_s": rate, "by_page": mapping,
                 "receipts": count, "challenges": count})
    for kind, row in out["by_page"].items():
        expect(row, {"n": count, "p50_ms": rate, "p95_ms": rate}, f"by_page.{kind}.")


@pytest.mark.parametrize("mode", [[], ["--quant"]], ids=["fp32", "quant"])
def test_kernels_bench(mode: list[str]) -> None:
    out = run_bench("kernels", "--smoke", "--threads", "1", *mode, timeout=300)
    expect(out, {"isa": text, "threads": count, "results": list})
    if mode:
        expect_each(out["results"], {"qtype": text, "fp32_ms": rate, "quant_ms": rate,
                                     "quant_weight_gb_s": number}, "results")
    else:
        expect_each(out["results"], {"op": text, "torch_ms": rate, "vi_ms": rate,
                                     "packed_ms": rate}, "results")
        assert {r["op"] for r in out["results"]} == {"fp32", "q8_0"}


def test_quant_panels_bench() -> None:
    # the stream part (per-format decode GEMV over more bytes than the cache), one pass; the
    # gemma part is the engine bench's decode, smoked there
    out = run_bench("quant_panels", "--part", "stream", "--rounds", "1", timeout=300)
    expect(out, {"isa": text, "threads": count})
    for fmt in ("Q5_0_2048x640", "Q4_K_640x1024", "Q6_K_640x2048", "Q8_0_2048x640"):
        expect(out, {f"{fmt}_bytes": count, f"{fmt}_us": rate, f"{fmt}_gbs": rate,
                     f"{fmt}_m128_us": rate})


def test_llamacpp_decode_bench(tiny_path: Path) -> None:
    """The llama.cpp half of bench/engine.py, in .venv-bench, on the tiny GGUF: its stdin/stdout
    protocol (a JSON line per request). Skipped, with bench/engine.py's reasons, without it."""
    bench_python = ROOT / ".venv-bench" / "bin" / "python"
    if not bench_python.exists():
        pytest.skip("no .venv-bench (run scripts/bootstrap-bench)")
    probe = subprocess.run([str(bench_python), "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("llama_cpp is not importable in .venv-bench (run scripts/bootstrap-bench)")
    proc = subprocess.run([str(bench_python), str(BENCH / "llamacpp_decode.py"), str(tiny_path),
                           "1", "64"], input=json.dumps({"prompt": [1, 5, 9], "new_tokens": 4})
                          + "\n", capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(lines) == 2, proc.stdout
    expect(lines[0], {"ready": flag, "version": text}, "ready line: ")
    expect(lines[1], {"decode_tok_s": rate, "prefill_s": rate, "ids": list}, "answer: ")
    assert len(lines[1]["ids"]) == 4 and all(count(i) for i in lines[1]["ids"])
