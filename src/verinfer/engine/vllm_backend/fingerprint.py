"""The vLLM engine fingerprint: the same EngineFingerprint type as the own engine's, with
vLLM's bit-relevant facts folded into its approved fields.

Approved (hashed, on chain): backend ``vllm``; ``kernels`` = the vLLM build; ``linear_order`` =
the torch build, the scheduler/compilation settings that can change bits (eager vs CUDA graphs,
chunked prefill, prefix caching, batch-invariant mode) and the sha256 of the exported weights
vLLM computes with; ``sampler`` = the protocol's rule (the logits hook
applies it); ``dtype``; the pinned image; ``hardware_class`` = the device where the bits depend
on it — for the CPU build the CPU model, ISA flags and thread count (oneDNN/ATen GEMM blocking
follows them), for CUDA the GPU SKU, driver and CUDA version. Unlike the own invariant kernels,
nothing here is "any": vLLM's kernels are not known to give equal bits across devices.

Reported only: versions of the rest, the host, the chunked-prefill budget (the self-test
proves chunking does not change bits), and the latest self-test summary.
"""

from __future__ import annotations

import platform

import numpy as np
import torch

import verinfer
from verinfer.engine.container import running_image
from verinfer.engine.fingerprint import FINGERPRINT_VERSION, EngineFingerprint, cpu_description
from verinfer.engine.sampling import SAMPLING_RULE
from verinfer.engine.vllm_backend.settings import VllmSettings
from verinfer.protocol.hexutil import to_hex

BACKEND = "vllm"


def device_class(settings: VllmSettings) -> str:
    """What the kernels' bits depend on: GPU SKU + driver + CUDA, or CPU model + ISA + threads."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        driver = ""
        try:
            import subprocess

            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = "unknown"
        return f"cuda:{props.name};driver={driver};cuda={torch.version.cuda}"
    name, flags = cpu_description()
    return f"cpu:{name}:{'+'.join(flags)};threads={settings.threads}"


def vllm_fingerprint(settings: VllmSettings, weights_sha256: bytes,
                     container_digest: str | None = None) -> EngineFingerprint:
    import vllm

    image = running_image()  # from the container runtime, never a value the operator types
    digest = container_digest if container_digest is not None else image.digest
    return EngineFingerprint(
        version=FINGERPRINT_VERSION,
        backend=BACKEND,
        kernels=f"vllm-{vllm.__version__}",  # short: it is in the OpenAI system_fingerprint
        linear_order=f"torch-{torch.__version__};{settings.bits_relevant()};"
                     f"weights={to_hex(weights_sha256)}",
        sampler=SAMPLING_RULE,
        dtype=settings.dtype,
        container_digest=digest,
        hardware_class=device_class(settings),
        reported={"vllm": vllm.__version__, "torch": torch.__version__,
                  "numpy": np.__version__, "verinfer": verinfer.__version__,
                  "host": platform.node(), "python": platform.python_version(),
                  "max_num_batched_tokens": settings.max_num_batched_tokens,
                  "max_num_seqs": settings.max_num_seqs,
                  "kv_cache_gib": settings.kv_cache_gib, "container_source": image.source},
    )
