"""Follows the chain into the index: from the last indexed block to the head, one
``eth_getLogs`` over all five contracts per chunk of blocks, each log decoded by its topic and
folded in; then the manifests of newly committed batches are read from DA.

Pages never touch the chain: this is the only reader of it, so a page costs the same with ten
receipts or ten thousand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from web3 import Web3
from web3.types import FilterParams

from verinfer.chain.deploy import Deployment
from verinfer.da_client.errors import (
    BlobNotFoundError,
    CommitmentMismatchError,
    MalformedPointerError,
    ManifestError,
)
from verinfer.da_client.factory import DARouter
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.errors import VerinferError
from verinfer.explorer.index import EventMeta, Index
from verinfer.httpserve import redact_url
from verinfer.protocol.hexutil import parse_hex_lenient
from verinfer.receipts.eip712 import Domain

log = logging.getLogger("verinfer.explorer")

#: Blocks per eth_getLogs call: bounded so a long chain is read in steps pages can interleave.
CHUNK_BLOCKS = 2000
#: A manifest DA could not serve is asked for again after this many seconds.
MANIFEST_RETRY_S = 5.0


class ChainFollower:
    def __init__(self, index: Index, w3: Web3, deployment: Deployment,
                 da: DARouter | None, *, chunk_blocks: int = CHUNK_BLOCKS) -> None:
        self.index, self.w3, self.d, self.da = index, w3, deployment, da
        self.domain = Domain(deployment.chain_id, deployment.challenge_manager)
        self.chunk_blocks = chunk_blocks
        self._events: dict[bytes, Any] = {}  # topic0 -> the contract event that decodes it
        self._addresses: list[Any] = []
        c = deployment.bind(w3)
        for bound in (c.config, c.stakes, c.batches, c.challenges, c.audits):
            self._addresses.append(bound.address)
            abi: list[dict[str, Any]] = list(bound.contract.abi)  # type: ignore[arg-type]
            for entry in abi:
                if entry.get("type") == "event":
                    ev = bound.contract.events[str(entry["name"])]()
                    self._events[_topic_bytes(ev.topic)] = ev
        self._retry_at: dict[bytes, float] = {}
        if index.indexed_block < 0:
            index.indexed_block = deployment.deployed_block - 1

    # ---- one pass ----------------------------------------------------------------------------
    def step(self) -> int:
        """Reads up to ``chunk_blocks`` new blocks; returns the number of logs folded in."""
        head = self.w3.eth.get_block("latest")
        head_n, head_t = int(head["number"]), int(head["timestamp"])
        with self.index.lock:
            if head_n != self.index.head_block:
                self.index.head_block, self.index.head_time = head_n, head_t
                self.index.touch()
            start = self.index.indexed_block + 1
        n = 0
        if start <= head_n:
            end = min(head_n, start + self.chunk_blocks - 1)
            query: FilterParams = {"fromBlock": start, "toBlock": end,
                                   "address": self._addresses}
            logs = self.w3.eth.get_logs(query)
            times = self._block_times({int(lg["blockNumber"]) for lg in logs})
            decoded = [self._decode(lg, times) for lg in logs]
            with self.index.lock:
                for item in decoded:
                    if item is not None:
                        self.index.apply(*item)
                        n += 1
                self.index.indexed_block = end
                self.index.touch()
        self._read_manifests()
        return n

    def _decode(self, lg: Any, times: dict[int, int]) -> tuple[str, Any, EventMeta] | None:
        topics = lg.get("topics") or []
        ev = self._events.get(bytes(topics[0])) if topics else None
        if ev is None:
            return None
        try:
            out = ev.process_log(lg)
        except Exception as e:  # a log this ABI cannot decode is skipped
            log.warning("undecodable %s log in block %s: %s", ev.event_name,
                        lg.get("blockNumber"), e)
            return None
        block = int(lg["blockNumber"])
        meta = EventMeta(block, times.get(block, 0), bytes(lg["transactionHash"]),
                         int(lg["logIndex"]))
        return str(out["event"]), dict(out["args"]), meta

    def _block_times(self, blocks: set[int]) -> dict[int, int]:
        return {b: int(self.w3.eth.get_block(b)["timestamp"]) for b in sorted(blocks)}

    def _read_manifests(self) -> None:
        with self.index.lock:
            now = time.monotonic()
            todo = [(b.batch_id, b.da_pointer) for b in self.index.batches.values()
                    if b.manifest in ("pending", "unavailable")
                    and self._retry_at.get(b.batch_id, 0.0) <= now]
        for batch_id, pointer in todo:
            state, error, manifest = self._fetch_manifest(pointer)
            with self.index.lock:
                if manifest is not None:
                    self.index.add_manifest(batch_id, manifest)
                else:
                    self.index.manifest_failed(batch_id, state, error)
                    self._retry_at[batch_id] = time.monotonic() + MANIFEST_RETRY_S

    def _fetch_manifest(self, pointer: str) -> tuple[str, str, Any]:
        """('ok', '', manifest), ('unavailable', why, None) (asked again later) or ('invalid',
        why, None). Whatever an operator published, this returns: a hostile manifest is a
        label on its batch page, never a failing page or a dead follower."""
        if self.da is None:
            return "unavailable", "no DA backend configured (--da-store / --da-redis-url)", None
        try:
            p = Pointer.parse(pointer)
        except MalformedPointerError as e:
            return "invalid", f"manifest pointer: {e.message}", None
        try:
            data = self.da.get(p)
        except BlobNotFoundError as e:
            return "unavailable", e.message, None
        except CommitmentMismatchError as e:
            return "invalid", e.message, None
        except VerinferError as e:
            return "unavailable", e.message, None
        try:
            return "ok", "", parse_manifest(data, self.domain)
        except ManifestError as e:
            return "invalid", e.message, None
        except Exception as e:  # hostile bytes must not stop the follower
            log.warning("manifest %s: %s", pointer[:100], e)
            return "invalid", f"{type(e).__name__}: {e}", None

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, stop: threading.Event, poll_s: float = 0.5,
            on_error: Callable[[Exception], None] | None = None) -> None:
        while not stop.is_set():
            try:
                caught_up = self.step() == 0
                error = ""
            except Exception as e:  # RPC down: keep serving what is indexed
                # shown to every visitor: never the RPC URL's credentials (requests spells the
                # URL's path and query in its errors: a hosted RPC's API key)
                error = redact_url(f"{type(e).__name__}: {e}",
                                   str(getattr(self.w3.provider, "endpoint_uri", "") or ""))[:300]
                if on_error is not None:
                    on_error(e)
                caught_up = True
            with self.index.lock:
                if error != self.index.follower_error:
                    self.index.follower_error = error  # shown in every page's footer
                    self.index.touch()
            with self.index.lock:
                behind = self.index.indexed_block < self.index.head_block
            if caught_up and not behind:
                stop.wait(poll_s)


def _topic_bytes(topic: Any) -> bytes:
    if isinstance(topic, bytes | bytearray):
        return bytes(topic)
    return parse_hex_lenient(str(topic), 32, "log topic")  # web3 spells it with or without 0x
