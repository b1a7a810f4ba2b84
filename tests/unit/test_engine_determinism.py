"""The engine's contract: same bytes alone or under load; replay reproduces every decode logit.

Each check runs on the invariant kernels and, as a negative control, on the plain-PyTorch
kernels, where the same check must find a difference (so the check has teeth).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import Future

import pytest
import torch

from verinfer.engine.engine import Engine, GenerationResult
from verinfer.protocol.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=12, temperature=0.8, seed=1234, ignore_eos=True)


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _under_load(engine: Engine, prompt: Sequence[int], params: SamplingParams, copies: int,
                seed: int = 7) -> tuple[list[GenerationResult], int]:
    """Submit `copies` identical requests interleaved with random others of other lengths."""
    rng = random.Random(seed)
    vocab = engine.config.vocab_size
    mine: list[Future[GenerationResult]] = []
    others: list[Future[GenerationResult]] = []
    for _ in range(copies):
        for _ in range(rng.randrange(0, 3)):
            other = SamplingParams(max_tokens=rng.randrange(1, 20), ignore_eos=True,
                                   temperature=rng.choice([0.0, 0.7]), seed=rng.randrange(99))
            others.append(engine.submit(_prompt(rng, rng.randrange(1, 90), vocab), other))
        mine.append(engine.submit(prompt, params))
    results = [f.result(timeout=300) for f in mine]
    for f in others:
        f.result(timeout=300)
    return results, len(others)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_identical_requests_under_load_give_one_output(tiny_engine: Engine,
                                                       params: SamplingParams) -> None:
    prompt = _prompt(random.Random(1), 37, tiny_engine.config.vocab_size)
    alone = tiny_engine.generate(prompt, params)
    results, n_others = _under_load(tiny_engine, prompt, params, copies=200)
    assert n_others > 100
    assert {tuple(r.token_ids) for r in results} == {tuple(alone.token_ids)}
    assert {r.logit_digest for r in results} == {alone.logit_digest}
    assert {tuple(r.step_digests) for r in results} == {tuple(alone.step_digests)}


def test_fast_kernels_fail_the_load_check(tiny_engine_fast: Engine) -> None:
    """Negative control: plain PyTorch kernels change logit bits with batch composition."""
    prompt = _prompt(random.Random(1), 37, tiny_engine_fast.config.vocab_size)
    alone = tiny_engine_fast.generate(prompt, GREEDY)
    results, _ = _under_load(tiny_engine_fast, prompt, GREEDY, copies=60)
    digests = {r.logit_digest for r in results} | {alone.logit_digest}
    assert len(digests) > 1, "fast kernels were batch invariant: the check has no teeth"


LENGTHS = list(range(1, 601))


def _decode_all(engine: Engine, lengths: Sequence[int], params: SamplingParams
                ) -> list[tuple[list[int], GenerationResult]]:
    rng = random.Random(3)
    prompts = [_prompt(rng, n, engine.config.vocab_size) for n in lengths]
    futs = [engine.submit(p, params) for p in prompts]
    return [(p, f.result(timeout=600)) for p, f in zip(prompts, futs, strict=True)]


def test_replay_equals_decode_for_prompts_of_1_to_600_tokens(tiny_engine: Engine) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.9, seed=5, ignore_eos=True)
    for prompt, res in _decode_all(tiny_engine, LENGTHS, params):
        rep = tiny_engine.replay(prompt, res.token_ids, params)
        assert rep.matches, f"prompt of {len(prompt)} tokens: mismatch at {rep.first_mismatch}"
        assert rep.policy_ids == res.token_ids
        assert rep.step_digests == res.step_digests, f"prompt of {len(prompt)} tokens"


def test_fast_kernels_fail_the_replay_check(tiny_engine_fast: Engine) -> None:
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    differing = 0
    for prompt, res in _decode_all(tiny_engine_fast, range(1, 200, 7), params):
        rep = tiny_engine_fast.replay(prompt, res.token_ids, params)
        differing += rep.step_digests != res.step_digests[: len(rep.step_digests)]
    assert differing > 0, "fast kernels replayed bit-exactly: the check has no teeth"


def test_replay_detects_a_tampered_output(tiny_engine: Engine) -> None:
    prompt = _prompt(random.Random(9), 20, tiny_engine.config.vocab_size)
    res = tiny_engine.generate(prompt, GREEDY)
    forged = list(res.token_ids)
    forged[5] = (forged[5] + 1) % tiny_engine.config.vocab_size
    rep = tiny_engine.replay(prompt, forged, GREEDY)
    assert not rep.matches and rep.first_mismatch == 5
    assert rep.policy_ids[:6] == res.token_ids[:6]
    short = tiny_engine.replay(prompt, res.token_ids[:-2], GREEDY)
    assert not short.matches and short.first_mismatch == len(res.token_ids) - 2


def test_thread_count_does_not_change_bits(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    digests = []
    prompt = _prompt(random.Random(4), 300, tiny_loaded.config.vocab_size)
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            eng = Engine(tiny_loaded, "invariant")
            try:
                res = eng.generate(prompt, SEEDED)
                rep = eng.replay(prompt, res.token_ids, SEEDED)
            finally:
                eng.close()
            digests.append((res.logit_digest, rep.logit_digest, tuple(res.token_ids)))
    finally:
        torch.set_num_threads(before)
    assert digests[0] == digests[1]
    assert digests[0][0] == digests[0][1]


def test_prefill_chunking_does_not_change_bits(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(random.Random(6), 250, tiny_loaded.config.vocab_size)
    out = set()
    for chunk in (1, 7, 64, 512):
        eng = Engine(tiny_loaded, "invariant", max_batch_tokens=chunk)
        try:
            out.add(eng.generate(prompt, SEEDED).logit_digest)
        finally:
            eng.close()
    assert len(out) == 1
