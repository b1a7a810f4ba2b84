"""A malicious KMS shard drips its signed log head one byte at a time.

``fetch_head`` bounded the answer's size (16 KiB) but not its time: httpx's timeout is per
read, so a shard that sends a byte every 0.05 s (or every 4.9 s: a day for 16 KiB) held the
head publisher, and with it the publication of every honest shard's head — the record that
makes a shard's release log tamper-evident. Who gains: a shard host that wants a window in
which it can rewrite its log unnoticed. Fix: a whole-answer deadline (``HEAD_DEADLINE_S``);
the dripping shard is reported failed, the others are published.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from verinfer.kms import log_publish
from verinfer.kms.directory import ShardInfo
from verinfer.kms.log_publish import ShardHeadError, fetch_head


class _Drip(BaseHTTPRequestHandler):
    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "16000")
        self.end_headers()
        try:
            for _ in range(16000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass


def test_a_dripping_shard_is_failed_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_publish, "HEAD_DEADLINE_S", 1.0, raising=False)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Drip)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    shard = ShardInfo(0, f"http://127.0.0.1:{srv.server_address[1]}", "0x" + "11" * 20)
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            with httpx.Client(timeout=2.0) as client:
                fetch_head(client, shard)
            out.append(None)
        except BaseException as e:  # handed back to the test
            out.append(e)

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    try:
        assert not t.is_alive(), "fetch_head was still reading the drip after 10 s"
        assert isinstance(out[0], ShardHeadError) and "within" in str(out[0]), out[0]
        assert time.monotonic() - t0 < 5
    finally:
        srv.shutdown()
        srv.server_close()
