"""StreamHasher: the running hash over streamed content equals ExecResult.text_sha256."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.streaming import StreamHasher


@settings(max_examples=50, deadline=None)
@given(st.text(), st.lists(st.integers(0, 400), max_size=6))
def test_any_chunking_gives_the_text_hash(text: str, cuts: list[int]) -> None:
    data = text.encode()
    points = sorted({min(c, len(data)) for c in cuts})
    h = StreamHasher()
    prev = 0
    for p in [*points, len(data)]:
        h.update(data[prev:p])  # may split a multi-byte character: bytes, not characters
        prev = p
    assert h.digest() == hashlib.sha256(data).digest() and h.n_bytes == len(data)
    result = ExecResult(output_token_ids=(), finish_reason="stop", logit_digest=bytes(32),
                        text_sha256=h.digest())
    assert result.matches_text(text)
    assert not result.matches_text(text + "x")


def test_digest_is_non_final_and_accepts_str() -> None:
    h = StreamHasher()
    h.update("héllo ")
    first = h.digest()
    assert h.digest() == first  # reading does not finalize
    h.update(b"world")
    assert h.hexdigest() == "0x" + hashlib.sha256("héllo world".encode()).hexdigest()
    with pytest.raises(TypeError):
        h.update(3)  # type: ignore[arg-type]
