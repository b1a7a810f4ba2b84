from __future__ import annotations

import numpy as np
import pytest

from verinfer.engine.sampling import exp64_reference, sample, sample_reference, sample_rows, uniform
from verinfer.errors import InvalidRequestError, KernelError
from verinfer.protocol.request_rule import derive_seed
from verinfer.protocol.sampling_params import SamplingParams


def _logits(seed: int = 0, n: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


def test_uniform_is_a_pure_function_of_seed_and_position() -> None:
    assert uniform(1, 5) == uniform(1, 5)
    assert uniform(1, 5) != uniform(1, 6) != uniform(2, 5)
    draws = [uniform(42, p) for p in range(20000)]
    assert min(draws) >= 0.0 and max(draws) < 1.0
    assert abs(float(np.mean(draws)) - 0.5) < 0.01


def test_greedy_picks_first_maximum() -> None:
    x = np.array([0.0, 3.0, 3.0, 1.0], dtype=np.float32)
    assert sample(x, SamplingParams(), position=0) == 1


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    x = _logits()
    p = SamplingParams(temperature=0.8, seed=7)
    picks = [sample(x, p, position=i) for i in range(200)]
    assert picks == [sample(x, p, position=i) for i in range(200)]
    other = [sample(x, SamplingParams(temperature=0.8, seed=8), position=i) for i in range(200)]
    assert picks != other


def test_top_k_restricts_to_the_k_best() -> None:
    x = _logits()
    best = set(np.argsort(-x)[:5].tolist())
    p = SamplingParams(temperature=1.5, top_k=5, seed=3)
    assert {sample(x, p, position=i) for i in range(300)} <= best


def test_top_p_keeps_the_nucleus() -> None:
    x = np.array([5.0, 4.0, 0.0, -1.0, -2.0], dtype=np.float32)
    probs = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert probs[0] < 0.9 < probs[0] + probs[1]
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=11)
    assert {sample(x, p, position=i) for i in range(500)} == {0, 1}


def test_sampling_follows_the_distribution() -> None:
    x = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    p = SamplingParams(temperature=1.0, seed=1)
    counts = np.bincount([sample(x, p, position=i) for i in range(6000)], minlength=3) / 6000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03)


@pytest.mark.parametrize("kw", [
    {"max_tokens": 0}, {"max_tokens": -3}, {"temperature": -0.1}, {"temperature": 2.5},
    {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"seed": -1}, {"stop": ("",)},
])
def test_bad_parameters_raise_typed_errors(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kw).validate()  # type: ignore[arg-type]


def test_derived_seed_depends_on_the_request_hash() -> None:
    assert derive_seed(b"a" * 32) == derive_seed(b"a" * 32) != derive_seed(b"b" * 32)


def test_exp64_kernel_gives_the_reference_bits_and_is_accurate() -> None:
    import torch

    from verinfer.engine import kernels

    rng = np.random.default_rng(3)
    x = np.concatenate([-rng.exponential(40.0, 200_000), -rng.uniform(0, 1e-3, 1000),
                        [0.0, -0.0, -1e-300, -700.0, -np.nextafter(700.0, 800.0), -745.0, -1e6]])
    got = kernels.exp64(torch.from_numpy(x)).numpy()
    want = exp64_reference(x)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))  # bit for bit
    live = x >= -700.0
    assert np.all(got[~live] == 0.0)
    rel = np.abs(got[live] - np.exp(x[live])) / np.exp(x[live])
    assert rel.max() < 4e-16  # about one ulp


@pytest.mark.parametrize("vocab", [3, 1000, 262_144])
def test_kernel_sampler_matches_the_reference_rule(vocab: int) -> None:
    """The C sampler and the numpy definition of vi-sample-v2 pick the same token, across
    temperatures, top-k, top-p, ties and peaked or flat rows."""
    rng = np.random.default_rng(vocab)
    trials = 12 if vocab > 100_000 else 60
    for trial in range(trials):
        x = (rng.standard_normal(vocab) * rng.uniform(0.2, 12)).astype(np.float32)
        if trial % 4 == 0:  # ties at the top and in the tail
            x[rng.integers(0, vocab, max(2, vocab // 50))] = x.max()
            x = np.round(x, 1)
        params = SamplingParams(
            temperature=float(rng.choice([0.05, 0.6, 1.0, 2.0])),
            top_k=int(rng.choice([0, 0, 1, 2, 40, vocab, vocab + 5])),
            top_p=float(rng.choice([1.0, 1.0, 0.95, 0.5, 1e-3])),
            seed=int(rng.integers(0, 2**63)))
        pos = int(rng.integers(0, 10_000))
        assert sample(x, params, pos) == sample_reference(x, params, pos), (trial, params)


def test_sample_rows_draws_each_row_as_alone() -> None:
    import torch

    rows = np.stack([_logits(seed) for seed in range(9)])
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=4)
    together = sample_rows(torch.from_numpy(rows), params, range(100, 109))
    assert together == [sample(rows[i], params, 100 + i) for i in range(9)]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_raise_instead_of_drawing(bad: float) -> None:
    x = _logits()
    x[17] = bad
    with pytest.raises(KernelError, match="NaN or an infinity"):
        sample(x, SamplingParams(temperature=1.0, seed=1), 0)


@pytest.mark.parametrize("where", [2, 1002])  # in the 4-wide loop, in the scalar tail
def test_finite_logits_that_overflow_at_the_temperature_raise(where: int) -> None:
    # the request rule refuses temperatures in (0, 1e-6); below the rule, the kernel must still
    # refuse what the reference refuses (z = logit / temperature not finite) and never draw
    import torch

    from verinfer.engine import kernels

    x = _logits(n=1003)
    x[where] = 3e38
    with pytest.raises(KernelError, match="NaN or an infinity"):
        kernels.sample_rows(torch.from_numpy(x[None, :]), 1e-300, 0, 1.0,
                            torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN or an infinity"):
        _reference_at(x, 1e-300)


def _reference_at(x: np.ndarray, temperature: float) -> int:
    # below the rule's floor on purpose (SamplingParams.validate is not called)
    return sample_reference(x, SamplingParams(temperature=temperature, seed=1), 0)
