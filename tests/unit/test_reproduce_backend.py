"""`verinfer reproduce --backend`: the auditor replays through the one backend dispatch
(engine/backends.py), and a receipt signed under another backend's fingerprint than the one
chosen is "cannot reproduce" (exit 2) — said before any engine starts, naming the --backend
that would do — never a mismatch. The real vLLM receipt, reproduced and tampered:
tests/e2e/test_vllm_backend.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from verinfer.auditor import reproduce
from verinfer.auditor.material import save_transcript
from verinfer.auditor.reproduce import AuditConfig, Auditor
from verinfer.cli import app
from verinfer.engine.backends import EngineChoice
from verinfer.engine.engine import Engine
from verinfer.receipts.envelope import EnvelopeContents, open_envelope
from verinfer.testing.evidence import chat_body
from verinfer.testing.fixed_operator import fixed_operator


def _receipt(engine: Engine, tmp_path: Path, name: str) -> tuple[Path, EnvelopeContents]:
    """A receipt ``engine`` signs (under whatever fingerprint it carries), as a file, and the
    opened envelope the auditor is handed as a transcript."""
    factory, sk = fixed_operator(engine, "reproduce", key_epoch=2)
    ev = factory.honest(chat_body("which backend signed this?", max_tokens=3))
    ref = tmp_path / f"{name}.json"
    ref.write_text(json.dumps(ev.signed.to_json()))
    return ref, open_envelope(ev.blob, ev.signed.receipt, sk)


@pytest.fixture
def engine(tiny_path: Path) -> Iterator[Engine]:
    eng = Engine.from_path(tiny_path)
    yield eng
    eng.close()


@pytest.fixture
def no_engine_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kw: Any) -> Engine:
        raise AssertionError("an engine was started for a receipt of another backend")

    monkeypatch.setattr(reproduce, "engine_for", refuse)


def test_the_own_backend_reproduces_an_own_receipt(
    engine: Engine, tiny_path: Path, tmp_path: Path
) -> None:
    ref, contents = _receipt(engine, tmp_path, "own")
    report = Auditor(
        AuditConfig(models=[str(tiny_path)], transcript=contents, engine=EngineChoice("own"))
    ).run(str(ref))
    assert report.verdict.outcome == "reproduced", report.to_json()
    env = report.step("environment")
    assert env is not None and env.data["backend"] == "own"


def test_a_vllm_receipt_under_the_own_backend_cannot_be_reproduced(
    engine: Engine, tiny_path: Path, tmp_path: Path, no_engine_starts: None
) -> None:
    engine.fingerprint = replace(engine.fingerprint, backend="vllm")  # what vLLM signs under
    ref, contents = _receipt(engine, tmp_path, "vllm")
    report = Auditor(AuditConfig(models=[str(tiny_path)], transcript=contents)).run(str(ref))
    v = report.verdict
    assert v.outcome == "cannot_reproduce" and v.exit_code == 2, report.to_json()
    assert "--backend vllm" in v.reason and "'vllm' backend" in v.reason
    env = report.step("environment")
    assert env is not None and env.data["receipt_backend"] == "vllm"


def test_an_own_receipt_under_the_vllm_backend_cannot_be_reproduced(
    engine: Engine, tiny_path: Path, tmp_path: Path, no_engine_starts: None
) -> None:
    """Refused before vLLM would be imported or started: runs where vllm is absent."""
    ref, contents = _receipt(engine, tmp_path, "own")
    cfg = AuditConfig(models=[str(tiny_path)], transcript=contents, engine=EngineChoice("vllm"))
    v = Auditor(cfg).run(str(ref)).verdict
    assert v.outcome == "cannot_reproduce" and "--backend own" in v.reason, v


def test_the_cli_maps_backend_onto_the_dispatch(
    engine: Engine, tiny_path: Path, tmp_path: Path
) -> None:
    engine.fingerprint = replace(engine.fingerprint, backend="vllm")
    ref, contents = _receipt(engine, tmp_path, "vllm")
    transcript = tmp_path / "transcript.json"
    save_transcript(transcript, contents, "0x" + "00" * 32)
    runner = CliRunner()
    base = [
        "reproduce",
        str(ref),
        "--model",
        str(tiny_path),
        "--transcript",
        str(transcript),
        "--json",
    ]
    r = runner.invoke(app, [*base, "--backend", "own"])
    assert r.exit_code == 2, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["verdict"] == "cannot_reproduce"
    r = runner.invoke(app, [*base, "--backend", "tensorrt"])
    assert r.exit_code == 2 and "unknown backend 'tensorrt'" in r.output
