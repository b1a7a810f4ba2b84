"""`verinfer devnet up|status|down` on the first mistakes of a new user, through the real CLI
(issue 38): no devnet yet, Redis not started, the operator's port taken, a devnet left
recorded after a reboot; `status` saying why a process stopped and where the chain is; `down`
leaving no Redis streams behind. No devnet is started here: each case stops before anything
would start, or runs on a devnet.json written by the test over real processes (anvil, Redis,
a sleeping process)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from verinfer.chain.anvil import Anvil
from verinfer.ports import free_port

pytestmark = [pytest.mark.process, pytest.mark.loopback, pytest.mark.anvil, pytest.mark.redis]

REDIS_URL = "redis://127.0.0.1:6379/0"


def devnet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verinfer", "devnet", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def squash(text: str) -> str:
    """One space for each run of blanks and table rules (rich draws the status table)."""
    return re.sub(r"[\s│┃]+", " ", text)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.ping()
    yield client
    client.close()


def test_status_and_down_without_a_devnet_say_how_to_start_one(tmp_path: Path) -> None:
    out = devnet("status", "--dir", str(tmp_path))
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = squash(out.stderr)
    assert f"no devnet in {tmp_path}" in err and "verinfer devnet up --dir" in err
    assert "Traceback" not in out.stderr
    out = devnet("down", "--dir", str(tmp_path))
    assert out.returncode == 0 and "nothing to stop" in squash(out.stderr)


def test_up_without_redis_names_scripts_ensure_redis_and_starts_nothing(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = devnet("up", "--dir", str(tmp_path), "--redis-url",
                 f"redis://127.0.0.1:{free_port()}/0")
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    assert "does not answer" in out.stderr and "scripts/ensure-redis" in squash(out.stderr)
    assert not (tmp_path / "devnet.json").exists() and not (tmp_path / "logs").exists()
    assert time.monotonic() - t0 < 60  # said at once, not after anvil and a deployment
    # its first line comes before the heavy libraries load (issue 38: the demo said nothing
    # for 21 s)
    assert "loading the devnet's libraries" in out.stderr.splitlines()[0]


def test_the_devnet_cli_loads_without_the_heavy_libraries() -> None:
    """`verinfer devnet …` imports torch, web3 and the engine inside a command, after its
    first line (before: 9-21 s of imports under load before `up` or `demo` printed anything);
    `devnet challenge` and `mine-draws` still get their arguments."""
    probe = subprocess.run([sys.executable, "-c", (
        "import sys, verinfer.devnet.cli; print(sorted(m for m in ('torch', 'web3', 'openai', "
        "'verinfer.engine.engine', 'verinfer.devnet.lifecycle') if m in sys.modules))")],
        capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and probe.stdout.strip() == "[]", (probe.stdout, probe.stderr)
    out = devnet("challenge", "--help")
    assert out.returncode == 0 and "Usage: verinfer devnet challenge" in out.stdout
    assert "--da-store" in out.stdout and "--no-wait" in out.stdout
    out = devnet("challenge")
    assert out.returncode == 2 and "Missing argument" in out.stderr


def test_up_with_the_operator_port_taken_says_so(tmp_path: Path, r: redis.Redis) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = devnet("up", "--dir", str(tmp_path), "--operator-port", str(port))
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    assert f"port {port} on 127.0.0.1 is taken" in squash(out.stderr)
    assert not (tmp_path / "devnet.json").exists()


def test_up_over_a_devnet_whose_processes_are_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "devnet.json").write_text(json.dumps({"pids": {"anvil": gone.pid}}))
    out = devnet("up", "--dir", str(tmp_path))
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    err = squash(out.stderr)
    assert "processes are gone" in err and f"verinfer devnet down --dir {tmp_path}" in err


def test_status_names_why_a_process_stopped_and_the_chain_head(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    with (logs / "kms-1.log").open("wb") as f:  # a shard that could not bind its port
        crashed = subprocess.Popen([sys.executable, "-c",
                                    "import sys; print('starting shard 1'); "
                                    "print('OSError: [Errno 98] address already in use'); "
                                    "sys.exit(1)"], stdout=f, stderr=f)
        crashed.wait()
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        with Anvil() as anvil:
            (tmp_path / "devnet.json").write_text(json.dumps({
                "pids": {"verifier-0": sleeper.pid, "kms-1": crashed.pid},
                "logs": {"kms-1": str(logs / "kms-1.log")},
                "rpc_url": anvil.url, "operator_url": None,
                "explorer_url": f"http://127.0.0.1:{free_port()}"}))
            out = devnet("status", "--dir", str(tmp_path))
            text = squash(out.stdout)
            assert out.returncode == 1, (out.stdout, out.stderr[-2000:])  # a process is down
            assert "address already in use" in text
            assert f"chain: {anvil.url} head block 0" in text
            assert "explorer: http://127.0.0.1:" in text and "(not answering)" in text
            assert re.search(rf"verifier-0 {sleeper.pid} yes", text), text
        out = devnet("status", "--dir", str(tmp_path))  # the chain gone too
        assert out.returncode == 1 and "head not answering" in squash(out.stdout)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_stops_its_processes_and_deletes_its_redis_keys(tmp_path: Path,
                                                            r: redis.Redis) -> None:
    prefix = f"verinfer-devnet-{uuid.uuid4().hex[:8]}:"
    other = f"verinfer-test-{uuid.uuid4().hex[:8]}:keep"
    r.xadd(prefix + "audit:jobs", {"job": "1"})
    r.xgroup_create(prefix + "audit:jobs", "workers", id="0")
    r.xadd(prefix + "audit:reports", {"report": "1"})
    r.set(other, "1")
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        (tmp_path / "devnet.json").write_text(json.dumps({
            "pids": {"verifier-0": sleeper.pid}, "redis_url": REDIS_URL,
            "redis_prefix": prefix}))
        out = devnet("down", "--dir", str(tmp_path))
        assert out.returncode == 0, (out.stdout, out.stderr[-2000:])
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
        assert list(r.scan_iter(match=prefix + "*")) == []
        assert r.get(other) == "1"  # nothing outside its prefix
        assert f"removed 2 Redis keys under {prefix}" in squash(out.stderr)
        assert not (tmp_path / "devnet.json").exists()
    finally:
        r.delete(other)
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_app_key_is_the_epoch_key_an_auditor_needs(tmp_path: Path) -> None:
    """`verinfer devnet app-key` (issue 38: only a test helper knew how to get `APP_KEY` for
    docs/cookbook.md): rebuilt from t of the devnet's key shares, its public key is the
    epoch's."""
    from verinfer.attestation.quotes import measurement
    from verinfer.auditor.material import load_app_key
    from verinfer.kms.epochs import FileEpochRegistry
    from verinfer.kms.local_cluster import provision
    from verinfer.receipts.epoch_keys import EnvelopeSuite

    kms = tmp_path / "kms"
    provision(kms, epoch=1, threshold=3, shares=5,
              measurements=[measurement("devnet", "code", "fp")],
              suite=EnvelopeSuite.P256.value, unsafe_single_tree=True)
    (tmp_path / "devnet.json").write_text(json.dumps({"pids": {}, "kms": {"root": str(kms)}}))
    out = devnet("app-key", "--dir", str(tmp_path), "--out", str(tmp_path / "app-key.json"))
    assert out.returncode == 0, (out.stdout, out.stderr[-2000:])
    key = load_app_key(tmp_path / "app-key.json")
    rec = FileEpochRegistry(kms / "epochs.json").get(1)
    assert key.key_epoch == 1
    assert key.key.public_key().to_bytes() == rec.public_key_bytes
    assert (tmp_path / "app-key.json").stat().st_mode & 0o777 == 0o600
    out = devnet("app-key", "--dir", str(tmp_path / "none"))
    assert out.returncode == 2 and "verinfer devnet up" in squash(out.stderr)
