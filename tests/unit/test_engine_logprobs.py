"""Logprob rule vi-logprob-v1 (engine/logprobs.py): the values are a pure function of the
logits' bits — the same alone, under a batch, in replay, on every kernel ISA path, and equal to
the plain-Python definition — so an ExecResult can commit them and a verifier reproduce them."""

from __future__ import annotations

import math
import random
import struct
from concurrent.futures import Future

import numpy as np
import pytest

from verinfer.engine import kernels
from verinfer.engine.engine import Engine, GenerationResult
from verinfer.engine.logprobs import log64, reference_logprob, row_logprobs, token_logprob
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.receipts.canonical import ExecResult

SEEDED = SamplingParams(max_tokens=10, temperature=0.8, seed=99, ignore_eos=True)


def _bits(x: float) -> int:
    return int.from_bytes(struct.pack(">d", x), "big")


def test_log64_is_within_a_few_ulps_and_exact_at_one() -> None:
    rng = random.Random(3)
    worst = 0.0
    for _ in range(20_000):
        x = 1.0 + rng.random() * rng.choice([1e-12, 1.0, 1e3, 3e5, 1e300])
        worst = max(worst, abs(log64(x) - math.log(x)) / math.ulp(math.log(x)))
    assert worst <= 4
    assert log64(1.0) == 0.0
    for bad in (0.5, float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError):
            log64(bad)


def test_kernel_path_equals_the_python_definition_with_ties() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 3000)) * 6).astype(np.float32)
    x[0, [9, 4, 700]] = x[0].max() + 2  # a three-way tie for first: lower ids first
    x[1, :] = 0.25  # everything tied
    x[2, 17] = -1e30  # exp64 underflows to 0 below -700
    toks = [4, 2999, 17, 0]
    got = row_logprobs(x, toks, 5)
    for r in range(4):
        want = reference_logprob(x[r], toks[r], 5)
        assert got[r] == want
        assert [_bits(v) for _, v in got[r].top] == [_bits(v) for _, v in want.top]
    assert [i for i, _ in got[0].top[:3]] == [4, 9, 700]
    assert [i for i, _ in got[1].top] == [0, 1, 2, 3, 4]
    assert got[2].logprob < -1e29  # finite, not -inf
    # a row's values do not depend on the other rows it was computed with
    assert row_logprobs(x[1:3], toks[1:3], 5) == got[1:3]
    assert token_logprob(x[3], 0, 5) == got[3]


@pytest.mark.skipif(not kernels.available(), reason="kernels not built")
def test_every_isa_path_gives_the_same_bits() -> None:
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((3, 5001)) * 4).astype(np.float32)
    runs = []
    for isa in kernels.supported_isas():
        with kernels.forced_isa(isa):
            runs.append(row_logprobs(x, [1, 2, 3], 20))
    assert all(r == runs[0] for r in runs)


def test_decode_alone_under_load_and_replay_commit_the_same_bytes(tiny_engine: Engine) -> None:
    rng = random.Random(11)
    vocab = tiny_engine.config.vocab_size
    prompt = [rng.randrange(3, vocab) for _ in range(29)]
    alone = tiny_engine.generate(prompt, SEEDED, top_logprobs=4)
    mine: list[Future[GenerationResult]] = []
    others: list[Future[GenerationResult]] = []
    for _ in range(12):  # interleave with other requests of other lengths and logprob asks
        for _ in range(rng.randrange(1, 3)):
            others.append(tiny_engine.submit(
                [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 70))],
                SamplingParams(max_tokens=rng.randrange(1, 15), ignore_eos=True,
                               temperature=rng.choice([0.0, 0.7]), seed=rng.randrange(99)),
                top_logprobs=rng.choice([None, 0, 20])))
        mine.append(tiny_engine.submit(prompt, SEEDED, top_logprobs=4))
    loaded = [f.result(timeout=300) for f in mine]
    for f in others:
        f.result(timeout=300)
    want = ExecResult.from_generation(alone)
    assert {ExecResult.from_generation(r).canonical for r in loaded} == {want.canonical}
    rr = tiny_engine.replay(prompt, alone.token_ids, SEEDED, top_logprobs=4)
    assert rr.matches and rr.logprobs == alone.logprobs
    assert alone.logprobs is not None and len(alone.logprobs) == 10
    # and what each streamed step event carried is the same object the result commits
    events: list[float] = []
    fut = tiny_engine.submit(prompt, SEEDED, top_logprobs=4,
                             on_step=lambda ev: events.append(ev.logprob.logprob)
                             if ev.logprob is not None else None)
    res = fut.result(timeout=300)
    assert [_bits(v) for v in events] == [_bits(lp.logprob) for lp in res.logprobs or ()]


def test_replay_gives_no_logprobs_for_a_wrong_claim(tiny_engine: Engine) -> None:
    prompt = [5, 6, 7, 8]
    gen = tiny_engine.generate(prompt, SEEDED)
    wrong = [*gen.token_ids[:-1], (gen.token_ids[-1] + 1) % tiny_engine.config.vocab_size]
    rr = tiny_engine.replay(prompt, wrong, SEEDED, top_logprobs=2)
    assert not rr.matches and rr.logprobs is None
    with pytest.raises(Exception, match="top_logprobs"):
        tiny_engine.replay(prompt, gen.token_ids, SEEDED, top_logprobs=21)
