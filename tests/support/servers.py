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
    log_start: int = 0  # where this process's output begins in ``log``


#: What uvicorn prints when another process took the port between free_port() and bind.
_PORT_TAKEN = "address already in use"


@contextlib.contextmanager
def launched_server(model: Path, *extra: str, log: Path | None = None,
                    env: dict[str, str] | None = None, unsafe_dev: bool = True
                    ) -> Iterator[Server]:
    """Starts `verinfer serve` on a free port, output appended to ``log`` (a file, so a chatty
    server never blocks on a full pipe); waits for /health; stops it afterwards.
    ``unsafe_dev``: allow the demo operator set-ups tests use (no chain, local KMS).

    free_port() cannot reserve the port: under a parallel suite another process may bind it
    before the server does. A start that fails only for that reason is retried on a new port
    (up to 3 tries); any other exit is an error at once."""
    if log is None:
        log = Path(tempfile.mkstemp(prefix="verinfer-serve-", suffix=".log")[1])
    for attempt in range(3):
        server = _start(model, extra, log, env, unsafe_dev)
        try:
            started = _wait_healthy(server, port_taken_ok=attempt < 2)
            if not started:
                continue
            yield server
            return
        finally:
            if server.proc.poll() is None:
                server.proc.terminate()
                server.proc.wait(timeout=30)


def _start(model: Path, extra: tuple[str, ...], log: Path, env: dict[str, str] | None,
           unsafe_dev: bool) -> Server:
    port = free_port()
    with log.open("ab") as out:
        start = out.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "verinfer", "serve", "--model", str(model), "--port",
             str(port), "--name", "tiny", "--max-context", "512",
             *(["--unsafe-dev"] if unsafe_dev else []), *extra],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    server.log_start = start
    return server


def _wait_healthy(server: Server, *, port_taken_ok: bool) -> bool:
    """True once /health answers 200; False when the server exited because its port was
    taken and a retry is allowed; raises on any other exit or after 120 s."""
    deadline = time.monotonic() + 120
    while True:
        if server.proc.poll() is not None:
            with server.log.open("rb") as f:
                f.seek(server.log_start)
                output = f.read().decode(errors="replace")
            if port_taken_ok and _PORT_TAKEN in output:
                return False
            raise RuntimeError(f"server exited {server.proc.returncode}: {output[-3000:]}")
        try:
            if httpx.get(server.base + "/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("server did not start")
        time.sleep(0.1)


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
