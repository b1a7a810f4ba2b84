"""operator.json is checked once, at load, into typed sections: every missing, misspelt or
out-of-range key is an OperatorConfigError that names it; readers never index a dict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verinfer.operator.config import (
    CONFIG_NAME,
    ChainSink,
    JsonlSink,
    OperatorConfig,
    OperatorConfigError,
    write_config,
)

BASE: dict[str, Any] = {
    "keystore": "operator.keystore.json", "password_file": "keystore.password",
    "chain_id": 31337, "challenge_manager": "0x" + "00" * 20,
    "epochs_file": "/abs/kms/epochs.json", "key_epoch": 1, "outbox": "outbox.sqlite",
    "da": {"backend": "local", "local_store": "da", "redis_url": None,
           "redis_prefix": "verinfer:da:", "eigenda_url": None},
    "batch": {"max_entries": 1024, "max_age_s": 5.0},
    "sink": {"kind": "jsonl", "path": "batches.jsonl"},
    "kms_provisioned_locally": True,
}


def _load(tmp_path: Path, **changes: Any) -> OperatorConfig:
    write_config(tmp_path, {**BASE, **changes})
    return OperatorConfig.load(tmp_path)


def test_written_config_loads_typed(tmp_path: Path) -> None:
    cfg = _load(tmp_path)
    assert isinstance(cfg.sink, JsonlSink) and cfg.sink.path == "batches.jsonl"
    assert cfg.key_epoch == 1 and cfg.batch.max_entries == 1024
    assert cfg.rel(cfg.outbox) == tmp_path / "outbox.sqlite"
    assert cfg.rel(cfg.epochs_file) == Path("/abs/kms/epochs.json")
    assert cfg.backpressure.stop_after_s is None  # the runtime's default applies
    chain = _load(tmp_path / "c", sink={"kind": "chain", "rpc_url": "http://127.0.0.1:8545",
                                        "deployment": "/d.json"})
    assert isinstance(chain.sink, ChainSink) and chain.sink.deployment == "/d.json"


@pytest.mark.parametrize(("change", "named"), [
    ({"sink": {"kind": "chain", "rpc_url": "http://x"}}, "sink.chain.deployment"),
    ({"sink": {"kind": "ftp", "path": "x"}}, "sink"),
    ({"batch": {"max_entries": 0}}, "batch.max_entries"),
    ({"da": {"backend": "s3"}}, "da.backend"),
    ({"backpresure": {"stop_after_s": 3}}, "backpresure"),  # misspelt: not silently ignored
    ({"backpressure": {"stop_after_s": -1}}, "backpressure.stop_after_s"),
    ({"key_epoch": "one"}, "key_epoch"),
])
def test_bad_config_names_the_key(tmp_path: Path, change: dict[str, Any], named: str) -> None:
    with pytest.raises(OperatorConfigError, match=f"{CONFIG_NAME}: .*{named}"):
        _load(tmp_path, **change)


def test_missing_key_and_wrong_version_are_refused(tmp_path: Path) -> None:
    raw = {k: v for k, v in BASE.items() if k != "sink"}
    write_config(tmp_path, raw)
    with pytest.raises(OperatorConfigError, match="sink: Field required"):
        OperatorConfig.load(tmp_path)
    (tmp_path / CONFIG_NAME).write_text(json.dumps({**BASE, "version": 2}))
    with pytest.raises(OperatorConfigError, match="version 1"):
        OperatorConfig.load(tmp_path)
    with pytest.raises(OperatorConfigError, match="does not exist"):
        OperatorConfig.load(tmp_path / "nowhere")
