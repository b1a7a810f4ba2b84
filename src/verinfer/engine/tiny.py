"""A tiny Llama-family model with seeded random weights, written as a real GGUF file.

Tests (and `verinfer tiny-model`) write it so that the real loading path — GGUF parsing,
dequantization, tokenizer from metadata — runs everywhere without any download. Different
seeds give different models with the same shapes and tokenizer (a "wrong model" for audits).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from verinfer.engine.tokenizer.spm import tiny_spm_vocab


@dataclass(frozen=True)
class TinySpec:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 128
    context_length: int = 2048
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    weight_std: float = 0.08  # large enough that logits are far from uniform

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class LlamaShape(Protocol):
    """The hyperparameters every llama-like GGUF file states (TinySpec, the test families)."""

    @property
    def dim(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def ffn_dim(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def norm_eps(self) -> float: ...


def add_llama_hparams(w: Any, name: str, spec: LlamaShape, *, head_dim_keys: bool = False) -> None:
    """Write the ``gguf.GGUFWriter`` ``w``'s name and shape keys in the order llama.cpp's
    converter writes them (the order is part of the file's bytes, so of its model id).
    ``head_dim_keys`` adds ``attention.key_length``/``value_length``, which a family whose heads
    are not ``dim / n_heads`` wide needs."""
    w.add_name(name)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.dim)
    w.add_block_count(spec.n_layers)
    w.add_feed_forward_length(spec.ffn_dim)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    if head_dim_keys:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(spec.norm_eps)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_rope_dimension_count(spec.head_dim)


def add_quantized(w: Any, name: str, array: np.ndarray, qtype: str) -> None:
    """Store ``array`` as the GGUF block type ``qtype`` (Q8_0, Q5_0, ...) exactly as llama.cpp
    quantizes it, so the engine's quantized paths read what a real file holds."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    w.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)


def close_gguf(w: Any) -> None:
    """Write out everything added to ``w`` (header, metadata, tensors) and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_llama(path: str | Path, seed: int = 0, spec: TinySpec = TinySpec(), *,
                     chat_template: str | None = None) -> Path:
    """Write the tiny model to ``path`` (a .gguf file) and return the path; ``chat_template``:
    a Jinja chat template to ship in the file (``tokenizer.chat_template``; default none)."""
    import gguf

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = tiny_spm_vocab()
    vocab = len(tok["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    rng = np.random.default_rng(seed)
    head_dim = spec.head_dim

    def rand(*shape: int, std: float = spec.weight_std) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "llama")
    add_llama_hparams(w, f"verinfer-tiny-llama-seed{seed}", spec)
    add_tiny_tokenizer(w, tok)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def q8(name: str, arr: np.ndarray) -> None:  # some matrices Q8_0: the quantized path runs
        add_quantized(w, name, arr, "Q8_0")

    q8("token_embd.weight", rand(vocab, spec.dim, std=1.0))
    w.add_tensor("output_norm.weight", norm_w(spec.dim))
    w.add_tensor("output.weight", rand(vocab, spec.dim, std=0.3))
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm_w(spec.dim))
        w.add_tensor(p + "attn_q.weight", rand(spec.n_heads * head_dim, spec.dim, std=0.3))
        w.add_tensor(p + "attn_k.weight", rand(spec.n_kv_heads * head_dim, spec.dim, std=0.3))
        q8(p + "attn_v.weight", rand(spec.n_kv_heads * head_dim, spec.dim))
        w.add_tensor(p + "attn_output.weight", rand(spec.dim, spec.n_heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", norm_w(spec.dim))
        w.add_tensor(p + "ffn_gate.weight", rand(spec.ffn_dim, spec.dim))
        w.add_tensor(p + "ffn_up.weight", rand(spec.ffn_dim, spec.dim))
        w.add_tensor(p + "ffn_down.weight", rand(spec.dim, spec.ffn_dim))
    close_gguf(w)
    return out


def add_tiny_tokenizer(w: Any, tok: dict[str, object] | None = None) -> int:
    """Write the tiny SentencePiece vocabulary's ``tokenizer.ggml.*`` metadata into the
    ``gguf.GGUFWriter`` ``w`` (every tiny model shares it); returns the vocabulary size."""
    tok = tok if tok is not None else tiny_spm_vocab()
    tokens = list(tok["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    w.add_tokenizer_model(str(tok["tokenizer.ggml.model"]))
    w.add_token_list(tokens)
    w.add_token_scores(list(tok["tokenizer.ggml.scores"]))  # type: ignore[call-overload]
    w.add_token_types(list(tok["tokenizer.ggml.token_type"]))  # type: ignore[call-overload]
    w.add_bos_token_id(int(tok["tokenizer.ggml.bos_token_id"]))  # type: ignore[call-overload]
    w.add_eos_token_id(int(tok["tokenizer.ggml.eos_token_id"]))  # type: ignore[call-overload]
    w.add_unk_token_id(int(tok["tokenizer.ggml.unknown_token_id"]))  # type: ignore[call-overload]
    w.add_pad_token_id(int(tok["tokenizer.ggml.padding_token_id"]))  # type: ignore[call-overload]
    w.add_add_bos_token(bool(tok["tokenizer.ggml.add_bos_token"]))
    w.add_add_space_prefix(bool(tok.get("tokenizer.ggml.add_space_prefix", False)))
    return len(tokens)
