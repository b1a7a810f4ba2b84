"""Build DA clients from configuration, and route pointers to the right backend."""

from __future__ import annotations

from dataclasses import dataclass

from verinfer.da_client.base import DAClient
from verinfer.da_client.errors import BackendMismatchError
from verinfer.da_client.pointer import Pointer


@dataclass(frozen=True)
class DAConfig:
    """Where each backend lives; a backend left as None is not configured."""

    local_store: str | None = None
    redis_url: str | None = None
    redis_prefix: str = "verinfer:da:"
    redis_retention_s: int | None = 14 * 24 * 3600
    eigenda_url: str | None = None


def open_client(backend: str, config: DAConfig) -> DAClient:
    if backend == "local" and config.local_store is not None:
        from verinfer.da_client.local import LocalDAClient

        return LocalDAClient(config.local_store)
    if backend == "redis" and config.redis_url is not None:
        from verinfer.da_client.redis_backend import RedisDAClient

        return RedisDAClient(config.redis_url, prefix=config.redis_prefix,
                             retention_s=config.redis_retention_s)
    if backend == "eigenda" and config.eigenda_url is not None:
        from verinfer.da_client.eigenda import EigenDAProxyClient

        return EigenDAProxyClient(config.eigenda_url)
    raise BackendMismatchError(f"DA backend {backend!r} is not configured (local store, redis "
                               "url or eigenda proxy url missing)", param="backend")


class DARouter:
    """get/exists for pointers of any configured backend (verifiers read every backend)."""

    def __init__(self, clients: list[DAClient]) -> None:
        self.clients = {c.backend: c for c in clients}

    def client_for(self, pointer: Pointer) -> DAClient:
        try:
            return self.clients[pointer.backend]
        except KeyError:
            raise BackendMismatchError(
                f"no client configured for backend {pointer.backend!r} of {str(pointer)[:100]}",
                param="pointer") from None

    def get(self, pointer: Pointer) -> bytes:
        return self.client_for(pointer).get(pointer)

    def exists(self, pointer: Pointer) -> bool:
        return self.client_for(pointer).exists(pointer)

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
