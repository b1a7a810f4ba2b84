"""Issue 14.7: while DA is down the operator must stop signing before its oldest unpublished
receipt can reach the publication deadline (else every receipt issued in the outage is
claimable as withheld), and resume by itself. Real server process, real Redis DA stopped
and restarted on its port."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from support.servers import launched_server, operator_init
from verinfer.ports import free_port

CHAT = {"model": "tiny", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]}


class RedisProcess:
    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port).ping()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_da() -> Iterator[RedisProcess]:
    r = RedisProcess(free_port())
    r.start()
    yield r
    r.stop()


def _wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_da_outage_stops_signing_before_the_deadline_then_resumes(
        tiny_path: Path, tmp_path: Path, redis_da: RedisProcess) -> None:
    op = tmp_path / "op"
    operator_init(op, "--da", "redis", "--redis-url", f"redis://127.0.0.1:{redis_da.port}/0")
    cfg = json.loads((op / "operator.json").read_text())
    # deadline 20 s, stop at 3 s of backlog: the margin is what the publisher needs afterwards
    cfg["backpressure"] = {"publication_deadline_s": 20, "stop_after_s": 3,
                           "check_interval_s": 0.2}
    (op / "operator.json").write_text(json.dumps(cfg))
    with launched_server(tiny_path, "--operator-dir", str(op)) as server, \
            httpx.Client(base_url=server.base, timeout=60) as c:
        def post() -> httpx.Response:
            return c.post("/v1/chat/completions", json=CHAT)

        assert post().status_code == 200
        redis_da.stop()  # DA down
        during = post()
        assert during.status_code == 200  # within the margin: still signed, queued durably
        t_down = time.monotonic()
        _wait(lambda: not c.get("/health").json()["ready"], 15, "never stopped signing")
        stopped_after = time.monotonic() - t_down
        health = c.get("/health").json()
        assert "publication_backlog" in health["not_ready"], health
        assert "DAUnavailableError" in health["not_ready"]["publication_backlog"]
        refused = post()
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "operator_not_ready"
        assert int(refused.headers["Retry-After"]) >= 1
        assert c.get("/ready").status_code == 503
        metrics = c.get("/metrics").text
        assert "verinfer_ready 0.0" in metrics
        assert "verinfer_refused_not_ready_total 1.0" in metrics
        # the oldest receipt was still far from its 20 s deadline when signing stopped
        assert stopped_after < 20 - 3, stopped_after

        redis_da.start()  # DA back: the publisher drains, the server resumes by itself
        _wait(lambda: c.get("/health").json()["ready"], 30, "never resumed")
        after = post()
        assert after.status_code == 200, after.text
        rid = during.json()["verification"]["receipt_id"]
        _wait(lambda: c.get(f"/v1/receipts/{rid}").json()["state"] == "committed", 30,
              "receipt signed during the outage was never published")
