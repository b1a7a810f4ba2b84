"""`verinfer devnet up` as real processes (anvil, 5 KMS shards, operator `verinfer serve` with
its publish pipeline, 4 verifier nodes); one real response is challenged through the CLI and
dismissed by the committee; `down` stops everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

VI = [sys.executable, "-m", "verinfer"]


def test_devnet_honest_response_challenge_is_dismissed(tmp_path: Path) -> None:
    d = tmp_path / "devnet"
    up = subprocess.run([*VI, "devnet", "up", "--dir", str(d)], capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        st = json.loads((d / "devnet.json").read_text())
        assert st["operator_url"], "operator did not start"
        r = httpx.post(st["operator_url"] + "/v1/chat/completions", timeout=60, json={
            "model": "verinfer-tiny-llama-seed0", "max_tokens": 8, "seed": 1,
            "messages": [{"role": "user", "content": "hello devnet"}]})
        assert r.status_code == 200, r.text
        rid = r.json()["verification"]["receipt_id"]
        env = {**os.environ, "VERINFER_CHAIN_PRIVATE_KEY": st["accounts"]["challenger_key"]}
        deadline = time.monotonic() + 60
        while True:  # the publisher batches within a few seconds
            out = subprocess.run(
                [*VI, "challenge", rid, "--rpc-url", st["rpc_url"], "--deployment",
                 str(d / "deployment.json"), "--da-store", st["da_store"],
                 "--unsafe-devnet-time-travel", "--json", "--timeout-s", "120"],
                capture_output=True, text=True, env=env, timeout=200)
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            assert "no committed batch" in out.stderr, out.stderr[-2000:]
            time.sleep(2)
        assert out.returncode == 0, out.stderr[-2000:]
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res["status"] == "dismissed" and res["reveals"] == res["members"] == 4
        assert res["majorityOutHash"] == res["receiptOutHash"]
    finally:
        subprocess.run([*VI, "devnet", "down", "--dir", str(d)], timeout=60)
    assert not (d / "devnet.json").exists()
