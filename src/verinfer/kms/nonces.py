"""Shard nonces: stateless to issue, single-use once spent, and releases idempotent per request.

Why stateless: issuance is unauthenticated (the enclave asks for nonces before it can prove
anything), so any state kept per issued nonce is a pool a stranger can exhaust — the former
10,000-outstanding cap let one client block every key release. A nonce is instead a MAC'd
token the shard can recognise without remembering it:

    nonce (32 bytes) = u32 expires_at (unix s) || 12 random bytes
                       || HMAC-SHA256(secret, "verinfer/kms/nonce/v1" || u16 shard || first 16)[:16]

``secret`` is drawn at shard start and lives only in memory, so a restart invalidates every
outstanding nonce (harmless: the enclave asks again) and a spent-set lost in the restart cannot
be replayed against. Issuing costs one HMAC and no memory, whoever floods it.

Why single-use is enforced only at spend time: a nonce is *spent* only by a request that passed
authentication and authorization (quote, report_data, requester signature, committee); the
spend binds the nonce to that request's report_data. Before the spend, a refused request leaves
the nonce untouched, so a copy altered by someone who saw the body (a malicious shard, a proxy)
cannot burn the nonce of the genuine request. The spent set therefore only holds entries of
authorized requesters (each behind its token bucket) and forgets them when the nonce expires.

Why releases are idempotent: the same request (same report_data, which binds the epoch,
purpose, challenge, requester, enclave key and every nonce) presented again gets the same
signed, encrypted release back. Only the attested enclave holding the private key bound into
report_data can open it, so handing it out twice reveals nothing; and a faulty shard that
forwards the body to the other shards before the enclave's own copy arrives can no longer make
them answer ``nonce_replayed`` (docs/kms.md, "Release idempotence").
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from verinfer.kms.errors import (
    NonceCapacityError,
    NonceExpiredError,
    NonceReplayedError,
    NonceUnknownError,
)
from verinfer.kms.protocol import NONCE_LEN, Release
from verinfer.kms.sealing import TokenBytes

NONCE_DOMAIN = b"verinfer/kms/nonce/v1"
_EXP_LEN, _RAND_LEN, _MAC_LEN = 4, 12, 16
assert _EXP_LEN + _RAND_LEN + _MAC_LEN == NONCE_LEN


@dataclass(frozen=True)
class NonceGrant:
    nonce: bytes
    expires_at: float


@dataclass(frozen=True)
class Spend:
    """A nonce bound to the one request (report_data) allowed to use it, and what it got."""

    report_data: bytes
    expires_at: float
    release: Release


class NonceBook:
    """Issues and checks MAC'd nonces; remembers only nonces spent by authorized releases.

    ``max_spent`` bounds the spent set; only authorized, rate-limited requesters can add to it
    and every entry leaves when its nonce expires, so reaching it takes a large share of the
    committee acting together (then new spends get ``nonce_capacity``, 503)."""

    def __init__(self, ttl_s: float, now: Callable[[], float], *, shard_index: int = 0,
                 max_spent: int = 100_000,
                 token_bytes: TokenBytes = secrets.token_bytes) -> None:
        if ttl_s <= 0:
            raise ValueError(f"nonce ttl must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._now = now
        self._index = shard_index
        self._max_spent = max_spent
        self._token = token_bytes
        self._secret = token_bytes(32)
        self._spent: dict[bytes, Spend] = {}
        self._expiries: list[tuple[float, bytes]] = []  # min-heap to forget expired spends
        self._lock = threading.Lock()

    # ---- issuance: no state ------------------------------------------------------------
    def issue(self) -> NonceGrant:
        # Floor, so a nonce never lives longer than ttl_s; u32 seconds last until 2106.
        exp = math.floor(self._now() + self.ttl_s)
        head = exp.to_bytes(_EXP_LEN, "big") + self._token(_RAND_LEN)
        return NonceGrant(head + self._mac(head), float(exp))

    def _mac(self, head: bytes) -> bytes:
        msg = NONCE_DOMAIN + self._index.to_bytes(2, "big") + head
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:_MAC_LEN]

    # ---- checks ------------------------------------------------------------------------
    def check(self, nonce: bytes) -> float:
        """Stateless: issued by this shard (since its start) and unexpired. Returns expiry."""
        if len(nonce) != NONCE_LEN or not hmac.compare_digest(
                nonce[-_MAC_LEN:], self._mac(nonce[:-_MAC_LEN])):
            raise NonceUnknownError(f"nonce 0x{nonce.hex()[:16]}… was not issued by this shard "
                                    "(or the shard restarted since)")
        exp = float(int.from_bytes(nonce[:_EXP_LEN], "big"))
        now = self._now()
        if now > exp:
            raise NonceExpiredError(f"nonce 0x{nonce.hex()[:16]}… expired {now - exp:.1f}s ago")
        return exp

    def spent(self, nonce: bytes, report_data: bytes) -> Spend | None:
        """The earlier spend of this nonce by the *same* request, or None if unspent. A spend
        by a different request is a replay: raises ``nonce_replayed``."""
        with self._lock:
            self._prune()
            prior = self._spent.get(nonce)
        if prior is not None and not hmac.compare_digest(prior.report_data, report_data):
            raise NonceReplayedError(
                f"nonce 0x{nonce.hex()[:16]}… was already used by another request")
        return prior

    def spend(self, nonce: bytes, report_data: bytes, release: Release) -> Release:
        """Bind the nonce to this request and its release. If a concurrent copy of the same
        request got there first, its release is returned (one answer per request)."""
        exp = self.check(nonce)
        with self._lock:
            self._prune()
            prior = self._spent.get(nonce)
            if prior is not None:
                if not hmac.compare_digest(prior.report_data, report_data):
                    raise NonceReplayedError(
                        f"nonce 0x{nonce.hex()[:16]}… was already used by another request")
                return prior.release
            if len(self._spent) >= self._max_spent:
                raise NonceCapacityError(
                    f"{len(self._spent)} nonces spent within their validity window; try later")
            self._spent[nonce] = Spend(report_data, exp, release)
            heapq.heappush(self._expiries, (exp, nonce))
            return release

    def _prune(self) -> None:
        now = self._now()
        while self._expiries and self._expiries[0][0] < now:
            _, n = heapq.heappop(self._expiries)
            self._spent.pop(n, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._spent)
