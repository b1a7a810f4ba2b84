"""Where an operator's evidence goes, from its operator.json: the DA client receipts'
ciphertexts and batch manifests are put on, and the batch sink roots are committed to. Shared
by ``verinfer operator serve`` (its own publisher) and ``verinfer operator commit`` (the batch
committer of serving replicas); imports neither the engine nor web3 until a chain sink is
opened."""

from __future__ import annotations

from pathlib import Path

from verinfer.da_client.base import DAClient
from verinfer.da_client.factory import DAConfig, open_client
from verinfer.da_client.sinks import BatchSink, JsonlBatchSink
from verinfer.operator.config import JsonlSink, OperatorConfig


def open_da(cfg: OperatorConfig) -> DAClient:
    """The primary DA backend of ``cfg.da``."""
    d = cfg.da
    return open_client(d.backend, DAConfig(
        local_store=str(cfg.rel(d.local_store)) if d.local_store else None,
        redis_url=d.redis_url, redis_prefix=d.redis_prefix,
        redis_retention_s=d.redis_retention_s, eigenda_url=d.eigenda_url))


def open_sink(cfg: OperatorConfig) -> BatchSink:
    """The batch sink of ``cfg.sink``: a JSONL file, or the deployment's BatchRegistry
    committing from the operator's account."""
    if isinstance(cfg.sink, JsonlSink):
        return JsonlBatchSink(cfg.rel(cfg.sink.path))
    from verinfer.chain.sink import ChainBatchSink

    return ChainBatchSink.connect(cfg.sink.rpc_url, Path(cfg.sink.deployment),
                                  private_key=cfg.private_key())


__all__ = ["open_da", "open_sink"]
