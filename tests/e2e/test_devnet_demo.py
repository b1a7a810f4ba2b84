"""`verinfer devnet demo --model tiny` as a user runs it: one command brings the devnet up, asks
through the openai SDK, verifies the signatures, waits for the batch, challenges one receipt,
gets a dismissal with the bond paid to the committee, and brings everything down."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest


def test_devnet_demo_on_the_tiny_model(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "verinfer", "devnet", "demo", "--model", "tiny",
                          "--dir", str(tmp_path), "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["status"] == "dismissed" and res["signers_ok"] and len(res["receipts"]) == 3
    squashed = re.sub(r"[\s│]", "", out.stdout)  # rich folds long values across lines
    for text in ("answer1:completion(greedy)", "answer2:completion(stream,seed11)",
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
