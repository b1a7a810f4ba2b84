"""Which engine a process builds for a model file: the ONE dispatch from a backend name to an
engine factory, for every node that builds engines by name (the verifier's job, node and
enclave, the devnet).

``own`` is the invariant CPU engine (``Engine.from_path``); ``vllm`` is
``VllmEngine.from_path`` (docs/backends.md). vLLM is imported only when the ``vllm`` backend
is chosen and an engine or a fingerprint is asked for: a verifier on the own engine never
loads it (and runs where it is not installed).

The engine fingerprint of the own engine depends on the kernels, not the model; vLLM's names
the exported weights (``weights=<sha256>`` in its ``linear_order``), so a node computes it per
model file (:meth:`EngineChoice.fingerprint`) — without starting vLLM, which costs a minute.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verinfer.errors import BadInputError

if TYPE_CHECKING:
    from verinfer.engine.engine import Engine
    from verinfer.engine.fingerprint import EngineFingerprint

BACKENDS = ("own", "vllm")
OWN_KERNELS = ("invariant", "fast")


class UnknownBackendError(BadInputError):
    """A backend name, kernel mode or backend setting this build does not know."""

    code = "unknown_backend"


@dataclass(frozen=True)
class EngineChoice:
    """The backend and the settings that decide its fingerprint (so an operator and a verifier
    choosing the same get the same approved fingerprint on the same machine)."""

    backend: str = "own"
    kernels: str = "invariant"  # own: invariant | fast (vllm: not used)
    threads: int = 1  # vllm: CPU threads (in the fingerprint's hardware class)
    # vllm: sequences stepped together. 1 on CPU: batched decode changes vLLM-CPU's logits
    # bits (the self-test fails there, docs/backends.md §4); a verifier judges alone anyway.
    max_seqs: int = 1

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UnknownBackendError(
                f"unknown engine backend {self.backend!r} ({' | '.join(BACKENDS)})", param="backend"
            )
        if self.backend == "own" and self.kernels not in OWN_KERNELS:
            raise UnknownBackendError(
                f"the own engine's kernels are {' | '.join(OWN_KERNELS)}, not {self.kernels!r}",
                param="kernels",
            )
        if self.threads < 1 or self.max_seqs < 1:
            raise UnknownBackendError("threads and max_seqs must be at least 1", param="threads")

    @classmethod
    def of(cls, spec: str | EngineChoice) -> EngineChoice:
        """An EngineChoice from the older one-string form: a kernel mode of the own engine
        (``invariant``, ``fast``) or a backend name (``own``, ``vllm``) with its defaults."""
        if isinstance(spec, EngineChoice):
            return spec
        if spec in OWN_KERNELS:
            return cls("own", spec)
        return cls(spec)

    @property
    def per_model_fingerprint(self) -> bool:
        """Whether the fingerprint depends on the model (vLLM: its weights hash)."""
        return self.backend == "vllm"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EngineChoice:
        try:
            return cls(
                str(doc["backend"]),
                str(doc.get("kernels", "invariant")),
                int(doc.get("threads", 1)),
                int(doc.get("max_seqs", 1)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UnknownBackendError(f"not an engine choice: {e!r:.200}", param="backend") from e

    def load(self, path: str | Path) -> Engine:
        """A started engine of this backend for the model file ``path``."""
        if self.backend == "own":
            from verinfer.engine.engine import Engine

            return Engine.from_path(path, self.kernels)  # type: ignore[arg-type]
        from verinfer.engine.vllm_backend.engine import VllmEngine

        return VllmEngine.from_path(path, settings=self._vllm_settings())

    def fingerprint(self, path: str | Path) -> EngineFingerprint:
        """The fingerprint :meth:`load` would give for ``path`` in this process, without
        starting the engine (vLLM: the export's weights hash, exported once into the cache)."""
        if self.backend == "own":
            from verinfer.engine.fingerprint import local_fingerprint

            return local_fingerprint(self.kernels)
        from verinfer.engine.export_hf import ensure_export
        from verinfer.engine.vllm_backend.fingerprint import vllm_fingerprint
        from verinfer.engine.vllm_backend.settings import require_vllm

        settings = self._vllm_settings()
        settings.apply_environment()
        require_vllm()
        return vllm_fingerprint(settings, ensure_export(Path(path)).weights_sha256)

    def _vllm_settings(self) -> Any:
        from verinfer.engine.vllm_backend.settings import VllmSettings

        return VllmSettings(threads=self.threads, max_num_seqs=self.max_seqs)
