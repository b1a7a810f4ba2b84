"""`verinfer selftest`, `verinfer model export-hf` and `serve --backend`: bad input gets a clear
error before anything heavy loads; the own engine's self-test runs from the command line and
prints its JSON report on stdout (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from verinfer.cli import app

runner = CliRunner()


def test_selftest_own_on_the_tiny_model_passes_and_writes_its_report(tiny_path: Path,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    r = runner.invoke(app, ["selftest", "--backend", "own", "--model", str(tiny_path),
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["passed"] is True and summary["backend"] == "torch-cpu"
    assert all(line.startswith("ok") for line in summary["cases"])
    report = json.loads(out.read_text())
    assert report["verification"] == "replay" and report["fingerprint_hash"].startswith("0x")


def test_unknown_backend_is_refused(tiny_path: Path) -> None:
    r = runner.invoke(app, ["selftest", "--backend", "tensorrt", "--model", str(tiny_path)])
    assert r.exit_code == 2 and "unknown backend 'tensorrt'" in r.output


def test_vllm_backend_wants_a_gguf_model(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    r = runner.invoke(app, ["selftest", "--backend", "vllm", "--model", str(weights)])
    assert r.exit_code == 2 and ".gguf" in r.output


def test_export_hf_refuses_what_is_not_a_gguf_file(tmp_path: Path) -> None:
    bogus = tmp_path / "model.bin"
    bogus.write_bytes(b"not a model")
    r = runner.invoke(app, ["model", "export-hf", str(bogus), str(tmp_path / "out")])
    assert r.exit_code == 2 and "is not a .gguf file" in r.output
    assert not (tmp_path / "out").exists()


def test_export_hf_refuses_to_overwrite_a_foreign_folder(tiny_path: Path,
                                                         tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("someone's file")
    r = runner.invoke(app, ["model", "export-hf", str(tiny_path), str(target)])
    assert r.exit_code == 2 and "--force" in r.output
    assert (target / "keep.txt").read_text() == "someone's file"


def test_serve_vllm_takes_one_model_and_a_known_backend() -> None:
    r = runner.invoke(app, ["serve", "--backend", "vllm", "--model", "a.gguf", "--model",
                            "b.gguf", "--unsafe-no-evidence"])
    assert r.exit_code == 2 and "serves one --model" in r.output
    r = runner.invoke(app, ["serve", "--backend", "sglang", "--unsafe-no-evidence"])
    assert r.exit_code == 2 and "unknown --backend 'sglang'" in r.output
