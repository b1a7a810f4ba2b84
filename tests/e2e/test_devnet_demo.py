"""`verinfer devnet demo --model tiny` as a user runs it: one command brings the devnet up, asks
through the openai SDK, verifies the signatures, waits for the batch, challenges one receipt,
gets a dismissal with the bond paid to the committee, and brings everything down, saying what
it does at least every 10 s once it has started talking."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

#: The longest the demo may go without a line once it has printed its first (issue 38: 71 s
#: after "starting 5 KMS shards" with no step shown). Progress ticks every 5 s; in a CI run at
#: load a tick came 11.8 s after the line before it: the bound leaves room for a starved ticker.
MAX_SILENCE_S = 20.0


def run_timed(cmd: list[str], timeout_s: float) -> tuple[int, str, str, list[float]]:
    """Runs ``cmd``; its exit status, stdout, stderr and when each stdout line arrived."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                             env={**os.environ, "COLUMNS": "120"})
        assert p.stdout is not None
        timer = threading.Timer(timeout_s, p.kill)
        timer.start()
        lines, arrivals = [], []
        try:
            for line in p.stdout:
                arrivals.append(time.monotonic())
                lines.append(line.decode(errors="replace"))
            rc = p.wait()
        finally:
            timer.cancel()
        err.seek(0)
        return rc, "".join(lines), err.read().decode(errors="replace"), arrivals


def test_devnet_demo_on_the_tiny_model(tmp_path: Path) -> None:
    rc, stdout, stderr, arrivals = run_timed(
        [sys.executable, "-m", "verinfer", "devnet", "demo", "--model", "tiny", "--dir",
         str(tmp_path), "--max-tokens", "8"], timeout_s=400)
    assert rc == 0, (stdout[-3000:], stderr[-3000:])
    (tmp_path / "demo.out").write_text(stdout)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) <= MAX_SILENCE_S, (max(gaps), stdout[-3000:])
    out = subprocess.CompletedProcess([], rc, stdout, stderr)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["status"] == "dismissed" and res["signers_ok"] and len(res["receipts"]) == 3
    squashed = re.sub(r"[\s│]", "", out.stdout)  # rich folds long values across lines
    assert re.search(r"challenge\d+:[^,]+,\d+/\d+committed,\d+/\d+revealed", squashed)
    for text in ("waitingforthe4verifiers", "`--keep`leavesitrunning",
                 "answer1:completion(greedy)", "answer2:completion(stream,seed11)",
                 "answer3:chat(seed7)",
                 "✓theoperator", "da://local/0x", "verdict:dismissed", "+0.025ETH",
                 *res["receipts"]):
        assert text in squashed, text
    assert not (tmp_path / "devnet" / "devnet.json").exists()  # brought down
    rpc = re.search(r"anvil(http://127\.0\.0\.1:\d+)", squashed)
    assert rpc is not None
    with pytest.raises(httpx.HTTPError):
        httpx.post(rpc.group(1), json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId",
                                       "params": []}, timeout=2)
