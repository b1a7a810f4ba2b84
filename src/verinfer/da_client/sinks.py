"""Where finished batches go: (root, leaf count, manifest pointer) -> a BatchSink.

The on-chain sink (BatchRegistry) lives in ``verinfer.chain``; the JSONL sink here serves the
CLI and local set-ups (the tests' in-memory sink is ``verinfer.testing.sinks``). Delivery is
at-least-once (a crash between ``commit`` and the outbox recording it repeats the call), so
every sink must treat a root it already holds as success.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from verinfer.da_client.pointer import Pointer
from verinfer.protocol.hexutil import parse_hex, to_hex

log = logging.getLogger("verinfer.da_client")


@dataclass(frozen=True)
class BatchCommitment:
    batch_id: int  # the outbox's local id (not part of what goes on chain)
    root: bytes
    leaf_count: int
    manifest: Pointer

    def to_json(self) -> dict[str, Any]:
        return {"batchId": self.batch_id, "batchRoot": to_hex(self.root),
                "leafCount": self.leaf_count, "manifest": str(self.manifest)}


class BatchSink(Protocol):
    def commit(self, batch: BatchCommitment) -> None:
        """Record the batch durably; idempotent by root. Raise to make the outbox retry."""
        ...


class JsonlBatchSink:
    """Logs each commitment and appends it as one JSON line to a file (fsynced), once per root.

    For the CLI and for crash tests that need the commitments to outlive the process.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._roots = {parse_hex(b["batchRoot"], 32, "batchRoot")
                       for b in read_jsonl_batches(self.path)}
        self._lock = threading.Lock()

    def commit(self, batch: BatchCommitment) -> None:
        with self._lock:
            if batch.root in self._roots:
                return
            line = json.dumps(batch.to_json(), sort_keys=True) + "\n"
            if _ends_torn(self.path):  # a crash mid-append left a partial line: close it off
                line = "\n" + line
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self._roots.add(batch.root)
        log.info("batch %d committed: root 0x%s, %d leaves, manifest %s", batch.batch_id,
                 batch.root.hex(), batch.leaf_count, batch.manifest)


def _ends_torn(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def read_jsonl_batches(path: Path) -> list[dict[str, Any]]:
    """Lines written by JsonlBatchSink; a torn last line (crash mid-write) is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
