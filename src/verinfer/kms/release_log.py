"""Append-only release log: JSON Lines with a hash chain, and signed heads.

Each line is an RFC 8785 JSON object with ``seq`` (from 0), ``prev`` (hash of the previous
line's entry, 64 zero hex digits for the first) and ``hash`` = sha256 of the canonical entry
without ``hash``. Entries describe decisions only — never share material, keys or plaintext.

Why heads are signed: an unkeyed chain proves nothing to anyone but the file's holder — dropping
the tail, or editing a middle entry and re-hashing every later one, leaves a valid chain. So the
shard signs *heads* with its identity key (kms/identity.py) and publishes them:

    head = {"shard_index", "address", "count" (entries covered), "head" (hash of entry
            count-1, or 64 zeros), "time"}; signature = EIP-191 over
            sha256("verinfer/kms/log-head/v1" || RFC8785(head))

written to ``<log>.heads.jsonl`` (append-only, fsync'd) at start, every ``checkpoint_every``
entries, at shutdown, and when ``GET /v1/log/head`` finds the log advanced and the last head
is at least ``head_interval_s`` old (else the last head is answered: a client polling after
each request cannot make the shard sign and fsync a head per request). A head that
has left the shard (fetched over HTTP, copied off the host) is a commitment the shard cannot
take back: a log that does not extend it — fewer entries (``truncated_below_signed_head``) or
another hash at that position (``diverges_from_signed_head``) — fails verification. A shard
refuses to start from a log that does not extend its own last signed head.

What this cannot do: whoever holds the identity key *and* edits the log and the heads file
together before any head left the host is not caught by the host's own files; heads held by
others (auditors polling ``/v1/log/head``) are what catch that.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785
from eth_account.signers.local import LocalAccount

from verinfer.kms.errors import KmsError
from verinfer.kms.identity import recover_eip191_signer, sign_eip191
from verinfer.protocol.hexutil import parse_hex, to_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

GENESIS = "0" * 64
FORBIDDEN_FIELDS = frozenset({"share", "encrypted_share", "secret", "seed", "plaintext"})
HEAD_DOMAIN = b"verinfer/kms/log-head/v1"
#: A log line is a flat object of short fields; a longer or deeper line is not ours.
MAX_LINE_BYTES = 16 * 1024
MAX_LINE_DEPTH = 4
#: Least time between two heads signed for ``GET /v1/log/head`` (checkpoints every N entries,
#: at start and at shutdown are not held back by it).
HEAD_INTERVAL_S = 10.0


class ReleaseLogError(KmsError):
    """The log or its heads do not verify. ``reason`` names the failure (docs/kms.md):
    not_json, chain_broken, entry_hash_mismatch, head_malformed, head_signature_invalid,
    head_wrong_shard, truncated_below_signed_head, diverges_from_signed_head."""

    code = "release_log_corrupt"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def _entry_hash(entry: Mapping[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def heads_path(log_path: Path) -> Path:
    """``release-log.jsonl`` -> ``release-log.heads.jsonl`` (same directory)."""
    return log_path.with_name(log_path.stem + ".heads.jsonl")


@dataclass(frozen=True)
class SignedHead:
    shard_index: int
    address: str
    count: int
    head: str
    time: int
    signature: bytes

    def unsigned_json(self) -> dict[str, Any]:
        return {"shard_index": self.shard_index, "address": self.address,
                "count": self.count, "head": self.head, "time": self.time}

    def digest(self) -> bytes:
        return hashlib.sha256(HEAD_DOMAIN + rfc8785.dumps(self.unsigned_json())).digest()

    def to_json(self) -> dict[str, Any]:
        return {**self.unsigned_json(), "signature": to_hex(self.signature)}

    @classmethod
    def sign(cls, account: LocalAccount, *, shard_index: int, count: int, head: str,
             time_s: int) -> SignedHead:
        unsigned = cls(shard_index, account.address.lower(), count, head, time_s, b"")
        return cls(shard_index, unsigned.address, count, head, time_s,
                   sign_eip191(account, unsigned.digest()))

    @classmethod
    def from_json(cls, d: Any) -> SignedHead:
        def bad(why: str) -> ReleaseLogError:
            return ReleaseLogError("head_malformed", why)

        if not isinstance(d, Mapping):
            raise bad("a signed head must be a JSON object")
        ints: dict[str, int] = {}
        for k in ("shard_index", "count", "time"):
            v = d.get(k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(f"{k} must be a non-negative int, got {v!r:.40}")
            ints[k] = v
        address, head, sig = d.get("address"), d.get("head"), d.get("signature")
        if not (isinstance(address, str) and len(address) == 42 and address.startswith("0x")):
            raise bad(f"address must be 0x + 40 hex digits, got {address!r:.60}")
        if not (isinstance(head, str) and len(head) == 64
                and all(c in "0123456789abcdef" for c in head)):
            raise bad(f"head must be 64 lower-case hex digits, got {head!r:.80}")
        if not (isinstance(sig, str) and sig.startswith("0x") and len(sig) == 132):
            raise bad("signature must be 0x + 65 bytes hex")
        try:
            sig_b = parse_hex(sig, 65, "signature")
        except ValueError:
            raise bad("signature is not hex") from None
        return cls(ints["shard_index"], address.lower(), ints["count"], head, ints["time"],
                   sig_b)

    def check_signature(self, expected_address: str | None = None) -> None:
        try:
            signer = recover_eip191_signer(self.digest(), self.signature)
        except ValueError as e:
            raise ReleaseLogError("head_signature_invalid", str(e)) from e
        if signer != self.address:
            raise ReleaseLogError("head_signature_invalid",
                                  f"head at count {self.count} is signed by {signer}, "
                                  f"not by the {self.address} it names")
        if expected_address is not None and signer != expected_address.lower():
            raise ReleaseLogError("head_wrong_shard",
                                  f"head at count {self.count} is signed by {signer}, "
                                  f"expected {expected_address.lower()}")


def read_heads(path: Path) -> list[SignedHead]:
    """Signed heads of a heads file (missing file: none)."""
    if not path.exists():
        return []
    out = []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                d = loads_untrusted(line, max_bytes=MAX_LINE_BYTES, depth=MAX_LINE_DEPTH,
                                    what=f"{path}:{lineno}")
            except UntrustedJsonError as e:
                raise ReleaseLogError("head_malformed", e.message) from e
            out.append(SignedHead.from_json(d))
    return out


def verify_release_log(path: Path, *, heads: Iterable[SignedHead] = (),
                       address: str | None = None) -> tuple[int, str]:
    """Check the whole chain and that it extends every signed head in ``heads`` (signatures
    checked; ``address`` pins the signer). Returns (entry count, last hash)."""
    heads = list(heads)
    for h in heads:
        h.check_signature(address)
    if len({h.address for h in heads}) > 1:
        raise ReleaseLogError("head_wrong_shard",
                              f"heads signed by several keys: {sorted({h.address for h in heads})}")
    wanted = {h.count for h in heads if h.count > 0}
    at: dict[int, str] = {0: GENESIS}  # count -> hash of entry count-1
    prev, seq = GENESIS, 0
    if path.exists():
        with path.open("rb") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    entry = loads_untrusted(line, max_bytes=MAX_LINE_BYTES,
                                            depth=MAX_LINE_DEPTH, what=f"{path}:{lineno}")
                except UntrustedJsonError as e:
                    raise ReleaseLogError("not_json", e.message) from e
                if not isinstance(entry, dict):
                    raise ReleaseLogError("not_json", f"{path}:{lineno}: not a JSON object")
                if entry.get("seq") != seq or entry.get("prev") != prev:
                    raise ReleaseLogError("chain_broken",
                                          f"{path}:{lineno}: seq/prev do not continue the chain")
                if entry.get("hash") != _entry_hash(entry):
                    raise ReleaseLogError("entry_hash_mismatch",
                                          f"{path}:{lineno}: entry hash mismatch")
                prev, seq = entry["hash"], seq + 1
                if seq in wanted:
                    at[seq] = prev
    for h in sorted(heads, key=lambda h: h.count):
        if h.count > seq:
            raise ReleaseLogError(
                "truncated_below_signed_head",
                f"{path} has {seq} entries; a head signed at time {h.time} covers {h.count}")
        if at[h.count] != h.head:
            raise ReleaseLogError(
                "diverges_from_signed_head",
                f"{path}: entry {h.count - 1} hashes to {at[h.count][:16]}…, the head signed "
                f"at time {h.time} says {h.head[:16]}… (an entry at or before it was changed)")
    return seq, prev


class ReleaseLog:
    """Verifies the chain against its own signed heads on open (refusing to continue a log
    that does not extend them), then appends with fsync and signs heads."""

    def __init__(self, path: Path, *, signer: LocalAccount, shard_index: int,
                 checkpoint_every: int = 100, now: Callable[[], float] = time.time,
                 head_interval_s: float = HEAD_INTERVAL_S) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        if head_interval_s < 0:
            raise ValueError(f"head_interval_s must be >= 0, got {head_interval_s}")
        self._head_interval_s = head_interval_s
        self._head_signed_at = float("-inf")
        self.path = Path(path)
        self.heads_path = heads_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._signer = signer
        self._index = shard_index
        self._every = checkpoint_every
        self._now = now
        self._lock = threading.Lock()
        heads = read_heads(self.heads_path)
        self._seq, self._prev = verify_release_log(self.path, heads=heads,
                                                   address=signer.address)
        self._latest: SignedHead | None = None
        self.checkpoint()  # at start: records the restart and the head it continues from

    def append(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        bad = FORBIDDEN_FIELDS & set(fields)
        if bad:
            raise ReleaseLogError("forbidden_field",
                                  f"refusing to log secret-bearing fields {sorted(bad)}")
        with self._lock:
            entry: dict[str, Any] = {**fields, "seq": self._seq, "prev": self._prev}
            entry["hash"] = _entry_hash(entry)
            _append_line(self.path, rfc8785.dumps(entry) + b"\n")
            self._seq, self._prev = self._seq + 1, entry["hash"]
            if self._seq % self._every == 0:
                self._checkpoint_locked()
            return entry

    def checkpoint(self) -> SignedHead:
        with self._lock:
            return self._checkpoint_locked()

    def latest_head(self) -> SignedHead:
        """The signed head of the log: a new checkpoint if the log advanced and the last head
        is ``head_interval_s`` old or more, else the last head (which may lag the log by what
        was logged within the interval)."""
        with self._lock:
            if self._latest is None or (
                    self._latest.count != self._seq
                    and self._now() - self._head_signed_at >= self._head_interval_s):
                return self._checkpoint_locked()
            return self._latest

    def _checkpoint_locked(self) -> SignedHead:
        head = SignedHead.sign(self._signer, shard_index=self._index, count=self._seq,
                               head=self._prev, time_s=int(self._now()))
        _append_line(self.heads_path, rfc8785.dumps(head.to_json()) + b"\n")
        self._latest, self._head_signed_at = head, self._now()
        return head


def _append_line(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
