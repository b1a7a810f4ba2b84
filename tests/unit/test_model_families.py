"""Every llama-like family the engine runs, proven on seeded random weights.

For each family (Llama, Llama 3.x rope scaling, Mistral, Qwen2, Qwen3, Phi-3, and Gemma 3 with
the linear rope scaling of its 4B+ sizes) the same weights
are written as a GGUF file the way llama.cpp's converter writes that family and loaded into the
matching HF transformers model (src/verinfer/testing/families.py). Then, on the invariant
kernels the service runs:

* logits of a 40-token prompt (longer than every sliding window) within 1e-3 of HF, same
  argmax at every position, and 16 greedy tokens equal to HF's;
* the family's twist matters: the engine without it (or HF without it) misses by more than
  1e-3, so the comparison above would have caught a wrong twist;
* batch invariance (alone vs inside a batch of other requests: same step digests) and replay
  (prompt + output in one pass reproduces every step digest);
* transformers' own GGUF reader gets our HF weights back from the file (same q/k permutation,
  names and fused tensors as llama.cpp);
* what the engine cannot run faithfully is refused with a ModelLoadError naming it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is a dev dependency "
                    "(pip install -e '.[dev]', which scripts/bootstrap runs)")

from verinfer.engine.config import ModelConfig, RopeScaling
from verinfer.engine.engine import Engine, GenerationResult
from verinfer.engine.gguf_file import read_gguf
from verinfer.engine.loader import LoadedModel, load_model
from verinfer.engine.models.common import Batch, KVCache, RopeTable, Segment
from verinfer.engine.models.llama import Llama
from verinfer.engine.models.registry import config_from_gguf, config_from_hf, model_class
from verinfer.engine.ops import make_ops
from verinfer.errors import ModelLoadError
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.testing.families import (
    FAMILIES,
    FamilySpec,
    family_spec,
    hf_config,
    hf_greedy,
    hf_logits,
    hf_model,
    quant_round_trip,
    random_state,
    write_family_gguf,
)

PROMPT_LEN = 40  # > every family's sliding window (8, 12), so windows drop keys
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=16, temperature=0.8, seed=99, ignore_eos=True)
TOL = 1e-3


@dataclass
class Family:
    name: str
    spec: FamilySpec
    state: dict[str, torch.Tensor]
    path: Path
    loaded: LoadedModel
    engine: Engine
    hf: Any
    prompt: list[int]


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    name = request.param
    spec = family_spec(name)
    state = random_state(spec, seed=0)
    path = write_family_gguf(tmp_path_factory.mktemp(name) / f"{name}.gguf", spec, state)
    loaded = load_model(path)
    engine = Engine(loaded, "invariant")
    rng = random.Random(name)
    prompt = [rng.randrange(7, loaded.config.vocab_size) for _ in range(PROMPT_LEN)]
    try:
        yield Family(name, spec, state, path, loaded, engine, hf_model(spec, state), prompt)
    finally:
        engine.close()


def _logits(lm: LoadedModel, ids: list[int], cls: type | None = None,
            cfg: ModelConfig | None = None) -> torch.Tensor:
    """Our logits [T, V] at every position of ``ids``, from a fresh model instance."""
    c = cfg or lm.config
    model = (cls or model_class(c))(c, lm.weights, make_ops("invariant"))
    cache = KVCache(c.n_layers, c.n_kv_heads, c.head_dim, len(ids))
    batch = Batch(torch.tensor(ids), [Segment(0, 0, len(ids))], [cache], torch.arange(len(ids)))
    return model.forward(batch)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


# ---- what the GGUF says ------------------------------------------------------------------
EXPECTED = {  # arch, rope rotates adjacent pairs (llama.cpp permuted q/k), window
    "llama": ("llama", True, None),
    "llama3": ("llama", True, None),
    "mistral": ("llama", True, 8),
    "qwen2": ("qwen2", False, None),
    "qwen3": ("qwen3", False, None),
    "phi3": ("phi3", False, 12),
    "gemma3": ("gemma3", False, 8),
}


def test_config_is_read_from_the_gguf_metadata(fam: Family) -> None:
    c = fam.loaded.config
    assert (c.arch, c.rope_interleaved, c.sliding_window) == EXPECTED[fam.name]
    assert (c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (
        fam.spec.dim, fam.spec.n_heads, fam.spec.n_kv_heads, fam.spec.head_dim, fam.spec.ffn_dim)
    assert c.rope_theta == fam.spec.rope_theta
    sliding = [c.is_sliding(i) for i in range(c.n_layers)]
    if c.arch == "gemma3":  # five sliding layers, then a global one
        assert sliding == [True] * 5 + [False]
    else:  # Mistral, Phi-3: one window for every layer
        assert sliding == [c.sliding_window is not None] * c.n_layers
    assert c.rope_scaling == (None if fam.name == "llama3" else fam.spec.rope_scaling)


def test_hf_config_json_gives_the_same_config(fam: Family) -> None:
    """The safetensors path (config.json) and the GGUF path agree on every hyper-parameter;
    they differ only where the formats do: GGUF llama q/k are permuted, and llama.cpp bakes
    Llama 3 rope scaling into a tensor instead of metadata."""
    hf = config_from_hf(hf_config(fam.spec).to_dict())
    gg = fam.loaded.config
    same = ("arch", "vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
            "ffn_dim", "context_length", "rope_theta", "sliding_window")
    assert {k: getattr(hf, k) for k in same} == {k: getattr(gg, k) for k in same}
    assert np.float32(hf.norm_eps) == np.float32(gg.norm_eps)  # GGUF stores eps as float32
    assert hf.rope_interleaved is False
    assert hf.rope_scaling == fam.spec.rope_scaling
    assert hf.tie_embeddings == fam.spec.tie_embeddings


def test_gguf_conventions_match_transformers_reader(fam: Family) -> None:
    """transformers' own GGUF loader (which undoes llama.cpp's q/k permutation) reads our file
    back into exactly the HF weights: our writer follows llama.cpp's conventions."""
    if fam.name == "mistral":
        pytest.skip("transformers 5.23 maps a llama GGUF named '*mistral*' to a gguf-py arch "
                    "that does not exist; the tensors are llama's, checked by the llama case")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    got = load_gguf_checkpoint(str(fam.path), return_tensors=True,
                               model_to_load=hf_model(fam.spec, fam.state),
                               torch_dtype=torch.float32)["tensors"]
    assert set(got) == set(fam.state)
    for name, want in fam.state.items():
        # exact but for Gemma's norms, which it reads back as fp32 (1 + w) - 1
        tol = 1e-7 if fam.name == "gemma3" and name.endswith("norm.weight") else 0.0
        torch.testing.assert_close(torch.as_tensor(got[name]).float(), want, rtol=0, atol=tol,
                                   msg=name)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny vocabulary as an HF tokenizer.json (every family shares it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    spec = family_spec("llama")
    path = write_family_gguf(tmp_path_factory.mktemp("tok") / "tok.gguf", spec,
                             random_state(spec))
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(
        str(path.parent / "hf"))
    return path.parent / "hf" / "tokenizer.json"


def test_hf_safetensors_checkpoint_matches_hf(fam: Family, tokenizer_json: Path,
                                             tmp_path: Path) -> None:
    """The same family from HF's own files (save_pretrained: safetensors + config.json) loads
    through config_from_hf and the HF→GGUF tensor names, unpermuted, and matches too."""
    out = tmp_path / fam.name
    fam.hf.save_pretrained(str(out))
    shutil.copy(tokenizer_json, out / "tokenizer.json")
    lm = load_model(out)
    assert lm.config.arch == EXPECTED[fam.name][0] and not lm.config.rope_interleaved
    diff = _max_diff(_logits(lm, fam.prompt), hf_logits(fam.hf, fam.prompt))
    assert diff <= TOL, f"{fam.name} from safetensors: max |Δlogit| = {diff}"


# ---- the HF comparison -------------------------------------------------------------------
def test_logits_match_hf_transformers(fam: Family) -> None:
    ours, ref = _logits(fam.loaded, fam.prompt), hf_logits(fam.hf, fam.prompt)
    diff = _max_diff(ours, ref)
    assert diff <= TOL, f"{fam.name}: max |Δlogit| = {diff}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_greedy_tokens_match_hf_transformers(fam: Family) -> None:
    ours = fam.engine.generate(fam.prompt, GREEDY).token_ids
    assert ours == hf_greedy(fam.hf, fam.prompt, GREEDY.max_tokens)


def test_the_family_twist_is_what_makes_it_match(fam: Family) -> None:
    """Negative control: without its twist the family misses HF, so the match above is not
    luck (a random-weight model that ignored its biases or window would be caught)."""
    lm, cfg = fam.loaded, fam.loaded.config
    if fam.spec.rope_scaling is not None:  # HF without the rope scaling vs our scaled engine
        plain = hf_model(dataclasses.replace(fam.spec, rope_scaling=None), fam.state)
        diff = _max_diff(_logits(lm, fam.prompt), hf_logits(plain, fam.prompt))
    else:
        wrong: dict[str, tuple[type | None, ModelConfig]] = {
            "llama": (None, dataclasses.replace(cfg, rope_interleaved=False)),  # unpermuted
            "mistral": (None, dataclasses.replace(cfg, sliding_window=None)),
            "phi3": (None, dataclasses.replace(cfg, sliding_window=None)),
            "qwen2": (Llama, cfg),  # llama ignores the q/k/v biases
            "qwen3": (Llama, cfg),  # llama skips the q/k head norms
        }
        cls, c = wrong[fam.name]
        diff = _max_diff(_logits(lm, fam.prompt, cls, c), hf_logits(fam.hf, fam.prompt))
    assert diff > 100 * TOL, f"{fam.name}: the twist changed logits by only {diff}"


# ---- the engine's properties -------------------------------------------------------------
def test_batch_invariance(fam: Family) -> None:
    """One prompt alone, then inside a batch of other requests of other lengths: same bits."""
    alone = fam.engine.generate(fam.prompt, SEEDED)
    rng = random.Random(5)
    vocab = fam.loaded.config.vocab_size
    others = [[rng.randrange(7, vocab) for _ in range(n)] for n in (3, 17, 60, 1, 33)]
    futures: list[Future[GenerationResult]] = []
    for i, other in enumerate(others):  # all queued before the first step: they share steps
        if i == 3:
            mine = fam.engine.submit(fam.prompt, SEEDED)
        futures.append(fam.engine.submit(other, SamplingParams(max_tokens=rng.randrange(4, 24),
                                                               ignore_eos=True)))
    loaded = mine.result(timeout=300)
    for f in futures:
        f.result(timeout=300)
    assert loaded.token_ids == alone.token_ids
    assert loaded.step_digests == alone.step_digests


def test_replay_reproduces_every_step(fam: Family) -> None:
    res = fam.engine.generate(fam.prompt, SEEDED)
    rep = fam.engine.replay(fam.prompt, res.token_ids, SEEDED)
    assert rep.matches and rep.first_mismatch is None
    assert rep.policy_ids == res.token_ids
    assert rep.step_digests == res.step_digests
    forged = list(res.token_ids)
    forged[7] = (forged[7] + 1) % fam.loaded.config.vocab_size
    assert fam.engine.replay(fam.prompt, forged, SEEDED).first_mismatch == 7


# ---- refusals ----------------------------------------------------------------------------
def _fields(arch: str = "llama", **extra: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"general.architecture": arch}
    for key, value in {"embedding_length": 64, "attention.head_count": 4, "block_count": 2,
                       "feed_forward_length": 128, "context_length": 512,
                       "attention.layer_norm_rms_epsilon": 1e-6}.items():
        f[f"{arch}.{key}"] = value
    f.update({k.format(arch=arch): v for k, v in extra.items()})
    return f


def test_gguf_rope_scaling_types() -> None:
    assert config_from_gguf(_fields(), 10).rope_scaling is None
    linear = _fields(**{"{arch}.rope.scaling.type": "linear", "{arch}.rope.scaling.factor": 4.0})
    assert config_from_gguf(linear, 10).rope_scaling == RopeScaling("linear", 4.0)
    legacy = _fields(**{"{arch}.rope.scale_linear": 2.0})
    assert config_from_gguf(legacy, 10).rope_scaling == RopeScaling("linear", 2.0)
    for kind in ("yarn", "longrope", "su"):
        with pytest.raises(ModelLoadError, match=f"rope scaling type '{kind}'"):
            config_from_gguf(_fields(**{"{arch}.rope.scaling.type": kind,
                                        "{arch}.rope.scaling.factor": 4.0}), 10)
    with pytest.raises(ModelLoadError, match="positive"):
        config_from_gguf(_fields(**{"{arch}.rope.scaling.type": "linear"}), 10)


def test_linear_rope_scaling_divides_every_frequency() -> None:
    from verinfer.engine.models.common import rope_divisors

    plain = RopeTable(16, 10_000.0)
    scaled = RopeTable(16, 10_000.0, rope_divisors(RopeScaling("linear", 4.0), 16, 10_000.0))
    # position 4p under 4x linear scaling is position p unscaled
    cos_s, sin_s = scaled.get(torch.tensor([40, 400]))
    cos_p, sin_p = plain.get(torch.tensor([10, 100]))
    assert torch.allclose(cos_s, cos_p, atol=1e-6) and torch.allclose(sin_s, sin_p, atol=1e-6)


def test_phi3_long_context_variants_are_refused(tmp_path: Path) -> None:
    longrope = _fields("phi3", **{"phi3.rope.scaling.original_context_length": 256})
    with pytest.raises(ModelLoadError, match="longrope"):
        config_from_gguf(longrope, 10)
    with pytest.raises(ModelLoadError, match="longrope"):
        config_from_gguf(_fields("phi3", **{"phi3.rope.scaling.attn_factor": 1.19}), 10)
    spec = family_spec("phi3")
    factors = np.ones(spec.head_dim // 2, dtype=np.float32)
    path = write_family_gguf(tmp_path / "phi3-128k.gguf", spec, random_state(spec),
                             extra_tensors={"rope_factors_long.weight": factors,
                                            "rope_factors_short.weight": factors})
    lm = load_model(path)
    with pytest.raises(ModelLoadError, match="rope_factors_long"):
        Engine(lm, "invariant")


def test_unknown_architecture_is_refused(tmp_path: Path) -> None:
    spec = family_spec("llama")
    path = write_family_gguf(tmp_path / "falcon.gguf", spec, random_state(spec), arch="falcon")
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'falcon'.*qwen3"):
        load_model(path)


def test_partial_rotary_and_unequal_value_heads_are_refused() -> None:
    with pytest.raises(ModelLoadError, match="partial rotary"):
        config_from_gguf(_fields("qwen3", **{"{arch}.rope.dimension_count": 8}), 10)
    with pytest.raises(ModelLoadError, match="value heads"):
        config_from_gguf(_fields("qwen3", **{"{arch}.attention.value_length": 8}), 10)


def test_gguf_metadata_reaches_the_config_from_a_real_file(tmp_path: Path) -> None:
    spec = family_spec("llama")
    meta = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    path = write_family_gguf(tmp_path / "yarn.gguf", spec, random_state(spec),
                             extra_metadata=meta)
    assert read_gguf(path, tensors=False).fields["llama.rope.scaling.type"] == "yarn"
    with pytest.raises(ModelLoadError, match="'yarn'"):
        load_model(path)


@pytest.mark.parametrize("patch, match", [
    ({"model_type": "gpt_neox"}, "unsupported model_type 'gpt_neox'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "'yarn'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                          "partial_rotary_factor": 0.75}}, "partial rotary"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_hf_configs_the_engine_cannot_run_are_refused(patch: dict[str, Any], match: str) -> None:
    cfg = hf_config(family_spec("qwen3")).to_dict()
    cfg.update(patch)
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf(cfg)


def test_gemma3_27b_attention_scale_follows_llama_cpp() -> None:
    """GGUF has no query_pre_attn_scalar: llama.cpp uses dim / heads for the 62-layer 27B
    (HF config: 168 = 5376 / 32) and the head size (128) for the other sizes."""
    f = _fields("gemma3", **{"{arch}.embedding_length": 5376, "{arch}.attention.head_count": 32,
                             "{arch}.attention.key_length": 128, "{arch}.block_count": 62})
    assert config_from_gguf(f, 10).attn_scale == 168.0 ** -0.5
    f["gemma3.block_count"] = 34
    assert config_from_gguf(f, 10).attn_scale == 128.0 ** -0.5


def test_gemma3_hf_config_of_transformers_4_is_read() -> None:
    """config.json files on the Hub (transformers 4): rope_scaling + rope_local_base_freq."""
    cfg = hf_config(family_spec("gemma3")).to_dict()
    del cfg["rope_parameters"]
    cfg.update(rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_theta=1e6,
               rope_local_base_freq=10_000.0)
    c = config_from_hf(cfg)
    assert (c.rope_scaling, c.rope_theta, c.rope_local_theta) == (
        RopeScaling("linear", 8.0), 1e6, 10_000.0)


@pytest.mark.parametrize("family, drop, swap, match", [
    ("qwen2", "model.layers.1.self_attn.k_proj.bias", None, r"blk\.1\.attn_k\.bias"),
    ("qwen3", "model.layers.0.self_attn.q_norm.weight", None, r"blk\.0\.attn_q_norm"),
    ("phi3", None, ("model.layers.0.mlp.gate_up_proj.weight", (128, 64)), r"ffn_up"),
    ("phi3", None, ("model.layers.1.self_attn.qkv_proj.weight", (128, 64)), r"attn_qkv"),
])
def test_a_file_whose_tensors_contradict_its_architecture_is_refused(
        tmp_path: Path, family: str, drop: str | None, swap: tuple[str, tuple[int, int]] | None,
        match: str) -> None:
    """A file that says qwen2 but lacks a bias (or phi3 with an unfused ffn_up) is refused with
    the tensor's name — never run as plain Llama, which would be another model under its id."""
    spec = family_spec(family)
    state = random_state(spec)
    if drop:
        del state[drop]
    if swap:
        state[swap[0]] = torch.zeros(swap[1])
    path = write_family_gguf(tmp_path / f"{family}.gguf", spec, state)
    with pytest.raises(ModelLoadError, match=match):
        Engine(load_model(path), "invariant")


@pytest.mark.parametrize("family, qtype", [("qwen2", "Q8_0"), ("phi3", "Q5_0"),
                                           ("llama3", "Q4_1")])
def test_quantized_family_matches_hf_and_replays(tmp_path: Path, family: str, qtype: str
                                                 ) -> None:
    """The families on matrices kept as GGUF blocks (the quantized kernels, incl. Phi-3's
    fused matrices split after the product): HF holds the blocks' values; same checks."""
    spec = family_spec(family)
    state = random_state(spec)
    path = write_family_gguf(tmp_path / f"{family}-{qtype}.gguf", spec, state,
                             matrix_type=qtype)
    lm = load_model(path)
    assert any(t == qtype for t, _ in lm.weights.blocks.values())
    hf = hf_model(spec, quant_round_trip(state, qtype))
    prompt = [random.Random(3).randrange(7, lm.config.vocab_size) for _ in range(PROMPT_LEN)]
    diff = _max_diff(_logits(lm, prompt), hf_logits(hf, prompt))
    assert diff <= TOL, f"{family} {qtype}: max |Δlogit| = {diff}"
    engine = Engine(lm, "invariant")
    try:
        res = engine.generate(prompt, SEEDED)
        rep = engine.replay(prompt, res.token_ids, SEEDED)
        assert rep.matches and rep.step_digests == res.step_digests
        assert engine.generate(prompt, GREEDY).token_ids == hf_greedy(hf, prompt, 16)
    finally:
        engine.close()
