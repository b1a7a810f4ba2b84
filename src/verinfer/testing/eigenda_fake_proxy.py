"""A loopback stand-in for the EigenDA proxy, for tests and the benchmark only.

It is NOT EigenDA: no dispersal, no KZG, nothing leaves the process. It follows the proxy's
documented routes and status codes (``POST /put?commitment_mode=standard`` -> raw commitment,
``GET /get/0x<hex>?commitment_mode=standard`` -> blob, 404 when unknown, 413 over the body
limit, 503 when dispersal fails, ``GET /health``) and can be told to fail puts with 503 or to
corrupt answers, so the client's retry and verification paths run against real HTTP.
Commitments imitate the standard mode's shape (version byte 0x01 + opaque certificate) and are
deliberately not sha256 of the blob.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PROXY_MAX_BODY_BYTES = 32 * 1024 * 1024
#: bodies being received at once, all connections together: past it a put is answered 503
#: unread (16 stalled 32 MiB puts held 512 MB before, docs/budgets.md); one client address may
#: hold at most half of it, so one client cannot refuse every other
PROXY_MAX_IN_PROGRESS_BYTES = 64 * 1024 * 1024
#: seconds a connection may stay silent while the proxy waits for a request line, a header or
#: the next piece of a body; then it is closed
PROXY_IDLE_TIMEOUT_S = 10.0
CERT_VERSION_V2 = b"\x01"


class FakeEigenDAProxy:
    """Start with ``start()`` (binds 127.0.0.1 on a free port), stop with ``stop()``."""

    def __init__(self, *, max_body_bytes: int = PROXY_MAX_BODY_BYTES,
                 max_in_progress_bytes: int = PROXY_MAX_IN_PROGRESS_BYTES,
                 idle_timeout_s: float = PROXY_IDLE_TIMEOUT_S) -> None:
        self.max_body_bytes = max_body_bytes
        self.max_in_progress_bytes = max_in_progress_bytes
        self.idle_timeout_s = idle_timeout_s
        self._in_progress = 0
        self._in_progress_by: dict[str, int] = {}
        self.blobs: dict[bytes, bytes] = {}
        self.fail_next_puts = 0  # answer 503 to this many puts
        self.corrupt_gets = False  # flip a bit in every blob served
        self.lie_on_puts = False  # answer 200 with a certificate, keep nothing (a lying proxy)
        self.puts = 0
        self.gets = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "proxy not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeEigenDAProxy:
        proxy = self

        class Handler(_Handler):
            state = proxy
            timeout = proxy.idle_timeout_s  # socket timeout: request line, headers, body reads

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True, name="fake-eigenda-proxy")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeEigenDAProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _store(self, blob: bytes) -> bytes | None:
        with self._lock:
            self.puts += 1
            if self.fail_next_puts > 0:
                self.fail_next_puts -= 1
                return None
            # an opaque certificate: not derivable from sha256(blob) by the client
            cert = CERT_VERSION_V2 + os.urandom(16) + hashlib.blake2b(blob, digest_size=32).digest()
            if not self.lie_on_puts:
                self.blobs[cert] = blob
            return cert

    def _reserve(self, client: str, n: int) -> bool:
        with self._lock:
            mine = self._in_progress_by.get(client, 0)
            if (self._in_progress + n > self.max_in_progress_bytes
                    or mine + n > self.max_in_progress_bytes // 2):
                return False
            self._in_progress += n
            self._in_progress_by[client] = mine + n
            return True

    def _release(self, client: str, n: int) -> None:
        with self._lock:
            self._in_progress -= n
            left = self._in_progress_by[client] - n
            if left:
                self._in_progress_by[client] = left
            else:
                del self._in_progress_by[client]

    def _load(self, cert: bytes) -> bytes | None:
        with self._lock:
            self.gets += 1
            blob = self.blobs.get(cert)
            if blob is not None and self.corrupt_gets:
                blob = (bytes([blob[0] ^ 1]) + blob[1:]) if blob else b"\x00"
            return blob


class _Handler(BaseHTTPRequestHandler):
    state: FakeEigenDAProxy
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # headers and body go out as separate writes; without NODELAY, Nagle + delayed ACK
        # add ~40 ms to every small answer on loopback
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, body: bytes, ctype: str = "application/octet-stream") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _mode_ok(self, query: str) -> bool:
        if parse_qs(query).get("commitment_mode") == ["standard"]:
            return True
        self._reply(400, b"commitment_mode must be standard", "text/plain")
        return False

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        if parts.path.rstrip("/") != "/put":
            self._reply(404, b"not found", "text/plain")
            return
        declared = self.headers.get("Content-Length")
        # ASCII digits only: int() takes "-1" (and read(-1) reads to the end of the stream,
        # past any limit), "+5", " 5", "1_0"; anything else must be refused unread
        if declared is None:
            self.close_connection = True
            self._reply(411, b"Content-Length required", "text/plain")
            return
        if not (declared.isascii() and declared.isdigit()):
            self.close_connection = True
            self._reply(400, b"malformed Content-Length", "text/plain")
            return
        length = int(declared)
        if length > self.state.max_body_bytes:
            self.close_connection = True  # do not read an oversized body
            self._reply(413, b"request body too large", "text/plain")
            return
        client = str(self.client_address[0])
        if not self.state._reserve(client, length):
            self.close_connection = True  # do not read it: too many bodies arriving at once
            self._reply(503, b"too many request bodies in progress", "text/plain")
            return
        try:
            body = self.rfile.read(length)
        except OSError:  # silent past idle_timeout_s (TimeoutError) or reset: drop it
            self.close_connection = True
            return
        finally:
            self.state._release(client, length)
        if len(body) < length:  # the client closed before sending its whole body
            self.close_connection = True
            return
        if not self._mode_ok(parts.query):
            return
        cert = self.state._store(body)
        if cert is None:
            self._reply(503, b"failed to disperse blob: service unavailable", "text/plain")
            return
        self._reply(200, cert)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/health":
            self._reply(200, b"", "text/plain")
            return
        if not parts.path.startswith("/get/0x"):
            self._reply(404, b"not found", "text/plain")
            return
        if not self._mode_ok(parts.query):
            return
        try:
            cert = bytes.fromhex(parts.path[len("/get/0x"):])
        except ValueError:
            self._reply(400, b"commitment is not hex", "text/plain")
            return
        blob = self.state._load(cert)
        if blob is None:
            self._reply(404, b"blob not found", "text/plain")
            return
        self._reply(200, blob)
