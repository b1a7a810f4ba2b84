"""The one dispatch from a backend name to an engine (engine/backends.py) and what the verifier
builds on it: the own engine by default with no vLLM import anywhere on its path, the vLLM
backend chosen by name, and the enclave measurement computed per model (vLLM's fingerprint
names the exported weights, so two models give two fingerprints and two measurements)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from eth_account import Account

from verinfer.engine.backends import (
    FINGERPRINT_BACKENDS,
    BackendModelError,
    EngineChoice,
    UnknownBackendError,
    backend_for_fingerprint,
)
from verinfer.engine.engine import Engine
from verinfer.engine.fingerprint import EngineFingerprint, local_fingerprint
from verinfer.engine.tiny import write_tiny_llama
from verinfer.verifier.enclave_judge import EnclaveConfig, EnclaveJudge
from verinfer.verifier.reexec import ModelSet, engine_for, model_file_id


def test_names_and_kernel_modes_pick_a_backend() -> None:
    assert EngineChoice.of("invariant") == EngineChoice("own", "invariant")
    assert EngineChoice.of("fast") == EngineChoice("own", "fast")
    assert EngineChoice.of("vllm").backend == "vllm"
    assert EngineChoice.of("vllm").max_seqs == 1  # the configuration vLLM-CPU signs under
    assert EngineChoice().max_seqs == 16  # the own engine batches: its bits do not depend on it
    assert EngineChoice("vllm", max_seqs=4).max_seqs == 4  # an operator's self-test-gated batch
    choice = EngineChoice("vllm", threads=2, export_dir=Path("/x/export"), max_context=1024)
    assert EngineChoice.of(choice) is choice
    assert EngineChoice.from_json(choice.to_json()) == choice
    with pytest.raises(UnknownBackendError, match="unknown backend"):
        EngineChoice.of("tensorrt")
    with pytest.raises(UnknownBackendError, match="kernels"):
        EngineChoice("own", "vllm")
    with pytest.raises(UnknownBackendError):
        EngineChoice("vllm", threads=0)
    with pytest.raises(UnknownBackendError, match="not an engine choice"):
        EngineChoice.from_json({"kernels": "invariant"})
    with pytest.raises(UnknownBackendError):
        EngineChoice(max_context=0)
    assert EngineChoice.from_json({"backend": "vllm"}) == EngineChoice("vllm")


def test_a_fingerprints_backend_names_the_choice_that_reproduces_it(tiny_path: Path) -> None:
    assert backend_for_fingerprint(EngineChoice().fingerprint(tiny_path).backend) == "own"
    assert backend_for_fingerprint(FINGERPRINT_BACKENDS["vllm"]) == "vllm"
    assert backend_for_fingerprint("tensorrt") is None


def test_load_applies_the_serving_limits(tiny_path: Path) -> None:
    eng = EngineChoice(max_seqs=3, max_context=64).load(tiny_path)
    try:
        assert (eng.max_seqs, eng.max_context) == (3, 64)
    finally:
        eng.close()


def test_the_vllm_backend_refuses_a_model_that_is_not_gguf(tmp_path: Path) -> None:
    """Checked before vLLM is imported or anything exported (runs where vllm is absent)."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(BackendModelError, match=r"\.gguf"):
        EngineChoice("vllm").load(weights)


def test_serve_maps_its_flags_onto_the_dispatch(tiny_path: Path) -> None:
    from typer.testing import CliRunner

    from verinfer.cli import app

    r = CliRunner().invoke(
        app, ["serve", "--unsafe-no-evidence", "--model", str(tiny_path), "--kernels", "turbo"]
    )
    assert r.exit_code == 2 and "kernels are invariant | fast, not 'turbo'" in r.output


def test_own_fingerprint_without_loading_is_the_loaded_engines(tiny_path: Path) -> None:
    eng = engine_for(tiny_path, EngineChoice())
    assert engine_for(tiny_path, "invariant") is eng  # one engine per (file, choice)
    assert isinstance(eng, Engine) and eng.kernel_mode == "invariant"
    assert EngineChoice().fingerprint(tiny_path).hash == eng.fingerprint.hash
    assert not EngineChoice().per_model_fingerprint and EngineChoice("vllm").per_model_fingerprint


def test_the_own_engine_verifier_never_imports_vllm(tiny_path: Path) -> None:
    """A node on the own engine builds engines through the dispatch without importing vllm
    (it need not even be installed); the check runs in a fresh interpreter."""
    code = f"""
import sys
from verinfer.verifier import cli, enclave_judge, reexec
ms = reexec.ModelSet([{str(tiny_path)!r}], "invariant")
mid = next(iter(ms.ids()))
ms.fingerprint(mid)
ms(mid)
assert "vllm" not in sys.modules, sorted(m for m in sys.modules if "vllm" in m)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@dataclass(frozen=True)
class WeightsNamingChoice(EngineChoice):
    """Stands in for vLLM: a fingerprint naming the model file's bytes, as vLLM's names the
    exported weights. Counts how often each fingerprint is computed."""

    calls: list[Path] = field(default_factory=list, compare=False, hash=False)

    @property
    def per_model_fingerprint(self) -> bool:
        return True

    def fingerprint(self, path: str | Path) -> EngineFingerprint:
        self.calls.append(Path(path))
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return replace(
            local_fingerprint("invariant"),
            backend="weights-naming",
            linear_order=f"weights=0x{digest}",
        )


def test_fingerprint_and_measurement_are_per_model(tmp_path: Path) -> None:
    p0 = write_tiny_llama(tmp_path / "a.gguf", seed=0)
    p1 = write_tiny_llama(tmp_path / "b.gguf", seed=1)
    id0, id1 = model_file_id(p0), model_file_id(p1)
    choice = WeightsNamingChoice()
    ms = ModelSet([p0, p1], choice)
    fp0, fp1 = ms.fingerprint(id0), ms.fingerprint(id1)
    assert fp0.hash != fp1.hash and "weights=0x" in fp1.linear_order
    assert ms.fingerprint(id1) is fp1 and choice.calls == [p0, p1]  # computed once each
    # a model this node does not hold: the first model's engine opens the envelope (the job
    # then abstains on the model), so its fingerprint is what the enclave measures
    assert ms.fingerprint(b"\x22" * 32).hash == fp0.hash
    # the enclave judge measures the engine of the receipt's model, without loading any
    cfg = EnclaveConfig(
        tmp_path / "root.key",
        tmp_path / "shards.json",
        tmp_path / "epochs.json",
        "sha256:" + "00" * 32,
        "code",
        p0,
        mode="process",
        more_models=(p1,),
        engine=choice,
    )
    judge = EnclaveJudge(cfg, Account.create(), da=None)  # type: ignore[arg-type]
    assert judge.engine is None and cfg.choice is choice
    assert judge._fingerprint(id0) == fp0.canonical().decode()
    assert judge._fingerprint(id1) == fp1.canonical().decode()


def test_own_engine_measurement_is_shared_by_every_model(tmp_path: Path) -> None:
    p0 = write_tiny_llama(tmp_path / "a.gguf", seed=0)
    p1 = write_tiny_llama(tmp_path / "b.gguf", seed=1)
    ms = ModelSet([p0, p1], "invariant")
    assert ms.fingerprint(model_file_id(p0)).hash == ms.fingerprint(model_file_id(p1)).hash
    assert ms.fingerprint(model_file_id(p0)).hash == local_fingerprint("invariant").hash


def test_the_enclave_job_builds_the_named_backend(tiny_path: Path, tiny_engine: Engine) -> None:
    """The backend reaches a `process`-mode child as JSON: the job judges with that engine,
    and one of another fingerprint (here the own engine's fast kernels on an invariant
    receipt) abstains instead of voting."""
    from verinfer.testing.evidence import chat_body
    from verinfer.testing.fixed_operator import fixed_operator
    from verinfer.verifier.reexec import verify_receipt_job

    factory, sk = fixed_operator(tiny_engine, "backends", key_epoch=3)
    ev = factory.honest(chat_body("which backend judges this?", max_tokens=4, seed=5))
    args = {"receipt": ev.signed.receipt.to_json(), "blob": ev.blob, "model_path": str(tiny_path)}
    same = verify_receipt_job(sk, **args, backend=EngineChoice().to_json())
    assert same["reason"] == "match" and same["agrees"] is True
    other = verify_receipt_job(sk, **args, backend=EngineChoice("own", "fast").to_json())
    assert set(other) == {"abstain"} and "engine fingerprint" in other["abstain"]
