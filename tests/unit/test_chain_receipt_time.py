"""The chain's issuedAt rule in verinfer.chain.structs (ChallengeManager.MAX_ISSUED_AT_SKEW_S)."""

from __future__ import annotations

from verinfer.chain.structs import is_future_dated, publication_deadline
from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S


def test_future_dated_beyond_skew_only() -> None:
    now = 1_767_225_600
    assert not is_future_dated(now, now)
    assert not is_future_dated(now + MAX_ISSUED_AT_SKEW_S, now)
    assert is_future_dated(now + MAX_ISSUED_AT_SKEW_S + 1, now)
    assert is_future_dated(2**64 - 1, now)


def test_publication_deadline_does_not_wrap() -> None:
    assert publication_deadline(2**64 - 1, 600) == 2**64 - 1 + 600
