from __future__ import annotations

import numpy as np
import pytest

from verinfer.engine.sampling import SamplingParams, derive_seed, sample, uniform
from verinfer.errors import InvalidRequestError


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


def test_nucleus_matches_a_full_sort_reference() -> None:
    from verinfer.engine.sampling import _nucleus

    rng = np.random.default_rng(5)
    for trial in range(30):
        n = int(rng.integers(2, 5000))
        z = rng.standard_normal(n) * rng.uniform(0.1, 8)
        if trial % 5 == 0:
            z = np.round(z, 1)  # many ties
        p = np.exp(z - z.max())
        top_p = float(rng.uniform(0.05, 0.999))
        order = np.argsort(-p, kind="stable")
        csum = np.cumsum(p[order])
        n_keep = min(int(np.searchsorted(csum, top_p * float(np.sum(p)), side="left")) + 1, n)
        assert np.array_equal(_nucleus(p, top_p), np.sort(order[:n_keep]))
