"""Real `verinfer` processes on loopback for tests: the API server and operator set-up."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


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


def operator_init(directory: Path, *extra: str) -> dict[str, str]:
    """`verinfer operator init` (light KDF, 0.3 s batches); returns its JSON answer."""
    r = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(directory),
                        "--light-kdf", "--batch-max-age-s", "0.3", *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
