"""What the client reads from the chain, cached with a TTL, every call bounded.

Reads (through :func:`verinfer.chain.rpc.bounded_web3`: a whole-call deadline and an answer
size cap on every call): the RPC's chain id (once), whether an address is an active staked
operator, the approval history of a model id and of an engine fingerprint (evaluated at each
receipt's issuedAt here, exactly as ``ProtocolConfig.isApprovedAt`` does), a key epoch's
lifetime, and whether a (fingerprint, model) pool is covered. Each answer is kept for
``ttl_s``; a failed read is not cached and raises :class:`ChainReadError`.

Coverage is the one read that depends on the time asked about: it is cached per pool, read at
the issuedAt of the first receipt that asked in each TTL window (the contract fixes coverage
``coverageNotice`` before issuedAt, so it moves slowly; docs/client.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from web3 import Web3

from verinfer.chain.deploy import Deployment
from verinfer.chain.rpc import bounded_web3
from verinfer.chain.structs import Kind, pool_key
from verinfer.client.errors import ClientConfigError
from verinfer.errors import VerinferError

#: At most this many chain answers are kept (then the cache starts afresh).
MAX_CACHED = 4096


class ChainReadError(VerinferError):
    """A chain read failed (deadline, size cap, revert, connection): the answer cannot be
    decided, so the client fails closed."""

    code = "chain_read_failed"


def approved_at(history: list[tuple[int, int]], at: int) -> bool:
    """``ProtocolConfig.isApprovedAt`` over an approval history ``[(since, until)]``: inside an
    interval that began at or before ``at`` and had not ended (until 0: open)."""
    return any(since != 0 and since <= at and (until == 0 or at < until)
               for since, until in history)


class ChainView:
    def __init__(self, rpc_url: str | None = None, deployment: Deployment | None = None, *,
                 w3: Web3 | None = None, ttl_s: float = 30.0, deadline_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if deployment is None or (w3 is None and not rpc_url):
            raise ClientConfigError("a verified client needs the chain: rpc_url and the "
                                    "deployment (contract addresses, chain id)",
                                    param="deployment")
        self.deployment = deployment
        self.w3 = w3 if w3 is not None else bounded_web3(str(rpc_url), deadline_s=deadline_s)
        self.contracts = deployment.bind(self.w3)
        self.ttl_s, self.clock = ttl_s, clock
        self._cache: dict[tuple[Any, ...], tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self.reads = 0  # chain calls made (cache misses): what the bench and tests count

    def _cached(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            value = read()
        except Exception as e:  # web3, requests and the RPC bounds' errors alike
            raise ChainReadError(f"chain read {key[0]} failed: {type(e).__name__}: {e}") from e
        with self._lock:
            self.reads += 1
            if len(self._cache) >= MAX_CACHED:  # keys an operator chooses (its address):
                self._cache.clear()             # bounded, whatever it signs with
            self._cache[key] = (now, value)
        return value

    def check_chain_id(self) -> None:
        """The RPC serves the chain the deployment names (read once: it cannot change)."""
        got = self._cached(("chain_id",), lambda: int(self.w3.eth.chain_id))
        if got != self.deployment.chain_id:
            self._cache.pop(("chain_id",), None)
            raise ClientConfigError(f"the RPC serves chain {got}, the deployment is on chain "
                                    f"{self.deployment.chain_id}", param="rpc_url")

    def is_active_operator(self, address: str) -> bool:
        return bool(self._cached(("operator", address),
                                 lambda: self.contracts.stakes.is_active_operator(address)))

    def is_approved_at(self, kind: Kind, item: bytes, at: int) -> bool:
        history = self._cached(("approval", int(kind), item),
                               lambda: self.contracts.config.approval_history(kind, item))
        return approved_at(history, at)

    def is_key_epoch_live_at(self, epoch: int, at: int) -> bool:
        def read() -> tuple[int, int]:
            e = self.contracts.config.contract.functions.keyEpoch(epoch).call()
            return int(e[4]), int(e[5])  # registeredAt, retiredAt
        registered, retired = self._cached(("key_epoch", epoch), read)
        return registered != 0 and registered <= at and (retired == 0 or at < retired)

    def is_covered_at(self, fingerprint_hash: bytes, model_id: bytes, at: int) -> bool:
        pool = pool_key(fingerprint_hash, model_id)
        return bool(self._cached(("coverage", pool),
                                 lambda: self.contracts.stakes.is_covered_at(pool, at)))
