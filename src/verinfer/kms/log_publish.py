"""Publishing the KMS shards' signed release-log heads, and checking a log against them.

Why: a signed head (kms/release_log.py) catches a truncated or edited log only if a copy of it
is held by someone other than the shard's host. This module makes that copy public and
durable: a publisher polls each shard's ``GET /v1/log/head``, checks each head's signature
against the shard's address in the directory (shards.json), puts the bundle of heads on the
DA layer and records ``(sha256(bundle), DA pointer)`` on chain in a transaction's calldata.

Why calldata, not a contract: AuditLog's only entry point (``recordAudit``) records receipt
audits by registered verifiers — a head is neither. A zero-value transaction from the
publisher's account to itself costs 21k gas plus calldata, is ordered and timestamped by the
chain, and cannot be withdrawn; its calldata is::

    TAG ("verinfer/kms/log-heads/v1" + 0x00) || sha256(bundle) (32 bytes) || pointer (UTF-8)

The bundle is RFC 8785 JSON ``{"version": 1, "time": t, "heads": [signed head, ...]}``.
The chain and the DA layer add no trust of their own: each head is believed only because its
shard signed it. What they add is that a head, once published, is out of the shard holder's
reach: ``verinfer kms verify-log --published TX`` then fails a log that does not extend it
(``truncated_below_signed_head`` / ``diverges_from_signed_head``).

A shard signs a new head for ``/v1/log/head`` at most every ``--head-interval`` seconds (10;
kms/release_log.py), so a publication may not cover the entries of the last seconds: the next
one does. Polling faster than that gets the same head back, not a new signature.

Who publishes is not a trust question (anyone may run the publisher; governance or the
shard operators do). A shard that does not answer is skipped and named in the result: one
unreachable shard must not stop the others' heads from being published.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import rfc8785
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.rpc import bounded_web3
from verinfer.kms.directory import ShardInfo
from verinfer.kms.errors import KmsError
from verinfer.kms.release_log import ReleaseLogError, SignedHead
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

TAG = b"verinfer/kms/log-heads/v1\x00"
BUNDLE_VERSION = 1
#: A signed head is ~300 bytes; a shard answering more is not answering a head.
MAX_HEAD_BYTES = 16 * 1024
#: Wall time for one shard's head answer. httpx's timeout is per read: a shard dripping one
#: byte every few seconds would hold the publisher (every shard's head unpublished) for a day.
HEAD_DEADLINE_S = 15.0
#: One head per shard; 256 shards is far past any deployment.
MAX_HEADS = 256
MAX_BUNDLE_BYTES = MAX_HEADS * MAX_HEAD_BYTES
MAX_POINTER_BYTES = 4096
#: Bound on an index file of publications (one short line each).
MAX_INDEX_BYTES = 16 * 1024 * 1024


class LogPublicationError(KmsError):
    """A publication (transaction, bundle or index) is not a valid log-head publication.
    ``reason``: not_a_publication, bundle_unavailable, bundle_hash_mismatch,
    bundle_malformed, index_malformed."""

    code = "log_publication_invalid"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class ShardHeadError(KmsError):
    """A shard's ``/v1/log/head`` answer was unreachable, unreadable or not its own head."""

    code = "shard_head_invalid"


class BlobStore(Protocol):
    def put(self, blob: bytes) -> Any: ...


class BlobGetter(Protocol):
    def get(self, pointer: Any) -> bytes: ...


# ---- formats ------------------------------------------------------------------------------
def bundle_bytes(heads: Sequence[SignedHead], time_s: int) -> bytes:
    return rfc8785.dumps({"version": BUNDLE_VERSION, "time": time_s,
                          "heads": [h.to_json() for h in heads]})


def parse_bundle(raw: bytes) -> list[SignedHead]:
    """The heads of a bundle, each signature checked against the address it names."""
    try:
        d = loads_untrusted(raw, max_bytes=MAX_BUNDLE_BYTES, depth=4, what="log-head bundle")
    except UntrustedJsonError as e:
        raise LogPublicationError("bundle_malformed", e.message) from e
    if not isinstance(d, dict) or d.get("version") != BUNDLE_VERSION \
            or not isinstance(d.get("heads"), list) or len(d["heads"]) > MAX_HEADS:
        raise LogPublicationError("bundle_malformed",
                                  f"not a version-{BUNDLE_VERSION} bundle of at most "
                                  f"{MAX_HEADS} heads")
    try:
        heads = [SignedHead.from_json(h) for h in d["heads"]]
        for h in heads:
            h.check_signature()
    except ReleaseLogError as e:
        raise LogPublicationError("bundle_malformed", e.message) from e
    return heads


def calldata(bundle_sha256: bytes, pointer: str) -> bytes:
    p = pointer.encode()
    if len(bundle_sha256) != 32 or not p or len(p) > MAX_POINTER_BYTES:
        raise ValueError("calldata needs a 32-byte hash and a pointer of 1..4096 bytes")
    return TAG + bundle_sha256 + p


def parse_calldata(data: bytes) -> tuple[bytes, str]:
    if not data.startswith(TAG) or len(data) < len(TAG) + 33 \
            or len(data) > len(TAG) + 32 + MAX_POINTER_BYTES:
        raise LogPublicationError("not_a_publication",
                                  "transaction input is not a verinfer log-head publication")
    body = data[len(TAG):]
    try:
        pointer = body[32:].decode()
    except UnicodeDecodeError:
        raise LogPublicationError("not_a_publication", "pointer is not UTF-8") from None
    return body[:32], pointer


@dataclass(frozen=True)
class Publication:
    tx_hash: str
    block: int
    pointer: str
    bundle_sha256: bytes
    heads: list[SignedHead]
    failed: dict[int, str] = field(default_factory=dict)  # shard index -> why (publisher only)

    def index_line(self) -> dict[str, Any]:
        return {"tx": self.tx_hash, "block": self.block, "pointer": self.pointer,
                "bundle_sha256": self.bundle_sha256.hex(),
                "shards": sorted(h.shard_index for h in self.heads)}


# ---- publisher ----------------------------------------------------------------------------
def fetch_head(client: httpx.Client, shard: ShardInfo, *,
               deadline_s: float | None = None) -> SignedHead:
    """The shard's current signed head, checked: its signature is the directory's address
    for that shard index (a shard cannot answer with another shard's head). At most
    ``MAX_HEAD_BYTES``, within ``deadline_s`` (default ``HEAD_DEADLINE_S``)."""
    deadline_s = HEAD_DEADLINE_S if deadline_s is None else deadline_s
    started = time.monotonic()
    try:
        with client.stream("GET", f"{shard.url}/v1/log/head") as r:
            if r.status_code != 200:
                raise ShardHeadError(f"shard {shard.index}: /v1/log/head answered "
                                     f"{r.status_code}")
            raw = b""
            for chunk in r.iter_bytes():
                raw += chunk
                if len(raw) > MAX_HEAD_BYTES:
                    raise ShardHeadError(f"shard {shard.index}: head answer over "
                                         f"{MAX_HEAD_BYTES} bytes")
                if time.monotonic() - started > deadline_s:
                    raise ShardHeadError(f"shard {shard.index}: no whole head within "
                                         f"{deadline_s} s")
    except httpx.HTTPError as e:
        raise ShardHeadError(f"shard {shard.index} unreachable: {type(e).__name__}") from e
    try:
        head = SignedHead.from_json(loads_untrusted(raw, max_bytes=MAX_HEAD_BYTES, depth=4,
                                                    what=f"shard {shard.index} head"))
        head.check_signature(shard.address)
    except (UntrustedJsonError, ReleaseLogError) as e:
        raise ShardHeadError(f"shard {shard.index}: {e.message}") from e
    if head.shard_index != shard.index:
        raise ShardHeadError(f"shard {shard.index} answered a head for shard "
                             f"{head.shard_index}")
    return head


class LogHeadPublisher:
    """Fetch every shard's head, put the bundle on DA, record (hash, pointer) on chain."""

    def __init__(self, shards: Sequence[ShardInfo], da: BlobStore, w3: Web3,
                 account: LocalAccount, *, index_path: Path | None = None,
                 timeout_s: float = 5.0, now: Callable[[], float] = time.time) -> None:
        self.shards, self.da, self.w3, self.account = list(shards), da, w3, account
        self.index_path, self.timeout_s, self.now = index_path, timeout_s, now

    def publish_once(self) -> Publication:
        heads: list[SignedHead] = []
        failed: dict[int, str] = {}
        with httpx.Client(timeout=self.timeout_s) as client:
            for s in self.shards:
                try:
                    heads.append(fetch_head(client, s))
                except ShardHeadError as e:
                    failed[s.index] = e.message
        if not heads:
            raise ShardHeadError(f"no shard answered with a valid head: {failed}")
        bundle = bundle_bytes(heads, int(self.now()))
        digest = hashlib.sha256(bundle).digest()
        pointer = str(self.da.put(bundle))
        tx = {"to": self.account.address, "from": self.account.address, "value": 0,
              "data": calldata(digest, pointer), "chainId": self.w3.eth.chain_id,
              "nonce": self.w3.eth.get_transaction_count(self.account.address, "pending")}
        tx["gas"] = self.w3.eth.estimate_gas(tx)  # type: ignore[arg-type]
        tx.update(_fees(self.w3))
        signed = self.account.sign_transaction(tx)  # type: ignore[arg-type]
        tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60)
        if receipt["status"] != 1:
            raise ShardHeadError(f"publication transaction {tx_hash.hex()} failed")
        pub = Publication(to_hex(bytes(tx_hash)), int(receipt["blockNumber"]), pointer,
                          digest, heads, failed)
        if self.index_path is not None:
            with self.index_path.open("a") as f:
                f.write(json.dumps(pub.index_line()) + "\n")
        return pub

    def run(self, stop: Callable[[], bool], interval_s: float,
            log: Callable[[str], None] = lambda s: None) -> None:
        """Publish every ``interval_s`` until ``stop()``; a failed round is logged and retried
        at the next interval (a publisher outage delays heads, it does not lose the logs)."""
        while not stop():
            try:
                pub = self.publish_once()
                log(f"published {len(pub.heads)} log heads in {pub.tx_hash}"
                    + (f" (failed: {pub.failed})" if pub.failed else ""))
            except Exception as e:  # a round's failure must not end the loop
                log(f"log-head publication failed: {type(e).__name__}: {e}")
            deadline = time.monotonic() + interval_s
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.2, interval_s))


def _fees(w3: Web3) -> dict[str, int]:
    block = w3.eth.get_block("latest")
    base = int(block.get("baseFeePerGas", 0) or 0)
    tip = 10**9
    return {"maxFeePerGas": 2 * base + tip, "maxPriorityFeePerGas": tip}


def start_publisher_thread(publisher: LogHeadPublisher, interval_s: float,
                           log: Callable[[str], None] = lambda s: None
                           ) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=publisher.run, args=(stop.is_set, interval_s, log),
                         name="kms-log-head-publisher", daemon=True)
    t.start()
    return t, stop


# ---- verifier -----------------------------------------------------------------------------
def read_publication(w3: Web3, da: BlobGetter, tx_hash: str,
                     parse_pointer: Callable[[str], Any] = str) -> Publication:
    """The heads a publication transaction names: its calldata, the bundle from DA (hash
    checked), every head's signature checked."""
    try:
        tx = w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
        rcpt = w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
    except Exception as e:  # web3 raises several types for an unknown hash
        raise LogPublicationError("not_a_publication",
                                  f"no mined transaction {tx_hash}: {type(e).__name__}") from e
    if rcpt["status"] != 1:
        raise LogPublicationError("not_a_publication", f"transaction {tx_hash} reverted")
    digest, pointer = parse_calldata(bytes(tx["input"]))
    try:
        raw = da.get(parse_pointer(pointer))
    except Exception as e:  # any backend failure: the bundle is not available
        raise LogPublicationError("bundle_unavailable",
                                  f"{pointer[:100]}: {type(e).__name__}: {e}") from e
    if hashlib.sha256(raw).digest() != digest:
        raise LogPublicationError("bundle_hash_mismatch",
                                  f"the bundle at {pointer[:100]} is not the one published")
    return Publication(tx_hash, int(rcpt["blockNumber"]), pointer, digest, parse_bundle(raw))


def tx_hashes(refs: Iterable[str]) -> list[str]:
    """Each ref is a transaction hash (0x + 64 hex) or an index file the publisher wrote
    (JSON lines with "tx"); returns the transaction hashes in order, without repeats."""
    out: list[str] = []
    for ref in refs:
        if ref.startswith("0x") and len(ref) == 66:
            out.append(ref.lower())
            continue
        path = Path(ref)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise LogPublicationError("index_malformed",
                                      f"{ref!r} is neither a transaction hash nor a readable "
                                      f"index file: {e}") from e
        if len(raw) > MAX_INDEX_BYTES:
            raise LogPublicationError("index_malformed", f"{ref}: over {MAX_INDEX_BYTES} bytes")
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = loads_untrusted(line, max_bytes=MAX_HEAD_BYTES, depth=2,
                                    what=f"{ref}:{n}")
            except UntrustedJsonError as e:
                raise LogPublicationError("index_malformed", e.message) from e
            tx = d.get("tx") if isinstance(d, dict) else None
            if not (isinstance(tx, str) and tx.startswith("0x") and len(tx) == 66):
                raise LogPublicationError("index_malformed", f"{ref}:{n}: no transaction hash")
            out.append(tx.lower())
    return list(dict.fromkeys(out))


def published_heads(w3: Web3, da: BlobGetter, refs: Iterable[str], *, address: str,
                    shard_index: int | None = None,
                    parse_pointer: Callable[[str], Any] = str) -> list[SignedHead]:
    """Every published head signed by the shard identity ``address`` (and for
    ``shard_index`` if given) in the publications ``refs``: the heads its log must extend.
    Selecting by signer, not by the index a head names, means anyone publishing heads under
    their own key for this index changes nothing."""
    heads: list[SignedHead] = []
    for tx in tx_hashes(refs):
        for h in read_publication(w3, da, tx, parse_pointer).heads:
            if h.address == address.lower() and shard_index in (None, h.shard_index):
                heads.append(h)
    return heads


# ---- command-line wiring (kept here so kms/cli.py stays small) ----------------------------
def _da(da_store: str | None, da_redis_url: str | None) -> Any:
    from verinfer.da_client.factory import DAConfig, DARouter, open_client

    cfg = DAConfig(local_store=da_store, redis_url=da_redis_url)
    clients = [open_client(b, cfg) for b, on in (("local", da_store), ("redis", da_redis_url))
               if on is not None]
    if not clients:
        raise LogPublicationError("bundle_unavailable", "no DA store given (--da-store or "
                                  "--da-redis-url)")
    return clients, DARouter(clients)


def published_heads_cli(refs: Sequence[str], address: str, rpc_url: str,
                        da_store: str | None, da_redis_url: str | None) -> list[SignedHead]:
    from verinfer.da_client.pointer import Pointer

    _, router = _da(da_store, da_redis_url)
    return published_heads(bounded_web3(rpc_url), router, refs, address=address,
                           parse_pointer=Pointer.parse)


def publisher_cli(directory: Path, private_key_env: str, rpc_url: str, da_store: str | None,
                  da_redis_url: str | None, index: Path | None, interval_s: float,
                  echo: Callable[[str], None]) -> None:
    import os

    from eth_account import Account

    from verinfer.kms.directory import load_directory

    key = os.environ.get(private_key_env)
    if not key:
        raise LogPublicationError("not_a_publication",
                                  f"environment variable {private_key_env} is not set")
    clients, _ = _da(da_store, da_redis_url)
    pub = LogHeadPublisher(load_directory(directory), clients[0],
                           bounded_web3(rpc_url), Account.from_key(key),
                           index_path=index)
    if interval_s <= 0:
        echo(json.dumps({**pub.publish_once().index_line(), "failed": {}}))
        return
    pub.run(lambda: False, interval_s, echo)
