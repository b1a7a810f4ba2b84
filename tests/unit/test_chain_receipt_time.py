"""The chain's issuedAt rule in verinfer.chain.structs (ChallengeManager.MAX_CLOCK_SKEW)."""

from __future__ import annotations

from verinfer.chain.structs import MAX_CLOCK_SKEW, is_future_dated, publication_deadline


def test_future_dated_beyond_skew_only() -> None:
    now = 1_767_225_600
    assert not is_future_dated(now, now)
    assert not is_future_dated(now + MAX_CLOCK_SKEW, now)
    assert is_future_dated(now + MAX_CLOCK_SKEW + 1, now)
    assert is_future_dated(2**64 - 1, now)


def test_publication_deadline_does_not_wrap() -> None:
    assert publication_deadline(2**64 - 1, 600) == 2**64 - 1 + 600
