"""Where two runs of the same request part ways: the one rule the engine's self-test and the
verifier's mismatch report share, so both name the same step for the same pair of outputs."""

from __future__ import annotations

from collections.abc import Sequence


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index at which the token sequences ``a`` and ``b`` differ — where one ends
    early, the length of the shorter — or None when they are equal."""
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return first
