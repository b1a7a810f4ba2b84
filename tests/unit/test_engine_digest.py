"""Logit digests: a fixed, documented format that commits to every bit of every row."""

from __future__ import annotations

import pytest
import torch

from verinfer.engine.digest import roll_up, step_digests
from verinfer.protocol.hexutil import to_hex

# Known answers for docs/engine.md's format (BLAKE3 derive-key over raw little-endian fp32).
X = torch.arange(12, dtype=torch.float32).reshape(2, 6) / 7
KAT_STEPS = ["0d94512c7cbf448e97d14ddf330475065c0c8de770dbe8018d9e0c4f2471005d",
             "23e1ec6330ccc39b4006e5f7c1381999f15f31a3eee55c552fc2d0571ffbd964"]
KAT_ROLLUP = "0x0dd78c076672656ee3385154bf72a57a135b6ba3a1b55941fd1fed001f0d655b"


def test_known_answers() -> None:
    d = step_digests(X)
    assert [h.hex() for h in d] == KAT_STEPS
    assert to_hex(roll_up(d)) == KAT_ROLLUP


def test_every_bit_and_row_counts() -> None:
    base = step_digests(X)
    assert step_digests(X[1:]) == base[1:]  # a row's digest depends on that row only
    raw = X.clone().view(torch.int32)
    for bit in (0, 13, 31):
        flipped = raw.clone()
        flipped[1, 4] ^= 1 << bit
        d = step_digests(flipped.view(torch.float32))
        assert d[0] == base[0] and d[1] != base[1]
    assert roll_up(base) != roll_up(base[::-1])


def test_rejects_other_dtypes() -> None:
    with pytest.raises(ValueError):
        step_digests(X.double())
