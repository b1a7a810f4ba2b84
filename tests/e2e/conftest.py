"""Fixtures that run a real `verinfer serve` process on loopback."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(model: Path, *extra: str, env: dict[str, str] | None = None
                   ) -> Iterator[str]:
    """Starts `verinfer serve` on a free port; yields its base URL; stops it afterwards."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "verinfer", "serve", "--model", str(model), "--port",
         str(port), "--name", "tiny", "--max-context", "512", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"server exited: {out}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Iterator[str]:
    with running_server(tiny_path) as base:
        yield base
