"""The self-test and the verifier's mismatch report name the same first differing step."""

from __future__ import annotations

import pytest

from verinfer.engine.divergence import first_divergence


@pytest.mark.parametrize(
    ("a", "b", "first"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([], [], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2], [1, 2, 3], 2),  # one stopped early: it parts at the shorter's end
        ([1, 2, 3], [1], 1),
        ([], [5], 0),
        ([7, 2], [1, 2], 0),
    ],
)
def test_first_divergence(a: list[int], b: list[int], first: int | None) -> None:
    assert first_divergence(a, b) == first
    assert first_divergence(b, a) == first
