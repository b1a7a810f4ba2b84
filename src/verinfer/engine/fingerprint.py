"""Engine fingerprint: everything besides weights and tokens that could change an output bit.

It has two parts, and only the first is hashed:

* APPROVED (:meth:`EngineFingerprint.canonical`, :attr:`EngineFingerprint.hash`): what decides
  the bits — backend, kernel mode and summation order, sampling rule, dtype, the pinned
  container image, and the hardware class *where it matters* (the ``fast`` kernels run
  PyTorch's own GEMMs, whose order depends on the ISA and the torch build; the ``invariant``
  kernels give the same bits on AVX-512, AVX2 and scalar — docs/engine.md — so for them the
  hardware class is ``any``). The image digest comes from the container runtime
  (engine/container.py), never from the operator: ``none`` outside a pinned image. This
  string goes into every ExecRequest, its sha256 into every receipt
  (``engineFingerprintHash``), and governance approves that hash on chain.
* REPORTED (:attr:`EngineFingerprint.reported`): the CPU model string, the ISA path the
  kernels dispatched to, library versions and host facts. Shown in ``/health`` for diagnosis,
  never hashed: a host move or a library upgrade that cannot change a bit must not make every
  receipt the operator signs slashable at challenge open (issue 13.5).

Two engines with equal approved fingerprints, weights and token ids must produce equal bytes;
the short form becomes the OpenAI ``system_fingerprint``.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

import verinfer
from verinfer.engine.container import running_image
from verinfer.engine.sampling import SAMPLING_RULE

# 5: the image digest read from the container runtime, "none" outside one (4 read an
# operator-set environment variable, "" when unset); 4: approved/reported split
FINGERPRINT_VERSION = 5
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile")
# Kernel modes whose bits do not depend on the machine (fixed summation order, exactly
# rounded FMA, own exp): their hardware class is "any".
_MACHINE_INDEPENDENT_KERNELS = ("invariant",)
#: the ``backend`` of the own engine on a GPU (Triton kernels, engine/triton_ops.py)
DEVICE_BACKEND = "torch-cuda"


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
    # ---- approved: hashed, decides the bits ----
    version: int
    backend: str
    kernels: str  # invariant | fast
    linear_order: str  # summation order of every matmul (Ops.linear_order)
    sampler: str  # the token sampling rule (sampling.SAMPLING_RULE)
    dtype: str
    container_digest: str  # the running image's sha256 manifest digest, or "none" (container.py)
    hardware_class: str  # "any", or what the kernels' bits depend on (fast mode)
    # ---- reported: diagnostics only, excluded from canonical()/hash ----
    reported: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def approved(self) -> dict[str, Any]:
        out = asdict(self)
        del out["reported"]
        return out

    def canonical(self) -> bytes:
        """The approved part as canonical JSON: the ExecRequest's ``engine_fingerprint``."""
        return json.dumps(self.approved(), sort_keys=True, separators=(",", ":")).encode()

    @property
    def hash(self) -> bytes:
        """sha256(canonical()), 32 bytes: the receipt's engineFingerprintHash."""
        return hashlib.sha256(self.canonical()).digest()

    @property
    def system_fingerprint(self) -> str:
        return f"vi-{self.kernels}-{self.hash.hex()[:16]}"


def hardware_class(kernel_mode: str, kernel_isa: str, flags: list[str]) -> str:
    if kernel_mode in _MACHINE_INDEPENDENT_KERNELS:
        return "any"
    # PyTorch's GEMMs pick their blocking (and so their summation order) by ISA and build.
    return f"cpu:{kernel_isa}:{'+'.join(flags)};torch:{torch.__version__}"


def engine_fingerprint(kernel_mode: str, kernel_isa: str, linear_order: str,
                       container_digest: str | None = None, *,
                       device_ops: Any = None) -> EngineFingerprint:
    """This process's fingerprint. ``container_digest`` None: the running image's, as the
    container runtime states it (tests and tools computing another machine's pass it).
    ``device_ops``: the Ops of an engine off the CPU path (engine/triton_ops.py): backend
    ``torch-cuda``, hardware class ``cuda:<SKU>`` (the GPU and its facts reported)."""
    name, flags = cpu_description()
    image = running_image()
    digest = container_digest if container_digest is not None else image.digest
    backend, hw = "torch-cpu", hardware_class(kernel_mode, kernel_isa, flags)
    extra: dict[str, Any] = {}
    if device_ops is not None:
        from verinfer.engine.triton_ops import COMPUTE_DTYPE, hardware_facts

        backend = DEVICE_BACKEND
        hw, extra = hardware_facts(device_ops)
        if kernel_mode not in _MACHINE_INDEPENDENT_KERNELS:  # cuBLAS: its order is the build's
            hw = f"{hw};torch:{torch.__version__}"
        assert COMPUTE_DTYPE == "float32"  # the dtype field below
    return EngineFingerprint(
        version=FINGERPRINT_VERSION,
        backend=backend,
        kernels=kernel_mode,
        linear_order=linear_order,
        sampler=SAMPLING_RULE,
        dtype="float32",
        container_digest=digest,
        hardware_class=hw,
        reported={"device": name, "cpu_flags": flags, "kernel_isa": kernel_isa,
                  "torch": torch.__version__, "numpy": np.__version__,
                  "verinfer": verinfer.__version__, "host": platform.node(),
                  "python": platform.python_version(), "container_source": image.source,
                  **extra},
    )


def local_fingerprint(kernel_mode: str = "invariant", device: str = "cpu") -> EngineFingerprint:
    """The fingerprint an engine with ``kernel_mode`` on ``device`` would have in this process,
    without loading a model (it depends on the kernels, not the model): what ``operator init``
    asks governance to approve."""
    from verinfer.engine.ops import make_ops

    isa = "none"
    if kernel_mode == "invariant" and device == "cpu":
        from verinfer.engine import kernels

        isa = kernels.isa()
    if device == "cpu":
        ops: Any = make_ops(kernel_mode)  # type: ignore[arg-type]
    else:
        from verinfer.engine.triton_ops import device_ops

        ops = device_ops(kernel_mode, device)  # type: ignore[arg-type]
    return engine_fingerprint(kernel_mode, isa, ops.linear_order,
                              device_ops=ops if device != "cpu" else None)
