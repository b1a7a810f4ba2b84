"""The vLLM export manifest (engine/export_hf.py): its hashes are 0x-hex text in the file and
32-byte values in :class:`HfExport`; reading and writing round-trip the file's JSON exactly,
and ``verify`` re-hashes every file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from verinfer.engine.export_hf import MANIFEST, ExportError, default_export_dir, read_export


def _write(folder: Path, weights: bytes, **over: object) -> dict[str, object]:
    (folder / "model.safetensors").write_bytes(weights)
    digest = "0x" + hashlib.sha256(weights).hexdigest()
    doc: dict[str, object] = {
        "version": 1, "source": "m.gguf", "source_model_id": "0x" + "11" * 32,
        "tokenizer_hash": "0x" + "22" * 32, "weights_sha256": digest,
        "files": {"model.safetensors": digest}, "versions": {"torch": "x"}, **over}
    (folder / MANIFEST).write_text(json.dumps(doc))
    return doc


def test_manifest_hashes_are_bytes_inside_and_the_same_text_outside(tmp_path: Path) -> None:
    doc = _write(tmp_path, b"weights")
    exp = read_export(tmp_path, verify=True)
    assert exp.source_model_id == b"\x11" * 32 and exp.tokenizer_hash == b"\x22" * 32
    assert exp.weights_sha256 == hashlib.sha256(b"weights").digest()
    assert {**doc, **exp.manifest_json()} == doc  # written back exactly as read


def test_a_changed_file_or_a_malformed_hash_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, b"weights")
    (tmp_path / "model.safetensors").write_bytes(b"other")
    with pytest.raises(ExportError, match="changed since export"):
        read_export(tmp_path, verify=True)
    _write(tmp_path, b"weights", source_model_id="11" * 32)  # no 0x prefix
    with pytest.raises(ExportError, match="no readable"):
        read_export(tmp_path)


def test_the_cache_folder_name_is_unchanged() -> None:
    # named by the sha256 of the id's 0x-hex text, as before the id became bytes: existing
    # exports are found again
    mid = b"\x11" * 32
    assert default_export_dir(mid).name == hashlib.sha256(
        ("0x" + mid.hex()).encode()).hexdigest()[:16]
