"""Real `verinfer` processes on loopback for tests: the API server and operator set-up."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from verinfer.ports import free_port


@dataclass
class Server:
    proc: subprocess.Popen[bytes]  # the server's own process: SIGKILL reaches it
    base: str
    log: Path


@contextlib.contextmanager
def launched_server(model: Path, *extra: str, log: Path | None = None,
                    env: dict[str, str] | None = None, unsafe_dev: bool = True
                    ) -> Iterator[Server]:
    """Starts `verinfer serve` on a free port, output appended to ``log`` (a file, so a chatty
    server never blocks on a full pipe); waits for /health; stops it afterwards.
    ``unsafe_dev``: allow the demo operator set-ups tests use (no chain, local KMS)."""
    port = free_port()
    if log is None:
        log = Path(tempfile.mkstemp(prefix="verinfer-serve-", suffix=".log")[1])
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verinfer", "serve", "--model", str(model), "--port",
             str(port), "--name", "tiny", "--max-context", "512",
             *(["--unsafe-dev"] if unsafe_dev else []), *extra],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: "
                                   f"{log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(server.base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


@contextlib.contextmanager
def running_server(model: Path, *extra: str, env: dict[str, str] | None = None
                   ) -> Iterator[str]:
    """Starts `verinfer serve` on a free port; yields its base URL; stops it afterwards."""
    with launched_server(model, *extra, env=env) as server:
        yield server.base


def operator_init(directory: Path, *extra: str) -> dict[str, str]:
    """`verinfer operator init` (light KDF, 0.3 s batches); returns its JSON answer."""
    r = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(directory),
                        "--light-kdf", "--batch-max-age-s", "0.3", "--unsafe-dev", *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
