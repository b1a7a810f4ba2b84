"""Issue 24.1 on real processes: hostile JSON neither kills a KMS shard nor the enclave runner.

Without the bounded parser, eth-account's raised recursion limit lets the stdlib decoder
overflow the C stack on a 190 KB ``[[[...]]]`` body: the shard died with SIGSEGV (-11) and so
would a runner reading such an answer from a malicious shard."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from adversarial.kms_adversary import EvilShard, make_cluster, runner
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses

BOMB = b"[" * 95_000 + b"]" * 95_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterLayout, object,
                                                                       ShardProcesses]]:
    # shards 1 and 2 are malicious, 3 and 4 honest; t = 2
    lay, member = make_cluster(tmp_path_factory.mktemp("kms-json"), n=4, t=2)
    record = lay.root / "evil.jsonl"
    evil = [EvilShard(lay, 1, "nested-nonce", record),
            EvilShard(lay, 2, "nested-release", record)]
    with ShardProcesses(lay, extra_args=["--rate-capacity", "100"]) as procs:
        procs.start([3, 4])
        try:
            yield lay, member, procs
        finally:
            for e in evil:
                e.stop()


def _url(lay: ClusterLayout, index: int) -> str:
    return {s.index: s.url for s in lay.shards_info()}[index]


def test_bracket_bomb_to_release_is_a_400_and_the_shard_keeps_serving(cluster) -> None:
    lay, _, procs = cluster
    url = _url(lay, 3)
    r = httpx.post(url + "/v1/release", content=BOMB,
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    # refused by the count of its 95,000 arrays (kms.protocol.MAX_REQUEST_CONTAINERS), before
    # the depth scan and the parser
    assert err["reason"] == "bad_request" and "95000 arrays/objects" in err["message"]
    assert procs.procs[3].poll() is None  # alive
    # within the container count, the depth bound still refuses before the parser
    deep = b'{"a":' * 9 + b"1" + b"}" * 9
    r = httpx.post(url + "/v1/release", content=deep, timeout=10)
    assert r.status_code == 400 and "nesting depth 9" in r.json()["error"]["message"]
    assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_oversized_bodies_are_refused_before_parsing(cluster) -> None:
    lay, _, procs = cluster
    url = _url(lay, 3)
    r = httpx.post(url + "/v1/release", content=b"[" * 300_000, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["reason"] == "request_too_large"

    # chunked (no Content-Length): bounded while read
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 10_000

    r = httpx.post(url + "/v1/release", content=chunks(), timeout=10)
    assert r.status_code == 413 and r.json()["error"]["reason"] == "request_too_large"
    # a Content-Length announcing 1 GB is refused without reading anything
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /v1/release HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n"
                  b"Content-Type: application/json\r\n\r\n")
        assert b" 413 " in s.recv(4096).split(b"\r\n", 1)[0] + b" "
    assert procs.procs[3].poll() is None


def test_runner_survives_malicious_shard_answers(cluster) -> None:
    """Shard 1 answers /v1/nonce with the 190 KB bomb, shard 2 answers /v1/release with a 60 KB
    one (30k deep): the runner names both (typed refusals: size bound, depth bound) and rebuilds
    the key from the honest shards 3 and 4."""
    lay, member, _ = cluster
    with runner(lay, member).obtain_key(epoch=1, purpose="full_challenge",
                                        challenge_id="c1") as key:
        assert key.private_key is not None
        assert key.shards_used == [3, 4]
        assert key.refusals[1].startswith("bad_answer") and "exceeds 65536" in key.refusals[1]
        assert key.refusals[2].startswith("bad_release") and "nesting depth" in key.refusals[2]
