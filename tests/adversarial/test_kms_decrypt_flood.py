"""Issue 32.4 on a real shard process: a flood of 16 MiB ``[[],[],…]`` bodies to /v1/decrypt
does not push the shard's nonce answers past the enclave runner's timeout.

Before: the body (size and depth within bounds, value count not bounded) was parsed on the event
loop: from 2 clients the nonce latency went from 4 ms to a 6.9 s median (the runner gives a
shard 5 s) and the shard's RSS to 938 MB. Now a body over a release request's 256 KiB is read
only with admission headers (a registered verifier's signature), its value counts are checked
on the raw bytes before any parser runs, and parsing runs off the event loop. The flood here
comes from a *registered verifier* (admitted: the worst case); a stranger's is refused before
its body is read."""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from pathlib import Path

import httpx

from adversarial.kms_adversary import make_cluster, signed_request
from verinfer.kms.local_cluster import ShardProcesses
from verinfer.kms.protocol import admission_headers

# 16 MiB of one-item lists: within the former /v1/decrypt size bound, depth 2
JUNK = b"[" + b"[]," * ((16 * 1024 * 1024 - 4) // 3) + b"[]]"
FLOOD_S = 6.0
CLIENTS = 2


def _post_raw(host: str, port: int, headers: dict[str, str], body: bytes | None,
              declared: int) -> int:
    """One POST on a fresh connection; the status (0: the connection failed). ``body``
    None: only the head is sent (a client announcing a body it has not sent yet)."""
    head = (f"POST /v1/decrypt HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    try:
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(head)
            if body is not None:
                with contextlib.suppress(OSError):  # answered and closed before the body
                    s.sendall(body)
            return int(s.makefile("rb").readline().split(b" ")[1])
    except (OSError, IndexError, ValueError):
        return 0


def _rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_junk_flood_to_decrypt_keeps_nonces_fast(tmp_path: Path) -> None:
    lay, member = make_cluster(tmp_path / "kms", n=2, t=2)
    with ShardProcesses(lay, extra_args=["--source-rate-capacity", "10000",
                                         "--source-rate-refill", "10000"]) as procs:
        procs.start([1])
        url = lay.shards_info()[0].url
        host, port_s = url.removeprefix("http://").split(":")
        port = int(port_s)
        # a stranger's large body: refused from its head alone (413), nothing read
        t0 = time.monotonic()
        assert _post_raw(host, port, {}, None, len(JUNK)) == 413
        assert time.monotonic() - t0 < 5
        # a registered verifier's admission headers (a genuine signature over a report_data)
        admitted = admission_headers(signed_request(lay, url, 1, member))
        statuses: list[int] = []
        stop = time.monotonic() + FLOOD_S

        def flood() -> None:
            while time.monotonic() < stop:
                statuses.append(_post_raw(host, port, admitted, JUNK, len(JUNK)))

        threads = [threading.Thread(target=flood) for _ in range(CLIENTS)]
        for th in threads:
            th.start()
        latencies = []
        with httpx.Client(timeout=30) as c:
            time.sleep(0.3)
            while any(th.is_alive() for th in threads):
                t1 = time.monotonic()
                assert c.post(url + "/v1/nonce").status_code == 200
                latencies.append(time.monotonic() - t1)
                time.sleep(0.05)
        for th in threads:
            th.join()
        p50 = statistics.median(latencies)
        rss = _rss_peak_mb(procs.procs[1].pid)
        print(f"{len(statuses)} junk bodies ({set(statuses)}); nonce p50 {p50 * 1000:.1f} ms, "
              f"max {max(latencies) * 1000:.0f} ms over {len(latencies)}; shard RSS peak "
              f"{rss:.0f} MB")
        assert statuses and set(statuses) == {400}, statuses  # read, counted, refused
        assert p50 < 1.0, latencies  # the runner's shard timeout is 5 s
        assert rss < 500, rss
        assert procs.procs[1].poll() is None


def test_a_body_that_stops_short_gets_408_and_the_shard_serves_on(tmp_path: Path) -> None:
    """The shard runs the operator's BodyGuard (verinfer.httpserve) with its own limits: a
    client that declares a body and goes silent is answered 408 at the deadline and closed."""
    lay, _ = make_cluster(tmp_path / "kms", n=2, t=2)
    with ShardProcesses(lay, extra_args=["--body-deadline", "1.5"]) as procs:
        procs.start([1])
        url = lay.shards_info()[0].url
        host, port_s = url.removeprefix("http://").split(":")
        t0 = time.monotonic()
        with socket.create_connection((host, int(port_s)), timeout=30) as s:
            s.sendall(b"POST /v1/release HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                      b"Content-Type: application/json\r\n\r\n{\"epoch\": 1")
            status = s.makefile("rb").readline()
        took = time.monotonic() - t0
        assert b" 408 " in status, status
        assert 1.4 < took < 10, took
        assert httpx.post(url + "/v1/nonce", timeout=5).status_code == 200
        text = httpx.get(url + "/metrics", timeout=5).text
        assert 'kms_gate_refusals_total{reason="request_timeout"} 1.0' in text
