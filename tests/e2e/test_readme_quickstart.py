"""README.md's quickstart as a person runs it (issue 38): its block, unchanged, from a fresh
directory, `verinfer devnet up` in a terminal of its own.

Run in tmux, `ssh -t` or `script`, `devnet up` is its terminal's session leader: when it returns
the kernel hangs up the terminal's foreground process group, and every process the devnet
leaves running must be out of that group (before: the 5 KMS shards died of the hang-up and
`devnet status` showed kms-1..5 "no", with no reason). While `up` runs a line arrives at least
every 10 s (before: 71 s without one after "starting 5 KMS shards"; on a pipe, nothing until
the end). Then the rest of the block as written: `devnet status` (every process alive, the
chain head, the operator and the explorer answering), a chat request with curl whose answer
carries its receipt, `devnet down` (no process and no Redis key left)."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import subprocess
import time
from pathlib import Path

import pytest
import redis

from support.cookbook import ROOT, code_blocks
from verinfer.devnet.lifecycle import alive

pytestmark = [pytest.mark.devnet, pytest.mark.process, pytest.mark.anvil, pytest.mark.redis,
              pytest.mark.smollm2, pytest.mark.slow]

README = ROOT / "README.md"
MAX_SILENCE_S = 20.0  # as tests/e2e/test_devnet_demo.py: a 5 s ticker starved at load
ENV = {**os.environ, "COLUMNS": "200"}  # rich folds a table to the pipe's 80 columns


def squash(text: str) -> str:
    """One space for each run of blanks and table rules (rich draws the status table)."""
    return re.sub(r"[\s│┃]+", " ", text)


def quickstart() -> str:
    """README's block that starts with `devnet up`."""
    blocks = [b.code for b in code_blocks(README.read_text())
              if b.lang == "sh" and b.code.startswith(".venv/bin/verinfer devnet up")]
    assert len(blocks) == 1, blocks
    return blocks[0]


def run_as_session_leader(cmd: list[str], cwd: Path, log: Path,
                          timeout_s: float = 600) -> list[float]:
    """Runs ``cmd`` in ``cwd`` as the session leader of a new pseudo-terminal, its output to
    ``log``; returns when each line of it arrived (seconds since the first line)."""
    pid, master = pty.fork()  # the child: setsid(), the pty its controlling terminal
    if pid == 0:
        try:
            os.chdir(cwd)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.execve(cmd[0], cmd, ENV)
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
            pytest.fail(f"{cmd} still running after {timeout_s} s: {log.read_text()[-3000:]}")
    finally:
        os.close(master)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0, log.read_text()[-3000:]
    return [t - arrivals[0] for t in arrivals]


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    up_line, rest = quickstart().split("\n", 1)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # the block runs from a checkout's root
    d = tmp_path / ".devnet"
    log = tmp_path / "up.log"
    state: dict = {}
    try:
        arrivals = run_as_session_leader(["/bin/bash", "-c", up_line], tmp_path, log)
        text = log.read_text()
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert max(gaps) <= MAX_SILENCE_S, (max(gaps), text)
        for step in ("starting anvil", "deploying the contracts", "starting 5 KMS shards",
                     "waiting for the operator", "explorer: http://127.0.0.1:"):
            assert step in text, step
        time.sleep(3)  # the hang-up went out when the leader exited: give it time to act
        state = json.loads((d / "devnet.json").read_text())
        out = subprocess.run(["/bin/bash", "-e", "-o", "pipefail", "-c", rest], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300, env=ENV)
        shown = squash(out.stdout)
        assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
        for name, pid in state["pids"].items():
            assert re.search(rf"{name} {pid} yes", shown), (name, shown)
        assert re.search(rf"chain: {re.escape(state['rpc_url'])} head block \d+", shown)
        assert f"operator: {state['operator_url']} (answers)" in shown
        assert f"explorer: {state['explorer_url']} (answers)" in shown
        answer = json.loads(out.stdout[out.stdout.index("\n{") + 1:out.stdout.rindex("}") + 1])
        assert answer["model"] == "smollm2-135m-instruct" and answer["choices"][0]["message"]
        assert re.fullmatch(r"0x[0-9a-f]{64}", answer["verification"]["receipt_id"])
        assert "devnet down" in out.stderr
    finally:
        if (d / "devnet.json").exists():
            subprocess.run(["/bin/bash", "-c", ".venv/bin/verinfer devnet down"], cwd=tmp_path,
                           capture_output=True, timeout=120)
    assert not any(alive(pid) for pid in state["pids"].values())
    r = redis.Redis.from_url(state["redis_url"])
    assert list(r.scan_iter(match=state["redis_prefix"] + "*")) == []
    assert not (d / "devnet.json").exists()
