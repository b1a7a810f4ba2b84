"""Runs the Foundry suite (unit, fuzz, invariant, shared vectors) as part of pytest."""

from __future__ import annotations

import subprocess

import pytest

from verinfer.chain.artifacts import contracts_dir, tool_path


def test_forge_suite_passes() -> None:
    forge = tool_path("forge")
    if not forge.exists():
        pytest.fail(f"{forge} missing: run scripts/bootstrap (calls scripts/bootstrap-contracts)")
    proc = subprocess.run([str(forge), "test"], cwd=contracts_dir(), capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"forge test failed:\n{out[-20000:]}"
    assert "0 failed" in out and "passed" in out, out[-5000:]
