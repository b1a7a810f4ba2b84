"""Serving replicas in stream mode (issue 37): two real `verinfer serve` processes of one
operator publish their receipts to the operator's Redis receipt stream instead of committing
batches themselves (keeping a local copy in their outbox, never published from), and
`verinfer operator commit --once` commits them: every receipt a client
got is in exactly one batch, whose manifest has the root recorded. A replica that cannot reach
Redis stops signing: /health names the stream, and requests get a 503 in OpenAI's error shape
with Retry-After, until Redis is back. Redis here is a throwaway redis-server of the test's
own (it is stopped and restarted)."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from support.servers import launched_server, operator_init
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.sinks import read_jsonl_batches
from verinfer.ports import free_port
from verinfer.protocol.hexutil import parse_hex
from verinfer.receipts.merkle import MerkleProof, verify_proof

pytestmark = [pytest.mark.redis, pytest.mark.process, pytest.mark.loopback]

CHAT = {"model": "tiny", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]}


class RedisProcess:
    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self._up, 10, "redis-server did not start")

    def _up(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def stream_redis() -> Iterator[RedisProcess]:
    r = RedisProcess(free_port())
    r.start()
    yield r
    r.stop()


def _wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _commit_once(op: Path) -> int:
    r = subprocess.run([sys.executable, "-m", "verinfer", "operator", "commit", str(op),
                        "--once", "--name", "c1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout.strip().splitlines()[-1])["receipts_committed"])


def test_two_replicas_publish_one_committer_commits_and_no_redis_stops_signing(
        tiny_path: Path, tmp_path: Path, stream_redis: RedisProcess) -> None:
    op = tmp_path / "op"
    operator_init(op)
    cfg = json.loads((op / "operator.json").read_text())
    # local_copy: each replica also keeps its receipts in its own outbox
    cfg["stream"] = {"redis_url": stream_redis.url, "call_deadline_s": 0.5, "local_copy": True}
    cfg["backpressure"] = {"check_interval_s": 0.2}
    cfg["da"]["local_store"] = str(op / "da")  # the one DA store the replicas read back
    (op / "operator.json").write_text(json.dumps(cfg))
    op2 = tmp_path / "op2"  # replica 2: the same operator.json and keystore, its own outbox
    shutil.copytree(op, op2)
    ids: list[str] = []
    with launched_server(tiny_path, "--operator-dir", str(op)) as s1, \
            launched_server(tiny_path, "--operator-dir", str(op2)) as s2, \
            httpx.Client(timeout=60) as c:
        for i in range(12):
            base = (s1, s2)[i % 2].base
            resp = c.post(base + "/v1/chat/completions",
                          json={**CHAT, "n": 1 + i % 2, "seed": i})
            assert resp.status_code == 200, resp.text
            v = resp.json()["verification"]
            ids += [e["receipt_id"] for e in v.get("choices", [v])]
        assert len(ids) == 18
        # nothing is committed by the replicas themselves: it all waits in the stream
        assert not (op / "batches.jsonl").exists()
        stream = f"verinfer:operator:{{{v['operator'].lower()}}}:receipts"
        assert redis.Redis(port=stream_redis.port).xlen(stream) == 18
        # before its batch: the replica that signed it has its local copy, the other none
        assert c.get(f"{s1.base}/v1/receipts/{ids[0]}").json()["state"] == "queued"
        assert c.get(f"{s2.base}/v1/receipts/{ids[0]}").status_code == 404
        assert _commit_once(op) == 18  # the committer takes all 18, from both replicas
        assert redis.Redis(port=stream_redis.port).xlen(stream) == 0
        # after: any replica answers any replica's receipt from the committer's records
        roots = {b["batchRoot"] for b in read_jsonl_batches(op / "batches.jsonl")}
        for rid, s in ((ids[0], s2), (ids[1], s1)):
            got = c.get(f"{s.base}/v1/receipts/{rid}").json()
            assert (got["receipt_id"], got["state"]) == (rid, "committed"), got
            b = got["batch"]
            assert b["root"] in roots and b["state"] == "committed"
            proof = MerkleProof(b["proof"]["index"], tuple(parse_hex(x, 32, "sibling") for x
                                                           in b["proof"]["siblings"]),
                                b["proof"]["leaf_count"])
            assert verify_proof(parse_hex(rid, 32, "id"), proof, parse_hex(b["root"], 32, "r"))

        stream_redis.stop()  # Redis down: both replicas stop signing
        for s in (s1, s2):
            refused = c.post(s.base + "/v1/chat/completions", json=CHAT)
            assert refused.status_code == 503, refused.text
            err = refused.json()["error"]
            assert err["type"] and err["code"] in ("receipt_stream_unavailable",
                                                   "operator_not_ready"), err
            assert "receipt stream" in err["message"] or "redis" in err["message"]
            assert int(refused.headers["Retry-After"]) >= 1
            _wait(lambda s=s: not c.get(s.base + "/health").json()["ready"], 10,
                  "the replica never reported itself not ready")
            assert "receipt_stream" in c.get(s.base + "/health").json()["not_ready"]
            assert c.get(s.base + "/ready").status_code == 503

        stream_redis.start()  # an empty Redis again (no persistence): signing resumes
        for s in (s1, s2):
            _wait(lambda s=s: c.get(s.base + "/health").json()["ready"], 30, "never resumed")
            after = c.post(s.base + "/v1/chat/completions", json=CHAT)
            assert after.status_code == 200, after.text
            ids.append(after.json()["verification"]["receipt_id"])

    assert _commit_once(op) == 2
    st = subprocess.run([sys.executable, "-m", "verinfer", "operator", "status", str(op)],
                        capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    st2 = json.loads(subprocess.run([sys.executable, "-m", "verinfer", "operator", "status",
                                     str(op2)], capture_output=True, text=True,
                                    timeout=60).stdout)
    # the local copies: each replica's own receipts, never a batch from them (nothing twice)
    assert (status["entries"]["queued"], st2["entries"]["queued"]) == (7, 13)
    assert sum(status["batches"].values()) + sum(st2["batches"].values()) == 0
    rs = status["receipt_stream"]
    assert (rs["entries"], rs["open_batches"], rs["lease_holder"]) == (0, 0, None)
    assert rs["committed_batches"] >= 1 and rs["rejected"] == 0
    seen: collections.Counter[bytes] = collections.Counter()
    da = LocalDAClient(op / "da")
    for b in read_jsonl_batches(op / "batches.jsonl"):
        m = parse_manifest(da.get(Pointer.parse(b["manifest"])))
        assert m.root == parse_hex(b["batchRoot"], 32, "batchRoot")
        m.verify_signatures(m.domain)
        seen.update(m.digests)
    assert sorted(seen) == sorted(parse_hex(i, 32, "id") for i in ids)
    assert max(seen.values()) == 1
