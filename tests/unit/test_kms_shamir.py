from __future__ import annotations

import itertools
import random
import secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verinfer.kms.errors import InvalidShareError, NotEnoughSharesError, ShareVerificationError
from verinfer.kms.shamir import (
    Q,
    Share,
    public_key_of,
    random_scalar,
    reconstruct,
    split,
    verify_share,
)


def test_any_t_of_n_rebuild_the_secret() -> None:
    s = random_scalar(secrets.randbelow)
    shares, commitments = split(s, 3, 5, secrets.randbelow)
    assert commitments[0] == public_key_of(s)
    for sh in shares:
        verify_share(sh, commitments)
    for subset in itertools.permutations(shares, 3):
        assert reconstruct(list(subset), 3) == s


def test_t_minus_one_shares_do_not_rebuild_and_fit_every_secret() -> None:
    s = random_scalar(secrets.randbelow)
    shares, commitments = split(s, 3, 5, secrets.randbelow)
    with pytest.raises(NotEnoughSharesError):
        reconstruct(shares[:2], 3)
    # Interpolating t-1 shares as if they were enough gives a value that fails the C_0 check.
    guess = reconstruct(shares[:2], 2)
    assert public_key_of(guess) != commitments[0]
    # Perfect secrecy: for ANY candidate secret there is a degree-(t-1) polynomial through it
    # and the two known shares, so the shares alone single out nothing.
    for candidate in (1, 12345, Q - 1, s):
        assert reconstruct([*shares[:2], _through(candidate, shares[:2])], 3) == candidate


def _through(secret: int, known: list[Share]) -> Share:
    """The share at x=5 of the unique quadratic through (0, secret) and the known shares."""
    pts = [(0, secret)] + [(k.index, k.value) for k in known]
    x = 5
    val = 0
    for xi, yi in pts:
        num, den = 1, 1
        for xj, _ in pts:
            if xj != xi:
                num = num * (x - xj) % Q
                den = den * (xi - xj) % Q
        val = (val + yi * num * pow(den, -1, Q)) % Q
    return Share(x, val)


def test_corrupted_share_is_named() -> None:
    s = random_scalar(secrets.randbelow)
    shares, commitments = split(s, 3, 5, secrets.randbelow)
    bad = Share(4, (shares[3].value + 1) % Q)
    with pytest.raises(ShareVerificationError) as ei:
        verify_share(bad, commitments)
    assert ei.value.shard_index == 4
    assert "shard 4" in ei.value.message
    # a correct value presented under another index is just as wrong
    with pytest.raises(ShareVerificationError):
        verify_share(Share(2, shares[3].value), commitments)


def test_bad_parameters_raise_typed_errors() -> None:
    with pytest.raises(InvalidShareError):
        split(5, 4, 3, secrets.randbelow)
    with pytest.raises(InvalidShareError):
        split(0, 2, 3, secrets.randbelow)
    with pytest.raises(InvalidShareError):
        Share(0, 1)
    with pytest.raises(InvalidShareError):
        Share(1, Q)
    s = random_scalar(secrets.randbelow)
    shares, commitments = split(s, 2, 3, secrets.randbelow)
    with pytest.raises(InvalidShareError):
        reconstruct([shares[0], shares[0]], 2)
    with pytest.raises(InvalidShareError):
        verify_share(shares[0], [b"\x02" + b"\x00" * 32, commitments[1]])
    assert "redacted" in repr(shares[0]) and str(shares[0].value) not in repr(shares[0])


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 6), extra=st.integers(0, 4), seed=st.integers(0, 2**32))
def test_random_subsets_of_size_t_rebuild(t: int, extra: int, seed: int) -> None:
    rng = random.Random(seed)
    n = t + extra
    s = 1 + rng.randrange(Q - 1)
    shares, commitments = split(s, t, n, rng.randrange)
    subset = rng.sample(shares, t)
    for sh in subset:
        verify_share(sh, commitments)
    assert reconstruct(subset, t) == s
