"""Builds the evidence pipeline and the publisher from an operator config."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verinfer.da_client.base import DAClient
from verinfer.da_client.factory import DAConfig, open_client
from verinfer.da_client.manifest import decode_signed_receipt
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Publisher
from verinfer.da_client.sinks import BatchSink, JsonlBatchSink
from verinfer.engine.engine import Engine
from verinfer.kms.epochs import FileEpochRegistry, require_live
from verinfer.operator.config import OperatorConfig, OperatorConfigError
from verinfer.operator.evidence import EvidencePipeline
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import load_public_key


@dataclass
class OperatorRuntime:
    evidence: EvidencePipeline
    publisher: Publisher
    outbox: Outbox
    da: DAClient

    def close(self, drain_timeout_s: float = 10.0) -> None:
        self.publisher.stop(drain_timeout_s=drain_timeout_s)
        self.outbox.close()


def open_sink(cfg: OperatorConfig) -> BatchSink:
    sink: dict[str, Any] = cfg.raw["sink"]
    kind = sink.get("kind")
    if kind == "jsonl":
        return JsonlBatchSink(cfg.rel(sink["path"]))
    if kind == "chain":
        from verinfer.chain.sink import ChainBatchSink

        return ChainBatchSink.from_config(sink, private_key=cfg.private_key())
    raise OperatorConfigError(f"unknown batch sink kind {kind!r} (jsonl | chain)")


def build_runtime(cfg: OperatorConfig, engine: Engine, *,
                  clock: Callable[[], float] = time.time) -> OperatorRuntime:
    rec = require_live(FileEpochRegistry(cfg.path("epochs_file")), int(cfg.raw["key_epoch"]))
    epoch_key = load_public_key(rec.suite, rec.public_key_bytes)
    da_cfg: dict[str, Any] = dict(cfg.raw["da"])
    backend = da_cfg.pop("backend")
    if da_cfg.get("local_store"):
        da_cfg["local_store"] = str(cfg.rel(da_cfg["local_store"]))
    da = open_client(backend, DAConfig(**da_cfg))
    domain = Domain(int(cfg.raw["chain_id"]), cfg.raw["challenge_manager"])
    # Entries queued by an older version carry no domain: they were signed under this one.
    outbox = Outbox(cfg.path("outbox"), now=clock,
                    receipt_decoder=functools.partial(decode_signed_receipt, legacy_domain=domain))
    evidence = EvidencePipeline(
        engine, ReceiptSigner(cfg.private_key()), domain,
        int(cfg.raw["key_epoch"]), epoch_key, outbox, backend, clock=clock)
    batch = cfg.raw["batch"]
    publisher = Publisher(outbox, da, open_sink(cfg),
                          batch_max_entries=int(batch.get("max_entries", 1024)),
                          batch_max_age_s=float(batch.get("max_age_s", 5.0)))
    return OperatorRuntime(evidence, publisher.start(), outbox, da)
