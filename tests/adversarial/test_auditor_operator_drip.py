"""A cheating operator drips its ``/v1/receipts/{id}`` answer to stall an auditor.

``verinfer reproduce 0x<receipt id> --operator-url URL`` asks the operator for the receipt. The
answer was bounded in size (4 MiB) but not in time: httpx's 30 s timeout is per read, so an
operator sending a byte every few seconds held the auditor — a watcher about to check, and
challenge, that operator's receipt — for days. Who gains: the operator whose receipt is being
audited. Fix: a whole-answer deadline (``verinfer.auditor.sources.OPERATOR_DEADLINE_S``), then a
typed ReceiptRefError naming the URL.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verinfer.auditor import sources
from verinfer.verifier.errors import ReceiptRefError


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


def test_a_dripping_operator_answer_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "OPERATOR_DEADLINE_S", 1.0, raising=False)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Drip)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            sources.resolve_ref("0x" + "11" * 32, domain=None,
                                operator_url=f"http://127.0.0.1:{srv.server_address[1]}")
            out.append(None)
        except BaseException as e:  # handed back to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10)
    try:
        assert not t.is_alive(), "the auditor was still reading the drip after 10 s"
        assert isinstance(out[0], ReceiptRefError) and "within" in str(out[0]), out[0]
        assert time.monotonic() - t0 < 5
    finally:
        srv.shutdown()
        srv.server_close()
