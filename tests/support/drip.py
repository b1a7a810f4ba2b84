"""A slow-loris HTTP peer and a bounded call: what the "drips its answer" adversarial tests share.

A hostile peer (operator, KMS shard, ...) answers 200 with a ``Content-Length`` it honours, one
byte every ``interval`` seconds: every single read succeeds quickly, so a client whose timeout is
per read (httpx's) is held for as long as the peer likes. The fix under test is always a
whole-answer deadline; :func:`outcome_within` runs the client call in a thread and fails the
test when the call is still reading after ``limit_s``, instead of hanging the suite.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _drip_handler(length: int, interval: float) -> type[BaseHTTPRequestHandler]:
    class Drip(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            try:
                for _ in range(length):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(interval)
            except OSError:  # the client gave up: the point of the test
                pass

    return Drip


@contextmanager
def dripping_server(length: int = 16_000, interval: float = 0.05) -> Iterator[str]:
    """A local server whose every GET answer is ``length`` spaces, one per ``interval``
    seconds (the defaults: 800 s for 16 KB); yields its base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _drip_handler(length, interval))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def outcome_within(call: Callable[[], object], limit_s: float = 10.0
                   ) -> tuple[BaseException | None, float]:
    """Runs ``call`` in a daemon thread; returns what it raised (None when it returned) and the
    seconds it took. Fails (AssertionError) when it is still running after ``limit_s``."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as e:  # handed back to the test
            out.append(e)

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    took = time.monotonic() - t0
    assert not t.is_alive(), f"the call was still reading the drip after {limit_s} s"
    return out[0], took
