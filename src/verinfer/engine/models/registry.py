"""Model families: which architectures the engine runs, and how each one's hyper-parameters and
tensor names are read from GGUF metadata or an HF ``config.json``.

One place to add a family: its ``ModelConfig`` reading here, its forward pass in a small file
beside ``gemma3.py``/``llama.py``, and its class in :func:`model_class`. An architecture not
listed is refused with a clear :class:`ModelLoadError` naming the supported ones.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any, cast

from verinfer.engine.config import Arch, ModelConfig, RopeScaling
from verinfer.errors import ModelLoadError

SUPPORTED_ARCHS = ("gemma3", "llama", "qwen2", "qwen3", "phi3")
# Only llama.cpp's ``llama`` converter (Llama, Mistral, SmolLM …) permutes the q/k rows so that
# GGUF rotates adjacent pairs; qwen2/qwen3/phi3/gemma3 GGUFs keep HF's half (NeoX) layout.
ROPE_PERMUTED_IN_GGUF = ("llama",)
# HF model_type → engine arch (Mistral is Llama + a sliding window, as in llama.cpp)
_HF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
            "phi3": "phi3"}


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
    value_dim = int(f.get(f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ModelLoadError(f"{arch}: value heads of {value_dim} differ from key heads of "
                             f"{head_dim}; the engine needs them equal")
    rot = f.get(f"{arch}.rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
        raise ModelLoadError(f"{arch}: partial rotary ({rot} of {head_dim} head dimensions) is "
                             "not supported")
    context = int(req("context_length"))
    common: dict[str, Any] = dict(
        vocab_size=n_vocab,
        dim=dim,
        n_layers=int(req("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(f.get(f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        ffn_dim=int(req("feed_forward_length")),
        norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        context_length=context,
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10_000.0)),
    )
    window = f.get(f"{arch}.attention.sliding_window")
    if arch == "gemma3":
        # GGUF has no key for the attention scale: llama.cpp takes dim / heads for the 62-layer
        # Gemma 3 27B (HF query_pre_attn_scalar 168) and the head size for every other size.
        n_layers = common["n_layers"]
        scalar = dim / n_heads if n_layers == 62 else float(head_dim)
        return ModelConfig(
            arch="gemma3",
            sliding_window=int(window) if window else None,
            query_pre_attn_scalar=scalar,
            # Gemma 3 4B+: linear scaling on the global layers only (llama.cpp keeps the
            # sliding layers' scale at 1, as HF's rope_parameters["sliding_attention"] does)
            rope_scaling=_gguf_rope_scaling(f, arch, context),
            **common,
        )
    return ModelConfig(
        arch=arch,
        rope_interleaved=arch in ROPE_PERMUTED_IN_GGUF,
        rope_scaling=_gguf_rope_scaling(f, arch, context),
        # Mistral/Phi-3: one window for every layer (0 or absent: full attention)
        sliding_window=int(window) if window else None,
        sliding_window_pattern=0,
        **common,
    )


def _gguf_rope_scaling(f: Mapping[str, Any], arch: str, context: int) -> RopeScaling | None:
    """``{arch}.rope.scaling.*`` as llama.cpp writes it. Llama 3.1's rule comes as the
    ``rope_freqs.weight`` tensor instead (read by the model, see llama.py), not from here."""
    kind = str(f.get(f"{arch}.rope.scaling.type", "none")).lower()
    factor = f.get(f"{arch}.rope.scaling.factor")
    legacy = f.get(f"{arch}.rope.scale_linear")  # the key before rope.scaling.* existed
    if kind == "none" and legacy is not None and float(legacy) != 1.0:
        kind, factor = "linear", legacy
    original = f.get(f"{arch}.rope.scaling.original_context_length")
    if arch == "phi3" and (f.get("phi3.rope.scaling.attn_factor") is not None
                           or (original is not None and int(original) < context)):
        # Phi-3 128k (su/longrope): llama.cpp's converter writes no type, only these keys
        kind = "longrope"
    if kind == "none":
        return None
    if kind == "linear":
        if factor is None or float(factor) <= 0:
            raise ModelLoadError(f"{arch}: linear rope scaling without a positive "
                                 f"{arch}.rope.scaling.factor")
        if float(factor) == 1.0:
            return None
        return RopeScaling("linear", float(factor))
    raise ModelLoadError(f"{arch}: rope scaling type {kind!r} is not supported (supported: "
                         "none, linear, and Llama 3's rope_freqs); its frequencies depend on "
                         "the sequence length or need kernels the engine does not have")


def config_from_hf(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """The ModelConfig of an HF ``config.json`` (its ``text_config`` when nested)."""
    hf_cfg = hf_cfg.get("text_config", hf_cfg)
    model_type = str(hf_cfg.get("model_type", ""))
    arch = "gemma3" if model_type.startswith("gemma3") else _HF_ARCH.get(model_type, "")
    if not arch:
        raise ModelLoadError(f"unsupported model_type {model_type!r}; supported: "
                             f"gemma3, {', '.join(sorted(_HF_ARCH))}")
    dim, n_heads = int(hf_cfg["hidden_size"]), int(hf_cfg["num_attention_heads"])
    head_dim = int(hf_cfg.get("head_dim") or dim // n_heads)
    # transformers 5 nests rope settings in rope_parameters (Gemma 3: one dict per attention
    # type); config.json files of transformers 4 say rope_scaling and rope_theta
    rope = dict(hf_cfg.get("rope_parameters") or hf_cfg.get("rope_scaling") or {})
    local_rope = dict(rope.get("sliding_attention") or {})
    rope = dict(rope.get("full_attention") or rope)
    if float(rope.get("partial_rotary_factor", hf_cfg.get("partial_rotary_factor", 1.0))) != 1:
        raise ModelLoadError(f"{model_type}: partial rotary is not supported")
    common: dict[str, Any] = dict(
        vocab_size=int(hf_cfg["vocab_size"]),
        dim=dim,
        n_layers=int(hf_cfg["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(hf_cfg.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        ffn_dim=int(hf_cfg["intermediate_size"]),
        norm_eps=float(hf_cfg.get("rms_norm_eps", 1e-6)),
        context_length=int(hf_cfg.get("max_position_embeddings", 4096)),
        rope_theta=float(rope.get("rope_theta", hf_cfg.get("rope_theta", 10_000.0))),
    )
    if arch == "gemma3":
        window = hf_cfg.get("sliding_window")
        return ModelConfig(
            arch="gemma3",
            sliding_window=int(window) if window else None,
            query_pre_attn_scalar=float(hf_cfg.get("query_pre_attn_scalar", head_dim)),
            rope_local_theta=float(local_rope.get("rope_theta",
                                                  hf_cfg.get("rope_local_base_freq", 10_000.0))),
            rope_scaling=_hf_rope_scaling(rope, model_type),
            **common,
        )
    for flag in ("attention_bias", "mlp_bias"):
        if hf_cfg.get(flag):
            raise ModelLoadError(f"{model_type}: {flag} is not supported")
    window = hf_cfg.get("sliding_window") if model_type in ("mistral", "phi3") else None
    if model_type in ("qwen2", "qwen3") and hf_cfg.get("use_sliding_window"):
        raise ModelLoadError(f"{model_type}: use_sliding_window (sliding window on the top "
                             "layers only) is not supported")
    return ModelConfig(
        arch=cast(Arch, arch),
        rope_interleaved=False,
        rope_scaling=_hf_rope_scaling(rope, model_type),
        sliding_window=int(window) if window else None,
        sliding_window_pattern=0,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
        **common,
    )


def _hf_rope_scaling(rope: Mapping[str, Any], model_type: str) -> RopeScaling | None:
    kind = str(rope.get("rope_type", rope.get("type", "default")))
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling("linear", float(rope["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_context_length=int(rope["original_max_position_embeddings"]),
        )
    raise ModelLoadError(f"{model_type}: rope scaling type {kind!r} is not supported "
                         "(supported: default, linear, llama3)")


_HF_TO_GGUF = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",  # qwen2
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # phi3: fused, as in its GGUF
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # phi3: [2F, dim], gate rows first
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
        if arch != "gemma3" and sub == "post_attention_layernorm.weight":
            sub_gguf = "ffn_norm.weight"  # llama-likes have one pre-MLP norm under this name
        else:
            sub_gguf = _HF_TO_GGUF.get(sub, "")
        return f"blk.{parts[1]}.{sub_gguf}" if sub_gguf else None
    return None




def expected_shapes(cfg: ModelConfig, present: Container[str]
                    ) -> dict[str, tuple[int, int]]:
    """Shapes of a few first-layer matrices that catch a config/weights mismatch at load."""
    qkv_rows = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    if cfg.arch == "phi3" and "blk.0.attn_qkv.weight" in present:
        return {"blk.0.attn_qkv.weight": (qkv_rows, cfg.dim),
                "blk.0.ffn_up.weight": (2 * cfg.ffn_dim, cfg.dim),
                "blk.0.ffn_down.weight": (cfg.dim, cfg.ffn_dim)}
    return {"blk.0.attn_q.weight": (cfg.n_heads * cfg.head_dim, cfg.dim),
            "blk.0.attn_k.weight": (cfg.n_kv_heads * cfg.head_dim, cfg.dim),
            "blk.0.ffn_down.weight": (cfg.dim, cfg.ffn_dim)}


def model_class(config: ModelConfig) -> type:
    """The forward-pass class of ``config.arch``."""
    from verinfer.engine.models.gemma3 import Gemma3
    from verinfer.engine.models.llama import Llama
    from verinfer.engine.models.phi3 import Phi3
    from verinfer.engine.models.qwen2 import Qwen2
    from verinfer.engine.models.qwen3 import Qwen3

    classes: dict[str, type] = {"gemma3": Gemma3, "llama": Llama, "qwen2": Qwen2,
                                "qwen3": Qwen3, "phi3": Phi3}
    try:
        return classes[config.arch]
    except KeyError:
        raise ModelLoadError(f"unsupported architecture {config.arch!r}; "
                             f"supported: {SUPPORTED_ARCHS}") from None
