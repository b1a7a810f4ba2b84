"""`verinfer devnet up` as a person runs it in tmux, `ssh -t` or `script` (issue 38): the
command is its terminal's session leader, so when it returns the kernel hangs up the terminal's
foreground process group. Every process the devnet leaves running must be out of that group
(before: the 5 KMS shards died of the SIGHUP and `devnet status` showed kms-1..5 "no", with no
reason). Then `devnet status` shows every process alive, the chain head, the operator and the
explorer, and `devnet down` leaves no process and no Redis key behind. While `up` runs, a line
arrives at least every 10 s (before: 71 s without one after "starting 5 KMS shards")."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from verinfer.devnet.lifecycle import alive

pytestmark = [pytest.mark.devnet, pytest.mark.process, pytest.mark.anvil, pytest.mark.redis,
              pytest.mark.slow]

MAX_SILENCE_S = 10.0


def squash(text: str) -> str:
    return re.sub(r"[\s│┃]+", " ", text)


def devnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verinfer", "devnet", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def up_as_session_leader(directory: Path, log: Path, timeout_s: float = 600) -> list[float]:
    """Runs `verinfer devnet up` as the session leader of a new pseudo-terminal, its output to
    ``log``; returns when each line of it arrived (seconds since the first line)."""
    pid, master = pty.fork()  # the child: setsid(), the pty its controlling terminal
    if pid == 0:
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.execv(sys.executable, [sys.executable, "-m", "verinfer", "devnet", "up",
                                      "--dir", str(directory)])
        finally:
            os._exit(127)
    arrivals: list[float] = []
    seen = 0
    deadline = time.monotonic() + timeout_s
    status = None
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            lines = log.read_bytes().count(b"\n") if log.exists() else 0
            arrivals += [time.monotonic()] * (lines - seen)
            seen = lines
            if done:
                break
            time.sleep(0.25)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"devnet up still running after {timeout_s} s: {log.read_text()[-3000:]}")
    finally:
        os.close(master)  # the terminal goes: the hang-up (already sent when the leader exited)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0, log.read_text()[-3000:]
    return [t - arrivals[0] for t in arrivals]


def test_devnet_up_outlives_its_terminal_and_says_what_it_does(tmp_path: Path) -> None:
    d = tmp_path / "net"
    log = tmp_path / "up.log"
    try:
        arrivals = up_as_session_leader(d, log)
        text = log.read_text()
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert max(gaps) <= MAX_SILENCE_S, (max(gaps), text)
        for step in ("starting anvil", "deploying the contracts", "starting 5 KMS shards",
                     "waiting for the operator", "explorer: http://127.0.0.1:"):
            assert step in text, step
        time.sleep(3)  # the hang-up was delivered when the leader exited; give it time to act
        state = json.loads((d / "devnet.json").read_text())
        out = devnet("status", "--dir", str(d))
        status = squash(out.stdout)
        assert out.returncode == 0, (out.stdout, out.stderr[-2000:])
        for name, pid in state["pids"].items():
            assert re.search(rf"{name} {pid} yes", status), (name, status)
        assert re.search(rf"chain: {re.escape(state['rpc_url'])} head block \d+", status)
        assert f"operator: {state['operator_url']} (answers)" in status
        assert f"explorer: {state['explorer_url']} (answers)" in status
    finally:
        if (d / "devnet.json").exists():
            state = json.loads((d / "devnet.json").read_text())
            down = devnet("down", "--dir", str(d))
            assert down.returncode == 0, down.stderr[-2000:]
    assert not any(alive(pid) for pid in state["pids"].values())
    r = redis.Redis.from_url(state["redis_url"])
    assert list(r.scan_iter(match=state["redis_prefix"] + "*")) == []
    assert not (d / "devnet.json").exists()
