"""Engine fingerprint: everything besides weights and tokens that could change an output bit.

Two engines with equal fingerprints, weights and token ids must produce equal bytes; the
short form becomes the OpenAI ``system_fingerprint``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass

import numpy as np
import torch

import verinfer
from verinfer.engine.sampling import SAMPLING_RULE

_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile")


def cpu_description() -> tuple[str, list[str]]:
    """(model name, relevant ISA flags) read from /proc/cpuinfo where available."""
    name, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    have = set(line.split(":", 1)[1].split())
                    flags = [fl for fl in _ISA_FLAGS if fl in have]
                if flags and name:
                    break
    except OSError:
        pass
    return name, flags


@dataclass(frozen=True)
class EngineFingerprint:
    version: int
    backend: str
    kernels: str  # invariant | fast
    kernel_isa: str  # code path of the compiled kernels (avx512 | avx2 | scalar | none)
    linear_order: str  # summation order of every matmul (Ops.linear_order)
    sampler: str  # the token sampling rule (sampling.SAMPLING_RULE)
    device: str
    cpu_flags: tuple[str, ...]
    dtype: str
    torch: str
    numpy: str
    verinfer: str
    container_digest: str

    def canonical(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @property
    def hash(self) -> str:
        return "0x" + hashlib.sha256(self.canonical()).hexdigest()

    @property
    def system_fingerprint(self) -> str:
        return f"vi-{self.kernels}-{self.hash[2:18]}"


def engine_fingerprint(kernel_mode: str, kernel_isa: str, linear_order: str,
                       container_digest: str | None = None) -> EngineFingerprint:
    name, flags = cpu_description()
    digest = container_digest if container_digest is not None else os.environ.get(
        "VERINFER_CONTAINER_DIGEST", "")
    return EngineFingerprint(
        version=3,
        backend="torch-cpu",
        kernels=kernel_mode,
        kernel_isa=kernel_isa,
        linear_order=linear_order,
        sampler=SAMPLING_RULE,
        device=name,
        cpu_flags=tuple(flags),
        dtype="float32",
        torch=torch.__version__,
        numpy=np.__version__,
        verinfer=verinfer.__version__,
        container_digest=digest,
    )
