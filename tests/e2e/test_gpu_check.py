"""scripts/gpu-check (docs/gpu.md): the one command for the day a GPU is lent.

Here there is no GPU: the script must refuse clearly (exit 2, one JSON object saying why), and
its dry run — every section under Triton's CPU interpreter on tiny shapes — must pass: the
invariance counts are 1, replay is bit-equal on every step, throughput has both kernel sets.
This proves the script and its wiring, not a GPU (the interpreter's bits are numpy's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: run scripts/ci-extras.d/40-triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"


def run(*args: str, timeout: float) -> tuple[int, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # never a GPU here, even on a machine that has one
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=ROOT)
    return p.returncode, json.loads(p.stdout)


def test_gpu_check_refuses_clearly_without_a_gpu() -> None:
    rc, doc = run(timeout=120)
    assert rc == 2 and doc["ok"] is False
    assert "no CUDA device" in str(doc["error"]) and "--dry-run" in str(doc["error"])


def test_gpu_check_dry_run_passes_under_the_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    rc, doc = run("--dry-run", "--out", str(out), timeout=900)
    assert json.loads(out.read_text()) == doc
    assert rc == 0 and doc["ok"] is True and doc["failures"] == [], doc
    assert doc["dry_run"] is True
    fp = doc["fingerprint"]
    assert fp["backend"] == "torch-cuda" and fp["dtype"] == "float32"
    assert str(fp["hardware_class"]).startswith("cpu:triton-interpret")
    for mode in ("greedy", "seeded"):
        assert doc["invariance"][mode]["unique_outputs"] == 1
    assert doc["replay"]["fraction"] == 1.0 and doc["replay"]["steps"] > 0
    assert "skipped" in doc["selftest"]
    for shape in ("llama3-8b-shape", "gemma3-270m-shape"):
        tp = doc["throughput"][shape]
        assert set(tp) == {"invariant_tok_s", "torch_tok_s", "ratio"}, tp
        assert set(tp["ratio"]) == {"1", "2"} and all(v > 0 for v in tp["ratio"].values())
