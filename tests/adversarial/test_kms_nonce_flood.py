"""Issue 14.5 on a real shard process: a nonce flood from one client does not stop another
client's key release.

Before: nonces were a shared pool capped at 10,000 outstanding per 30 s; anyone could take them
all (~333 unauthenticated requests/s) and every enclave got ``nonce_capacity`` (503), forcing
verifiers to abstain. Now a nonce is a MAC'd token the shard does not store until an authorized
release spends it, so issuing costs one HMAC and no memory."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from adversarial.kms_adversary import make_cluster, runner
from verinfer.kms.local_cluster import ShardProcesses

# More than the former pool (10,000 outstanding) within one nonce lifetime: enough to have
# blocked every release before. (20,000 through the service in-process:
# tests/unit/test_kms_shard.py::test_nonce_flood_does_not_block_another_release.)
FLOOD = 12_000
TTL_S = 120  # the flood must fit in one nonce lifetime to have exhausted the old pool
CONNECTIONS = 4
BATCH = 500  # pipelined requests per write


def _flood(host: str, port: int, n: int, counts: dict[str, int]) -> None:
    """One attacker connection: HTTP/1.1 pipelining, as cheap for the client as it gets."""
    req = (b"POST /v1/nonce HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    with socket.create_connection((host, port), timeout=60) as s:
        f = s.makefile("rb")
        sent = 0
        while sent < n:
            k = min(BATCH, n - sent)
            s.sendall(req * k)
            sent += k
            for _ in range(k):
                status = f.readline().split(b" ")[1].decode()
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                f.read(length)
                counts[status] = counts.get(status, 0) + 1


def test_nonce_flood_does_not_block_another_clients_release(tmp_path: Path) -> None:
    lay, member = make_cluster(tmp_path / "kms", n=2, t=2)
    with ShardProcesses(lay, extra_args=["--nonce-ttl", str(TTL_S)]) as procs:
        procs.start()
        host, port = lay.shards_info()[0].url.removeprefix("http://").split(":")
        counts: list[dict[str, int]] = [{} for _ in range(CONNECTIONS)]
        t0 = time.monotonic()
        flooders = [threading.Thread(target=_flood, args=(host, int(port),
                                                          FLOOD // CONNECTIONS, c))
                    for c in counts]
        for th in flooders:
            th.start()
        # the victim asks while the flood is running, and again after it
        time.sleep(0.5)
        outcomes, during_ms = [], []
        for _ in range(2):
            t1 = time.monotonic()
            with runner(lay, member).obtain_key(epoch=1, purpose="full_challenge",
                                                challenge_id="c1") as key:
                outcomes.append((key.private_key is not None, key.shards_used))
            during_ms.append((time.monotonic() - t1) * 1000)
            flooding = any(th.is_alive() for th in flooders)
            for th in flooders:
                th.join(timeout=TTL_S)
            if not outcomes[1:]:
                assert flooding, "the flood ended before the victim asked"
        elapsed = time.monotonic() - t0
        total: dict[str, int] = {}
        for c in counts:
            for k, v in c.items():
                total[k] = total.get(k, 0) + v
        assert total == {"200": FLOOD}, total  # every flood request answered, none refused
        assert outcomes == [(True, [1, 2]), (True, [1, 2])]
        assert elapsed < TTL_S
        print(f"{FLOOD} nonce requests in {elapsed:.1f}s; victim key "
              f"{during_ms[0]:.0f} ms during the flood, {during_ms[1]:.0f} ms after")
