"""Seeded random models of every llama-like family, written twice: as a GGUF file the way
llama.cpp's ``convert_hf_to_gguf.py`` writes that family, and as the matching HF transformers
model with the very same weights. The engine's copy must then match the HF forward (the
reference definition of each architecture) — which proves both the forward pass and our reading
of the family's GGUF conventions (tensor names, q/k permutation, fused tensors, metadata keys).

No such weights ship on PyPI, so this is how the families are proven (tests/unit/
test_model_families.py). Weights are rounded to fp16 values first, so the GGUF file can store
its matrices as F16 (as ``--outtype f16`` does) and both sides still hold identical numbers.
transformers is a dev dependency: imported inside :func:`hf_model` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verinfer.engine.config import RopeScaling
from verinfer.engine.models.common import rope_divisors
from verinfer.engine.models.registry import gguf_name
from verinfer.engine.tiny import add_llama_hparams, add_quantized, add_tiny_tokenizer, close_gguf
from verinfer.engine.tokenizer.spm import tiny_spm_vocab

# family → (GGUF general.architecture, HF model_type)
FAMILY_ARCH = {
    "llama": ("llama", "llama"),
    "llama3": ("llama", "llama"),  # Llama 3.1/3.2: "llama3" rope scaling, tied head (3.2)
    "mistral": ("llama", "mistral"),  # llama.cpp writes Mistral as llama
    "qwen2": ("qwen2", "qwen2"),
    "qwen3": ("qwen3", "qwen3"),
    "phi3": ("phi3", "phi3"),
    "gemma3": ("gemma3", "gemma3_text"),  # Gemma 3 4B+ style: linear rope scaling (global)
}
FAMILIES = tuple(FAMILY_ARCH)


@dataclass(frozen=True)
class FamilySpec:
    family: str
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 128
    context_length: int = 512
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    sliding_window: int | None = None
    rope_scaling: RopeScaling | None = None
    weight_std: float = 0.08
    extra: dict[str, Any] = field(default_factory=dict)


def family_spec(family: str) -> FamilySpec:
    """The tiny shape of each family, chosen so its twist is exercised by a 40-token prompt:
    windows shorter than the prompt, llama3 scaling whose three frequency bands (kept,
    blended, divided) all occur at head_dim 16, Qwen3 heads wider than dim / n_heads."""
    if family not in FAMILY_ARCH:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    spec = FamilySpec(family)
    if family == "llama3":
        return replace(spec, tie_embeddings=True, rope_theta=500_000.0,
                       rope_scaling=RopeScaling("llama3", factor=8.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0,
                                                original_context_length=64))
    if family == "mistral":
        return replace(spec, sliding_window=8)
    if family == "qwen2":
        return replace(spec, tie_embeddings=True, rope_theta=1_000_000.0)
    if family == "qwen3":
        return replace(spec, head_dim=32, rope_theta=1_000_000.0)
    if family == "phi3":
        return replace(spec, sliding_window=12, n_kv_heads=4)
    if family == "gemma3":  # 6 layers: 5 sliding + 1 global, as the pattern of 6 says
        return replace(spec, n_layers=6, n_kv_heads=1, head_dim=32, sliding_window=8,
                       tie_embeddings=True, rope_theta=1_000_000.0,
                       rope_scaling=RopeScaling("linear", factor=8.0))
    return spec


def random_state(spec: FamilySpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named float32 weights, every value an fp16 number."""
    rng = np.random.default_rng(seed)
    vocab = len(tiny_spm_vocab()["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    d, h, kv, hd, f = spec.dim, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.ffn_dim

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.float16).astype(np.float32))

    def rand(*shape: int, std: float = spec.weight_std) -> torch.Tensor:
        return t(rng.standard_normal(shape) * std)

    gemma = spec.family == "gemma3"

    def norm(n: int) -> torch.Tensor:  # Gemma's HF norms hold w and multiply by (1 + w)
        return t((0.0 if gemma else 1.0) + rng.standard_normal(n) * 0.1)

    s: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(vocab, d, std=1.0)}
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = norm(d)
        if spec.family == "phi3":
            s[p + "self_attn.qkv_proj.weight"] = rand((h + 2 * kv) * hd, d, std=0.3)
        else:
            s[p + "self_attn.q_proj.weight"] = rand(h * hd, d, std=0.3)
            s[p + "self_attn.k_proj.weight"] = rand(kv * hd, d, std=0.3)
            s[p + "self_attn.v_proj.weight"] = rand(kv * hd, d)
        if spec.family == "qwen2":
            s[p + "self_attn.q_proj.bias"] = rand(h * hd, std=0.5)
            s[p + "self_attn.k_proj.bias"] = rand(kv * hd, std=0.5)
            s[p + "self_attn.v_proj.bias"] = rand(kv * hd, std=0.5)
        if spec.family in ("qwen3", "gemma3"):
            s[p + "self_attn.q_norm.weight"] = norm(hd)
            s[p + "self_attn.k_norm.weight"] = norm(hd)
        s[p + "self_attn.o_proj.weight"] = rand(d, h * hd)
        s[p + "post_attention_layernorm.weight"] = norm(d)
        if gemma:  # sandwich norms around the MLP
            s[p + "pre_feedforward_layernorm.weight"] = norm(d)
            s[p + "post_feedforward_layernorm.weight"] = norm(d)
        if spec.family == "phi3":
            s[p + "mlp.gate_up_proj.weight"] = rand(2 * f, d)
        else:
            s[p + "mlp.gate_proj.weight"] = rand(f, d)
            s[p + "mlp.up_proj.weight"] = rand(f, d)
        s[p + "mlp.down_proj.weight"] = rand(d, f)
    s["model.norm.weight"] = norm(d)
    if not spec.tie_embeddings:
        s["lm_head.weight"] = rand(vocab, d, std=0.3)
    return s


def permute_for_gguf(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute``: within each head, rows (half layout) are reordered
    so that rotating adjacent pairs equals HF's rotate-half. Applied to q (n_head = heads) and
    k (n_head = kv heads) of ``llama`` models only."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def quant_round_trip(state: dict[str, torch.Tensor], qtype: str) -> dict[str, torch.Tensor]:
    """``state`` with every matrix replaced by the values a GGUF ``qtype`` block holds for it
    (what the engine reads from a file written with ``matrix_type=qtype``): the HF side of a
    quantized comparison. Quantization is per row, so llama's q/k row permutation commutes."""
    import gguf

    t = gguf.GGMLQuantizationType[qtype]
    return {k: torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(v.numpy(), t), t)
                                .reshape(v.shape).astype(np.float32)) if v.ndim == 2 else v
            for k, v in state.items()}


def write_family_gguf(path: str | Path, spec: FamilySpec, state: dict[str, torch.Tensor],
                      seed: int = 0, *, matrix_type: str = "F16", arch: str | None = None,
                      extra_metadata: dict[str, Any] | None = None,
                      extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``state`` as llama.cpp's converter writes an HF checkpoint of ``spec.family``.
    Matrices are stored as ``matrix_type`` (F16, or a 32-wide block type: Q8_0, Q5_0, Q4_1),
    vectors as F32. ``arch``, ``extra_metadata`` (full keys, written as given) and
    ``extra_tensors`` build the files a refusal test needs (another architecture, a rope type
    the engine refuses …)."""
    import gguf

    arch = arch or FAMILY_ARCH[spec.family][0]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    add_llama_hparams(w, f"verinfer-tiny-{spec.family}-seed{seed}", spec, head_dim_keys=True)
    if spec.family == "phi3":  # Phi3MiniModel writes both, 0 meaning "no window"
        w.add_rope_scaling_orig_ctx_len(spec.context_length)
        w.add_sliding_window(spec.sliding_window or 0)
    elif spec.sliding_window:
        # llama.cpp's converter writes no window for Mistral (llama.cpp runs it with full
        # attention); the key is the GGUF spelling of HF's sliding_window, which we honour.
        w.add_sliding_window(spec.sliding_window)
    if spec.rope_scaling is not None and spec.rope_scaling.kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(spec.rope_scaling.factor)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))
    add_tiny_tokenizer(w)

    permuted = arch == "llama"
    for hf, tensor in state.items():
        name = gguf_name(hf, arch)
        if name is None:
            raise ValueError(f"no GGUF name for {hf}")
        x = tensor
        if permuted and name.endswith(("attn_q.weight", "attn_q.bias")):
            x = permute_for_gguf(x, spec.n_heads)
        elif permuted and name.endswith(("attn_k.weight", "attn_k.bias")):
            x = permute_for_gguf(x, spec.n_kv_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            x = x + 1.0  # Gemma's converter bakes HF's (1 + w) into the stored norm
        a = x.numpy()
        if a.ndim == 1:  # vectors stay F32, as llama.cpp keeps them
            w.add_tensor(name, a)
        elif matrix_type == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            add_quantized(w, name, a, matrix_type)
    if spec.rope_scaling is not None and spec.rope_scaling.kind == "llama3":
        # LlamaModel.generate_extra_tensors: the rule baked into per-frequency divisors
        w.add_tensor("rope_freqs.weight",
                     rope_divisors(spec.rope_scaling, spec.head_dim, spec.rope_theta).numpy())
    for name, a in (extra_tensors or {}).items():
        w.add_tensor(name, a)
    close_gguf(w)
    return out


def hf_config(spec: FamilySpec) -> Any:
    """The transformers config of ``spec`` (eager attention, fp32)."""
    from transformers import AutoConfig

    _, model_type = FAMILY_ARCH[spec.family]
    vocab = len(tiny_spm_vocab()["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    sc = spec.rope_scaling
    if sc is not None:
        rope = {"rope_type": sc.kind, "rope_theta": spec.rope_theta, "factor": sc.factor}
        if sc.kind == "llama3":
            rope.update(low_freq_factor=sc.low_freq_factor, high_freq_factor=sc.high_freq_factor,
                        original_max_position_embeddings=sc.original_context_length)
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=spec.dim, intermediate_size=spec.ffn_dim,
        num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
        rms_norm_eps=spec.norm_eps, max_position_embeddings=spec.context_length,
        rope_parameters=rope, tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    if model_type in ("mistral", "phi3", "gemma3_text"):
        kwargs["sliding_window"] = spec.sliding_window
    if model_type == "gemma3_text":  # one rope per attention type; scaling on the global one
        kwargs["rope_parameters"] = {"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": 10_000.0}}
        kwargs["query_pre_attn_scalar"] = spec.head_dim
    if model_type == "phi3":
        kwargs["original_max_position_embeddings"] = spec.context_length
        del kwargs["head_dim"]  # Phi3Config derives it (dim / heads)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    cfg._attn_implementation = "eager"
    return cfg


def hf_model(spec: FamilySpec, state: dict[str, torch.Tensor]) -> Any:
    """The HF transformers causal LM of ``spec`` holding ``state`` (fp32, eval mode)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (spec.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"HF {spec.family}: missing {missing}, unexpected {unexpected}")
    if spec.tie_embeddings:
        model.tie_weights()
    return model.eval()


@torch.inference_mode()
def hf_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] of every position."""
    return model(torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens, each from a full forward over the sequence so far (no KV cache,
    no generation config: the plainest reference)."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(hf_logits(model, seq)[-1].argmax()))
    return seq[len(ids):]
