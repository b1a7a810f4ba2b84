"""A malicious KMS shard drips its signed log head one byte at a time.

``fetch_head`` bounded the answer's size (16 KiB) but not its time: httpx's timeout is per
read, so a shard that sends a byte every 0.05 s (or every 4.9 s: a day for 16 KiB) held the
head publisher, and with it the publication of every honest shard's head — the record that
makes a shard's release log tamper-evident. Who gains: a shard host that wants a window in
which it can rewrite its log unnoticed. Fix: a whole-answer deadline (``HEAD_DEADLINE_S``);
the dripping shard is reported failed, the others are published.
"""

from __future__ import annotations

import httpx
import pytest

from support.drip import dripping_server, outcome_within
from verinfer.kms import log_publish
from verinfer.kms.directory import ShardInfo
from verinfer.kms.log_publish import ShardHeadError, fetch_head


def test_a_dripping_shard_is_failed_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_publish, "HEAD_DEADLINE_S", 1.0, raising=False)

    def fetch(url: str) -> None:
        with httpx.Client(timeout=2.0) as client:
            fetch_head(client, ShardInfo(0, url, "0x" + "11" * 20))

    with dripping_server() as url:
        err, took = outcome_within(lambda: fetch(url))
    assert isinstance(err, ShardHeadError) and "within" in str(err), err
    assert took < 5
