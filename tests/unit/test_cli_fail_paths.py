"""The operator's and the model CLIs report a refusal through ``cli_errors.fail``: one
``error: <message>`` line on stderr and exit 2 (the caller's arguments), as before."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from verinfer.cli import app


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def test_operator_init_refuses_an_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "operator.json").write_text("{}")
    code, out = _run("operator", "init", str(tmp_path))
    assert code == 2 and out == f"error: {tmp_path / 'operator.json'} already exists\n"


def test_operator_init_refuses_an_unknown_da(tmp_path: Path) -> None:
    code, out = _run("operator", "init", str(tmp_path / "op"), "--da", "carrier-pigeon")
    assert code == 2 and out == "error: --da must be local or redis\n"


def test_serve_refuses_an_unknown_backend() -> None:
    code, out = _run("serve", "--unsafe-no-evidence", "--backend", "abacus")
    assert code == 2 and out == "error: unknown --backend 'abacus' (own | vllm)\n"


def test_export_hf_reports_a_missing_model_file(tmp_path: Path) -> None:
    code, out = _run("model", "export-hf", str(tmp_path / "absent.gguf"), str(tmp_path / "out"))
    assert code == 2 and out.startswith("error: ") and "absent.gguf" in out, out


def test_verifier_run_refuses_a_log_range_below_one_block(tmp_path: Path) -> None:
    """--log-chunk-blocks sets the widest eth_getLogs range the committee node sends (a public
    RPC's limit); 0 would never advance."""
    code, out = _run("verifier", "run", "--rpc-url", "http://127.0.0.1:9", "--deployment",
                     str(tmp_path / "d.json"), "--model", "m", "--kms-dir", str(tmp_path),
                     "--state-dir", str(tmp_path), "--log-chunk-blocks", "0")
    assert code == 2 and "--log-chunk-blocks" in out, out
