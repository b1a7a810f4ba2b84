"""VERINFER_KERNEL_ISA: the ISA path is chosen when the kernels load, refused if the CPU lacks it,
reported in the fingerprint — and it never changes a bit of a model's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from verinfer.engine import kernels as vk
from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel
from verinfer.errors import KernelError
from verinfer.protocol.sampling_params import SamplingParams

ISAS = vk.supported_isas()
PARAMS = SamplingParams(max_tokens=8, temperature=0.8, seed=11, ignore_eos=True)
PROMPT = [5, 17, 99, 3, 250, 41, 7, 123, 64, 9, 200]

# Loads the tiny model in a fresh interpreter (the variable is read once per process) and prints
# what the engine reports and computes.
_CHILD = """
import json, sys
from verinfer.engine.engine import Engine
from verinfer.engine.sampling import SamplingParams
eng = Engine.from_path(sys.argv[1], "invariant", max_seqs=4, max_batch_tokens=48)
try:
    res = eng.generate(json.loads(sys.argv[2]), SamplingParams(max_tokens=8, temperature=0.8,
                                                               seed=11, ignore_eos=True))
    print(json.dumps({"isa": eng.fingerprint.reported["kernel_isa"],
                      "hash": eng.fingerprint.hash.hex(), "tokens": res.token_ids,
                      "digest": res.logit_digest.hex()}))
finally:
    eng.close()
"""


def _child(tiny_path: Path, isa: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != vk.ISA_ENV}
    if isa is not None:
        env[vk.ISA_ENV] = isa
    return subprocess.run([sys.executable, "-c", _CHILD, str(tiny_path), json.dumps(PROMPT)],
                          env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(autouse=True)
def _restore_isa() -> Iterator[None]:
    yield
    vk.set_isa("auto")


def test_env_choice_is_reported_and_gives_the_same_bits(tiny_path: Path) -> None:
    """Forced scalar and forced avx2 (in separate processes, as an operator would run them)
    report their path in the fingerprint but hash to the same approved fingerprint and produce
    the same tokens and logit digest."""
    if "avx2" not in ISAS:
        pytest.skip("this CPU has no AVX2 path to compare with scalar")
    out = {}
    for isa in ("scalar", "avx2"):
        proc = _child(tiny_path, isa)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out[isa]["isa"] == isa
    assert out["scalar"]["hash"] == out["avx2"]["hash"]  # reported, never approved
    assert out["scalar"]["tokens"] == out["avx2"]["tokens"]
    assert out["scalar"]["digest"] == out["avx2"]["digest"]


def test_unknown_env_value_fails_the_engine_load(tiny_path: Path) -> None:
    proc = _child(tiny_path, "avx9000")
    assert proc.returncode != 0
    assert "KernelError" in proc.stderr and "VERINFER_KERNEL_ISA='avx9000'" in proc.stderr


class _CpuWithout:
    """Stands in for the extension on a CPU with only the given paths (to test the refusal on a
    machine that does have AVX-512)."""

    def __init__(self, have: list[str]) -> None:
        self.have, self.chosen = have, None

    def supported_isas(self) -> list[str]:
        return self.have

    def set_isa(self, name: str) -> None:
        self.chosen = name


@pytest.mark.parametrize("value,chosen", [("avx2", "avx2"), (" SCALAR ", "scalar"), ("", None),
                                          ("auto", None)])
def test_env_values_accepted(monkeypatch: pytest.MonkeyPatch, value: str,
                             chosen: str | None) -> None:
    fake = _CpuWithout(["scalar", "avx2"])
    monkeypatch.setenv(vk.ISA_ENV, value)
    monkeypatch.setattr(vk, "_env_applied", False)
    vk._apply_isa_env(fake)  # type: ignore[arg-type]
    assert fake.chosen == chosen


def test_env_path_the_cpu_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _CpuWithout(["scalar", "avx2"])
    monkeypatch.setenv(vk.ISA_ENV, "avx512")
    monkeypatch.setattr(vk, "_env_applied", False)
    with pytest.raises(KernelError, match=r"cannot run the avx512 path .*supports scalar, avx2"):
        vk._apply_isa_env(fake)  # type: ignore[arg-type]
    assert fake.chosen is None and vk._env_applied is False  # raised again on the next call


def test_real_extension_refuses_a_missing_path() -> None:
    missing = [i for i in vk.ISAS if i not in ISAS]
    if not missing:
        pytest.skip("this CPU runs every ISA path")
    with pytest.raises(KernelError, match="not supported by this CPU"):
        vk.set_isa(missing[0])


def test_every_isa_path_gives_one_model_forward(tiny_loaded: LoadedModel) -> None:
    """In-process: the same generation (prefill + decode + sampling) on every path this CPU has."""
    if len(ISAS) < 2:
        pytest.skip("only one ISA path on this CPU")
    eng = Engine(tiny_loaded, "invariant", max_seqs=4, max_batch_tokens=48)
    try:
        runs = {}
        for isa in ISAS:
            with vk.forced_isa(isa):
                res = eng.generate(PROMPT, PARAMS)
            runs[isa] = (res.token_ids, res.step_digests)
    finally:
        eng.close()
    assert all(r == runs["scalar"] for r in runs.values()), runs.keys()
