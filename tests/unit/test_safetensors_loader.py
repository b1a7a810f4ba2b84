"""The safetensors path: the tiny GGUF model exported in HF layout loads to the same model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel, load_model
from verinfer.engine.ops import dequantize_q8_0_rows
from verinfer.errors import ModelLoadError
from verinfer.protocol.sampling_params import SamplingParams

_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permutation (GGUF interleaved rope → HF half rope)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def _export_hf(src: LoadedModel, gguf_path: Path, out: Path) -> Path:
    from safetensors.torch import save_file

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    c = src.config
    tensors: dict[str, torch.Tensor] = {}
    weights = dict(src.weights.f32)
    for name, blocks in src.weights.q8_0.items():
        weights.setdefault(name, dequantize_q8_0_rows(blocks))
    for name, w in weights.items():
        if name == "token_embd.weight":
            tensors["model.embed_tokens.weight"] = w
        elif name == "output.weight":
            tensors["lm_head.weight"] = w
        elif name == "output_norm.weight":
            tensors["model.norm.weight"] = w
        else:
            _, layer, sub = name.split(".", 2)
            if sub == "attn_q.weight":
                w = _unpermute(w, c.n_heads)
            elif sub == "attn_k.weight":
                w = _unpermute(w, c.n_kv_heads)
            tensors[f"model.layers.{layer}.{_NAMES[sub]}"] = w
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": c.dim, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.ffn_dim, "rms_norm_eps": c.norm_eps, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.context_length, "rope_theta": c.rope_theta,
        "tie_word_embeddings": False}))
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def hf_dir(tiny_path: Path, tiny_loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory
           ) -> Path:
    return _export_hf(tiny_loaded, tiny_path, tmp_path_factory.mktemp("hf") / "tiny-hf")


def test_safetensors_model_matches_the_gguf_model(hf_dir: Path, tiny_loaded: LoadedModel
                                                  ) -> None:
    st = load_model(hf_dir)
    assert st.config.arch == "llama" and not st.config.rope_interleaved
    assert st.model_id != tiny_loaded.model_id  # a different file is a different model id
    prompt = [2, 100, 200, 300, 400, 500, 17, 42]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    a, b = Engine(tiny_loaded), Engine(st)
    try:
        ra, rb = a.generate(prompt, params), b.generate(prompt, params)
        assert ra.token_ids == rb.token_ids
        assert b.replay(prompt, rb.token_ids, params).step_digests == rb.step_digests
    finally:
        a.close()
        b.close()


def test_safetensors_without_config_is_rejected(hf_dir: Path, tmp_path: Path) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(lone / "model.safetensors")
