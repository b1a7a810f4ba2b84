"""Redis backend: ``SET <prefix><sha256 hex> <blob> EX <retention>``.

Keys expire only after the retention period (challenge window plus margin), or never when
``retention_s`` is None. A re-put of the same blob rewrites the same bytes and restarts the
retention clock, which is what a republish after a crash wants. Redis is only as durable as
its configuration: see docs/da.md (appendonly yes, appendfsync always/everysec, noeviction).
"""

from __future__ import annotations

from typing import Any

import redis

from verinfer.da_client.base import DEFAULT_MAX_BLOB_BYTES, DAClient
from verinfer.da_client.errors import (
    BlobNotFoundError,
    CommitmentMismatchError,
    DAUnavailableError,
)
from verinfer.da_client.pointer import Pointer

DEFAULT_PREFIX = "verinfer:da:"
REDIS_MAX_VALUE_BYTES = 512 * 1024 * 1024  # Redis' own string limit (proto-max-bulk-len)


class RedisDAClient(DAClient):
    backend = "redis"

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = DEFAULT_PREFIX,
                 retention_s: int | None = 14 * 24 * 3600,
                 max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
                 socket_timeout_s: float = 5.0, client: Any | None = None) -> None:
        if retention_s is not None and retention_s <= 0:
            raise ValueError(f"retention_s must be positive or None, got {retention_s!r}")
        if not 0 < max_blob_bytes <= REDIS_MAX_VALUE_BYTES:
            raise ValueError(f"max_blob_bytes must be in (0, {REDIS_MAX_VALUE_BYTES}], "
                             f"got {max_blob_bytes!r}")
        self.prefix = prefix
        self.retention_s = retention_s
        self.max_blob_bytes = max_blob_bytes
        self.url = url
        self._r: Any = client if client is not None else redis.Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s)

    def key(self, pointer: Pointer) -> str:
        return self.prefix + pointer.commitment.hex()

    def _put(self, blob: bytes, digest: bytes) -> Pointer:
        pointer = Pointer("redis", digest)
        try:
            if self.retention_s is None:
                self._r.set(self.key(pointer), blob)  # SET clears any TTL: persists
            else:
                self._r.set(self.key(pointer), blob, ex=self.retention_s)
        except redis.RedisError as e:
            raise DAUnavailableError(f"redis put to {self.url} failed: {e}") from e
        return pointer

    def _get(self, pointer: Pointer) -> bytes:
        # At most max_blob_bytes + 1 bytes: whoever can write the key (the operator itself)
        # could store up to Redis' 512 MB under it, and every verifier would pull all of it
        # before the sha256 check refused it. EXISTS tells "absent" from "empty" (GETRANGE
        # answers b"" for both); MULTI makes the two one read.
        key = self.key(pointer)
        try:
            pipe = self._r.pipeline(transaction=True)
            pipe.exists(key)
            pipe.getrange(key, 0, self.max_blob_bytes)
            exists, blob = pipe.execute()
        except redis.RedisError as e:
            raise DAUnavailableError(f"redis get from {self.url} failed: {e}") from e
        if not exists:
            raise BlobNotFoundError(f"no blob {pointer} in redis {self.url} (never stored or "
                                    "expired)", param="pointer")
        if len(blob) > self.max_blob_bytes:
            raise CommitmentMismatchError(
                f"redis {self.url} holds more than {self.max_blob_bytes} bytes under "
                f"{str(pointer)[:80]}: no blob of that pointer can be that long",
                param="pointer")
        return bytes(blob)

    def _exists(self, pointer: Pointer) -> bool:
        try:
            return bool(self._r.exists(self.key(pointer)))
        except redis.RedisError as e:
            raise DAUnavailableError(f"redis exists on {self.url} failed: {e}") from e

    def ttl_s(self, pointer: Pointer) -> int | None:
        """Seconds until the blob expires; None when it never does (or is absent: see exists)."""
        try:
            t = int(self._r.ttl(self.key(pointer)))
        except redis.RedisError as e:
            raise DAUnavailableError(f"redis ttl on {self.url} failed: {e}") from e
        return t if t >= 0 else None

    def extend_retention(self, pointer: Pointer, retention_s: int) -> bool:
        """Keep the blob at least ``retention_s`` more seconds (e.g. while a challenge is open);
        never shortens it. False if the blob is gone."""
        if retention_s <= 0:
            raise ValueError(f"retention_s must be positive, got {retention_s!r}")
        self._check_backend(pointer)
        try:
            if not self._r.exists(self.key(pointer)):
                return False
            self._r.expire(self.key(pointer), retention_s, gt=True)  # no-op if persistent
            return True
        except redis.RedisError as e:
            raise DAUnavailableError(f"redis expire on {self.url} failed: {e}") from e

    def close(self) -> None:
        self._r.close()
