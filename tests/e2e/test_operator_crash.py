"""Crash safety of the publish pipeline: no acknowledged response loses its evidence.

Clients (plain, n=2 and streamed requests on both endpoints) hammer a real `verinfer serve`;
the server is SIGKILLed mid-traffic, twice. After a restart on the same operator directory
and the publisher draining, EVERY response a client fully received must be committed in a
batch: GET /v1/receipts/{id} says committed, its ciphertext is on the local DA and hashes to
the receipt's ciphertextHash, its Merkle proof verifies against the batch root, the batch
manifest on DA holds it, and the jsonl batch sink names each root exactly once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
from openai import OpenAI

from support.servers import Server, launched_server, operator_init
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.pointer import Pointer
from verinfer.receipts.merkle import MerkleProof, verify_proof

CLIENTS = 6
MIN_RESPONSES_BEFORE_KILL = 12
DRAIN_TIMEOUT_S = 90.0


def verifications(kind: str, result: Any) -> list[dict[str, Any]]:
    """Every receipt a response carries (one per choice)."""
    if kind == "stream":
        v = (result[-1].model_extra or {})["verification"]
    else:
        v = (result.model_extra or {})["verification"]
    return list(v.get("choices", [v]))


def client_loop(base: str, seed: int, received: list[dict[str, Any]], lock: threading.Lock
                ) -> None:
    """Sends requests until the server dies; keeps every receipt of a complete response."""
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=30)
    rng = random.Random(seed)
    try:
        while True:
            kind = rng.choice(["chat", "chat_n2", "completion", "stream"])
            prompt = " ".join(rng.choice(["sea", "stone", "wind", "river", "light"])
                              for _ in range(rng.randint(1, 12)))
            msgs: Any = [{"role": "user", "content": prompt}]
            try:
                result: Any
                if kind == "chat":
                    result = client.chat.completions.create(
                        model="tiny", messages=msgs, max_tokens=rng.randint(1, 8),
                        temperature=0.7, seed=rng.randrange(1000))
                elif kind == "chat_n2":
                    result = client.chat.completions.create(
                        model="tiny", messages=msgs, max_tokens=4, temperature=1.0, n=2)
                elif kind == "completion":
                    result = client.completions.create(model="tiny", prompt=prompt,
                                                       max_tokens=rng.randint(1, 8),
                                                       temperature=0)
                else:
                    # A stream counts as received only once its final chunk (with the
                    # verification object) arrived; a torn stream raises or lacks it.
                    result = list(client.chat.completions.create(
                        model="tiny", messages=msgs, max_tokens=6, temperature=0.5, seed=3,
                        stream=True))
                    if not result or "verification" not in (result[-1].model_extra or {}):
                        return
            except (openai.APIConnectionError, openai.APITimeoutError, httpx.HTTPError):
                return  # the server is gone
            with lock:
                received.extend(verifications(kind, result))
    finally:
        client.close()


def traffic_then_kill(server: Server, received: list[dict[str, Any]], seed: int) -> int:
    """Runs clients until at least MIN_RESPONSES_BEFORE_KILL responses arrived, SIGKILLs the
    server while they are still sending; returns how many receipts this round received."""
    lock = threading.Lock()
    mine: list[dict[str, Any]] = []
    threads = [threading.Thread(target=client_loop, args=(server.base, seed * 100 + i, mine,
                                                          lock), daemon=True)
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(mine) < MIN_RESPONSES_BEFORE_KILL and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client hung after the crash"
    assert server.proc.returncode == -signal.SIGKILL
    assert len(mine) >= MIN_RESPONSES_BEFORE_KILL, f"only {len(mine)} responses before 60 s"
    received.extend(mine)
    return len(mine)


def states_at_crash(operator_dir: Path, received: list[dict[str, Any]]) -> Counter[str]:
    """Publication states of the received receipts as the killed process left them."""
    with Outbox(operator_dir / "outbox.sqlite") as ob:
        found = [ob.entry_state(bytes.fromhex(v["receipt_id"][2:])) for v in received]
    return Counter("missing" if f is None else f[0] for f in found)


def wait_committed(base: str, receipt_ids: list[str]) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    states: dict[str, dict[str, Any]] = {}
    pending = list(receipt_ids)
    with httpx.Client(base_url=base, timeout=10) as http:
        while pending and time.monotonic() < deadline:
            still = []
            for rid in pending:
                st = http.get(f"/v1/receipts/{rid}").json()
                states[rid] = st
                if st.get("state") != "committed":
                    still.append(rid)
            pending = still
            if pending:
                time.sleep(0.3)
    not_committed = Counter(states.get(r, {}).get("state", "missing") for r in pending)
    assert not pending, f"{len(pending)} received receipts not committed: {not_committed}"
    return states


def check_committed_evidence(operator_dir: Path, received: list[dict[str, Any]],
                             states: dict[str, dict[str, Any]]) -> None:
    da = LocalDAClient(str(operator_dir / "da"))
    sink_lines = [json.loads(line) for line in
                  (operator_dir / "batches.jsonl").read_text().splitlines()]
    root_counts = Counter(b["batchRoot"] for b in sink_lines)
    assert all(n == 1 for n in root_counts.values()), \
        f"roots committed more than once: {[r for r, n in root_counts.items() if n > 1]}"
    manifests: dict[str, set[str]] = {}
    for v in received:
        rid = v["receipt_id"]
        st = states[rid]
        assert st["state"] == "committed"
        # The operator still names the receipt and pointer the client was given.
        assert st["receipt"] == v["receipt"] and st["signature"] == v["signature"]
        assert st["da_pointer"] == v["da_pointer"]
        blob = da.get(Pointer.parse(v["da_pointer"]))
        assert "0x" + hashlib.sha256(blob).hexdigest() == v["receipt"]["message"][
            "ciphertextHash"]
        b = st["batch"]
        assert b["state"] == "committed"
        proof = MerkleProof(b["proof"]["index"],
                            tuple(bytes.fromhex(s[2:]) for s in b["proof"]["siblings"]),
                            b["proof"]["leaf_count"])
        assert verify_proof(bytes.fromhex(rid[2:]), proof, bytes.fromhex(b["root"][2:])), rid
        assert root_counts[b["root"]] == 1, f"batch {b['root']} is not in the sink"
        if b["manifest_pointer"] not in manifests:
            m = parse_manifest(da.get(Pointer.parse(b["manifest_pointer"])))
            assert "0x" + m.root.hex() == b["root"]
            manifests[b["manifest_pointer"]] = {"0x" + d.hex() for d in m.digests}
        assert rid in manifests[b["manifest_pointer"]]


def test_no_acknowledged_response_is_lost_across_sigkill(tiny_path: Path,
                                                         tmp_path: Path) -> None:
    operator_dir = tmp_path / "operator"
    operator_init(operator_dir)  # batches close after 0.3 s
    log = tmp_path / "server.log"
    received: list[dict[str, Any]] = []
    at_crash: Counter[str] = Counter()
    for crash in range(2):
        with launched_server(tiny_path, "--operator-dir", str(operator_dir), log=log) as server:
            traffic_then_kill(server, received, seed=crash)
        at_crash = states_at_crash(operator_dir, received)
        # Acknowledged means durably enqueued: the killed process already holds every one.
        assert at_crash["missing"] == 0, at_crash
    print(f"{len(received)} receipts received; states after the last crash: {at_crash}")
    # The crashes caught evidence in flight: what follows exercises recovery, not a no-op.
    assert at_crash["committed"] < len(received), at_crash
    ids = [v["receipt_id"] for v in received]
    assert len(set(ids)) == len(ids), "a receipt id was issued twice"
    with launched_server(tiny_path, "--operator-dir", str(operator_dir), log=log) as server:
        states = wait_committed(server.base, ids)
    check_committed_evidence(operator_dir, received, states)
    # Nothing is left half-way either (entries the clients never saw included).
    status = subprocess.run([sys.executable, "-m", "verinfer", "operator", "status",
                             str(operator_dir)], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["entries"]["queued"] == st["entries"]["published"] == \
        st["entries"]["batched"] == 0, st
    assert st["entries"]["committed"] >= len(ids)
