"""Model families: which architectures the engine runs, and how each one's hyper-parameters and
tensor names are read from GGUF metadata or an HF ``config.json``.

One place to add a family: its ``ModelConfig`` reading here, its forward pass in a small file
beside ``gemma3.py``/``llama.py``, and its class in :func:`model_class`. An architecture not
listed is refused with a clear :class:`ModelLoadError` naming the supported ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verinfer.engine.config import ModelConfig
from verinfer.errors import ModelLoadError

SUPPORTED_ARCHS = ("gemma3", "llama")


def config_from_gguf(f: Mapping[str, Any], n_vocab: int) -> ModelConfig:
    arch = f.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHS}")

    def req(key: str) -> Any:
        full = f"{arch}.{key}"
        if full not in f:
            raise ModelLoadError(f"GGUF metadata lacks {full!r}")
        return f[full]

    dim = int(req("embedding_length"))
    n_heads = int(req("attention.head_count"))
    head_dim = int(f.get(f"{arch}.attention.key_length", dim // n_heads))
    common: dict[str, Any] = dict(
        vocab_size=n_vocab,
        dim=dim,
        n_layers=int(req("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(f.get(f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        ffn_dim=int(req("feed_forward_length")),
        norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        context_length=int(req("context_length")),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10_000.0)),
    )
    if arch == "gemma3":
        window = f.get("gemma3.attention.sliding_window")
        return ModelConfig(
            arch="gemma3",
            sliding_window=int(window) if window else None,
            query_pre_attn_scalar=float(head_dim),
            **common,
        )
    return ModelConfig(arch="llama", rope_interleaved=True, **common)



def config_from_hf(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """The ModelConfig of an HF ``config.json`` (its ``text_config`` when nested)."""
    hf_cfg = hf_cfg.get("text_config", hf_cfg)
    model_type = str(hf_cfg.get("model_type", ""))
    arch = "gemma3" if model_type.startswith("gemma3") else "llama" if model_type == "llama" else ""
    if not arch:
        raise ModelLoadError(f"unsupported model_type {model_type!r}")
    dim, n_heads = int(hf_cfg["hidden_size"]), int(hf_cfg["num_attention_heads"])
    head_dim = int(hf_cfg.get("head_dim") or dim // n_heads)
    common: dict[str, Any] = dict(
        vocab_size=int(hf_cfg["vocab_size"]),
        dim=dim,
        n_layers=int(hf_cfg["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(hf_cfg.get("num_key_value_heads", n_heads)),
        head_dim=head_dim,
        ffn_dim=int(hf_cfg["intermediate_size"]),
        norm_eps=float(hf_cfg.get("rms_norm_eps", 1e-6)),
        context_length=int(hf_cfg.get("max_position_embeddings", 4096)),
        rope_theta=float(hf_cfg.get("rope_theta", 10_000.0)),
    )
    if arch == "gemma3":
        window = hf_cfg.get("sliding_window")
        return ModelConfig(
            arch="gemma3",
            sliding_window=int(window) if window else None,
            query_pre_attn_scalar=float(hf_cfg.get("query_pre_attn_scalar", head_dim)),
            rope_local_theta=float(hf_cfg.get("rope_local_base_freq", 10_000.0)),
            **common,
        )
    else:
        return ModelConfig(
            arch="llama",
            rope_interleaved=False,
            tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
            **common,
        )


_HF_TO_GGUF = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def gguf_name(hf: str, arch: str) -> str | None:
    hf = hf.removeprefix("model.").removeprefix("language_model.")
    if hf == "embed_tokens.weight":
        return "token_embd.weight"
    if hf == "norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers":
        sub = parts[2]
        if arch == "llama" and sub == "post_attention_layernorm.weight":
            sub_gguf = "ffn_norm.weight"  # llama has one pre-MLP norm under this HF name
        else:
            sub_gguf = _HF_TO_GGUF.get(sub, "")
        return f"blk.{parts[1]}.{sub_gguf}" if sub_gguf else None
    return None




def model_class(config: ModelConfig) -> type:
    """The forward-pass class of ``config.arch``."""
    from verinfer.engine.models.gemma3 import Gemma3
    from verinfer.engine.models.llama import Llama

    classes: dict[str, type] = {"gemma3": Gemma3, "llama": Llama}
    try:
        return classes[config.arch]
    except KeyError:
        raise ModelLoadError(f"unsupported architecture {config.arch!r}; "
                             f"supported: {SUPPORTED_ARCHS}") from None
