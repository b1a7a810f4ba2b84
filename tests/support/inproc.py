"""An ASGI app under a real uvicorn server on loopback, in this process (a thread), configured
exactly as the services run it (verinfer.httpserve.server_config): tests that need real
sockets and headers but also the app's internals (its engine, its token budget)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn

from verinfer.httpserve import ServeLimits, server_config
from verinfer.ports import free_port


@contextlib.contextmanager
def serving(app: Any, limits: ServeLimits, *, trusted_proxies: Sequence[str] = ()
            ) -> Iterator[tuple[str, int]]:
    """Yields (host, port) while ``app`` serves there; stops the server afterwards."""
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, limits,
                                          trusted_proxies=trusted_proxies))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
