"""operator.json's ``stream`` section (issue 37: serving replicas and a batch committer) is
checked once, when the file is loaded: a misspelt key, a lease that a renewal's call deadline
could outlast, an out-of-range budget are each an OperatorConfigError naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from verinfer.operator.config import OperatorConfig, OperatorConfigError, write_config

BASE: dict[str, Any] = {
    "keystore": "k.json", "chain_id": 31337,
    "challenge_manager": "0x0000000000000000000000000000000000000000",
    "epochs_file": "epochs.json", "key_epoch": 1, "outbox": "outbox.sqlite",
    "da": {"backend": "local", "local_store": "da"}, "batch": {},
    "sink": {"kind": "jsonl", "path": "batches.jsonl"}}


def _load(tmp_path: Path, stream: dict[str, Any]) -> OperatorConfig:
    write_config(tmp_path, {**BASE, "stream": stream})
    return OperatorConfig.load(tmp_path)


def test_a_stream_section_loads_with_its_defaults(tmp_path: Path) -> None:
    cfg = _load(tmp_path, {"redis_url": "redis://redis:6379/0"})
    assert cfg.stream is not None
    assert (cfg.stream.lease_ttl_s, cfg.stream.call_deadline_s, cfg.stream.max_backlog,
            cfg.stream.local_copy) == (10.0, 2.0, 100_000, False)


@pytest.mark.parametrize(("stream", "names"), [
    ({"redis_url": "r", "lease_ttl_s": 5, "call_deadline_s": 2}, "lease_ttl_s (5) must exceed"),
    ({"redis_url": "r", "max_backlog": 0}, "stream.max_backlog"),
    ({"redis_url": "r", "lease_tll_s": 30}, "stream.lease_tll_s"),
    ({}, "stream.redis_url"),
])
def test_a_bad_stream_section_is_refused_naming_the_key(tmp_path: Path, stream: dict[str, Any],
                                                        names: str) -> None:
    with pytest.raises(OperatorConfigError) as e:
        _load(tmp_path, stream)
    assert names in e.value.message
