"""`verinfer model export-hf GGUF DIR`: the Hugging Face folder a second backend (vLLM) loads.

vLLM 0.32 cannot read GGUF. transformers + gguf dequantize the file into float32 tensors and
write a safetensors folder with a ``config.json``; this module does that, removes what would
make vLLM treat the folder as still quantized (``hf_quantizer``, ``quantization_config``), saves
a tokenizer that adds ``<bos>`` as ours does, checks that tokenizer against ours, and records
every file's sha256 in ``verinfer-export.json`` beside them.

The export is the model a vLLM engine computes with, so its weights hash goes into the vLLM
engine fingerprint's approved part (vllm_backend/fingerprint.py): an operator and a verifier
whose conversions differ (another transformers or gguf version) get different fingerprints
and the verifier abstains instead of voting against an honest operator. The model id stays
the GGUF file's sha256: the approved model, its tokenizer and its context are the GGUF's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.engine.loader import sha256_file
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf
from verinfer.errors import ModelLoadError
from verinfer.protocol.hexutil import parse_hex, to_hex

MANIFEST = "verinfer-export.json"
EXPORT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
# A few strings that exercise byte fallback, special tokens and spacing: the export refuses to
# finish when the saved tokenizer splits any of them differently from ours (the full corpus is
# checked by the tests).
_SMOKE_TEXTS = ("Hello, world!", "  two leading spaces", "line one\nline two\n\n",
                "<start_of_turn>user\nhi<end_of_turn>\n", "Emoji: 😀 👍🏽", "中文测试", "a" * 40)


class ExportError(ModelLoadError):
    """The GGUF file cannot be exported, or the export does not equal our model/tokenizer."""


@dataclass(frozen=True)
class HfExport:
    """An export folder and what its manifest says."""

    path: Path
    source_model_id: bytes  # sha256 of the GGUF file (the manifest writes every hash 0x-hex)
    tokenizer_hash: bytes  # our tokenizer's hash (the GGUF's)
    weights_sha256: bytes  # sha256 of model.safetensors
    files: dict[str, bytes]  # file name -> sha256
    versions: dict[str, str]

    def manifest_json(self) -> dict[str, Any]:
        """The manifest's hashes as its JSON writes them (0x-hex)."""
        return {"source_model_id": to_hex(self.source_model_id),
                "tokenizer_hash": to_hex(self.tokenizer_hash),
                "weights_sha256": to_hex(self.weights_sha256),
                "files": {n: to_hex(d) for n, d in self.files.items()}}

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_FILE


def _versions() -> dict[str, str]:
    import gguf
    import torch
    import transformers

    return {"transformers": transformers.__version__, "gguf": _dist_version("gguf", gguf),
            "torch": torch.__version__, "export": str(EXPORT_VERSION)}


def _dist_version(name: str, module: Any) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def export_hf(gguf_path: str | Path, out_dir: str | Path, *, force: bool = False) -> HfExport:
    """Writes the HF folder for ``gguf_path`` into ``out_dir`` (created; must be empty or
    an earlier export of the same file unless ``force``). Returns the manifest."""
    src, out = Path(gguf_path), Path(out_dir)
    if not src.is_file() or src.suffix != ".gguf":
        raise ExportError(f"{str(src)!r} is not a .gguf file", param="gguf")
    model_id = sha256_file(src)
    if out.exists() and any(out.iterdir()):
        try:
            existing = read_export(out)
        except ExportError:
            existing = None
        if existing is not None and existing.source_model_id == model_id and not force:
            return existing
        if not force:
            raise ExportError(f"{str(out)!r} is not empty and is no export of {src.name}; "
                              "pass --force to overwrite it", param="dir")
        shutil.rmtree(out)
    ours = tokenizer_from_gguf(src)
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ExportError("export-hf needs transformers and accelerate (run "
                          "scripts/ci-extras.d/30-vllm)") from e
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.float32)
        # What remains of the GGUF loading path would make vLLM look for GGUF kernels: the
        # tensors are plain float32 now.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp), safe_serialization=True)
        del model
        tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        tok.save_pretrained(str(tmp))
        _fix_bos(tmp, ours)
        _check_tokenizer(tmp, ours)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        if WEIGHTS_FILE not in files:
            raise ExportError(f"transformers wrote no {WEIGHTS_FILE} (files: {sorted(files)})")
        written = HfExport(out, model_id, ours.hash, files[WEIGHTS_FILE], files, _versions())
        manifest = {"version": EXPORT_VERSION, "source": src.name, **written.manifest_json(),
                    "versions": written.versions}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return read_export(out)


def _fix_bos(folder: Path, ours: Tokenizer) -> None:
    """Gemma needs ``<bos>``: the converted tokenizer's config must add it as ours does."""
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    cfg["add_bos_token"] = bool(ours.spec.add_bos)
    cfg["add_eos_token"] = bool(ours.spec.add_eos)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def hf_tokenizer(folder: str | Path) -> Any:
    """The exported folder's tokenizer as transformers (and vLLM, when it tokenizes) loads it."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(folder))


def _check_tokenizer(folder: Path, ours: Tokenizer) -> None:
    hf = hf_tokenizer(folder)
    for text in _SMOKE_TEXTS:
        want, got = ours.encode(text, add_bos=ours.spec.add_bos), list(hf(text)["input_ids"])
        if want != got:
            raise ExportError(f"the exported tokenizer splits {text!r} as {got[:12]}…, ours as "
                              f"{want[:12]}…")


def read_export(folder: str | Path, *, verify: bool = False) -> HfExport:
    """The manifest of an export folder; with ``verify`` every file is hashed again."""
    p = Path(folder)
    try:
        m = json.loads((p / MANIFEST).read_text())
        exp = HfExport(p, parse_hex(m["source_model_id"], 32, "source_model_id"),
                       parse_hex(m["tokenizer_hash"], 32, "tokenizer_hash"),
                       parse_hex(m["weights_sha256"], 32, "weights_sha256"),
                       {n: parse_hex(d, 32, n) for n, d in dict(m["files"]).items()},
                       dict(m["versions"]))
    except (OSError, ValueError, KeyError, TypeError) as e:  # (HexFormatError: a ValueError)
        raise ExportError(f"{str(p)!r} holds no readable {MANIFEST} ({type(e).__name__}); "
                          "run `verinfer model export-hf`") from None
    if verify:
        for name, digest in exp.files.items():
            f = p / name
            if not f.is_file() or sha256_file(f) != digest:
                raise ExportError(f"{name} in {str(p)!r} is missing or changed since export")
    return exp


def default_export_dir(model_id: bytes) -> Path:
    """Where a backend keeps the export of a model it was handed as GGUF (one per model id)."""
    import os

    root = Path(os.environ.get("VERINFER_HF_CACHE",
                               Path.home() / ".cache" / "verinfer" / "hf-export"))
    # named by a hash of the id's 0x-hex text (the folders exports were written to so far)
    return root / hashlib.sha256(to_hex(model_id).encode()).hexdigest()[:16]


def ensure_export(gguf_path: str | Path, out_dir: str | Path | None = None) -> HfExport:
    """The export of ``gguf_path``: reused when its manifest names this file, else written."""
    model_id = sha256_file(Path(gguf_path))
    out = Path(out_dir) if out_dir is not None else default_export_dir(model_id)
    if (out / MANIFEST).exists():
        exp = read_export(out)
        if exp.source_model_id == model_id:
            return exp
    return export_hf(gguf_path, out, force=out_dir is None)
